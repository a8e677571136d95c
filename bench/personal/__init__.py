"""The paper's personal-agent track through the training proxy: ``python -m bench.personal --json``.

Simulated users (:mod:`~bench.personal.users`: a student and a teacher, rule-written) talk to
the model only through ``train.proxy``'s OpenAI endpoint, on problems the project generates
(:mod:`~bench.personal.problems`); their replies are the next states the proxy trains on, read
by a rule judge and hint source (:mod:`~bench.personal.judge`). The runner is ``__main__``.
"""
