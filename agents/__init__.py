"""Policies, their prompts and what an episode records (the loop that plays them is
:mod:`train.rollout`, above the judges).

* :mod:`agents.policy` -- ``Generation``, ``Policy``; :func:`make_policy` (here);
  backends :mod:`agents.openai_policy` and :mod:`agents.hf_policy`; the model presets
  (:mod:`agents.presets`): the download-free ``tiny`` model in :mod:`agents.tiny`, the
  SmolLM2-135M-Instruct checkpoint in :mod:`agents.smollm2`.
* :mod:`agents.chat` -- system prompts, message building, context truncation.
* :mod:`agents.trajectory` -- ``Step``, ``Trajectory``; :mod:`agents.recorder` -- JSONL log.
* :mod:`agents.testing` -- test doubles standing in for models and model servers.
"""

from typing import Any

from nextstate.agents.policy import Generation, Policy, PolicyError
from nextstate.agents.trajectory import Step, Trajectory

def make_policy(spec: str, **kw: Any) -> Policy:
    """A policy from a string.

    ``http(s)://...`` -> an :class:`~agents.openai_policy.OpenAIPolicy` on that server
    (``model=`` in ``kw``, else the server's first model); anything else -> an
    :class:`~agents.hf_policy.HFPolicy` on that preset (:mod:`agents.presets`: ``"tiny"``,
    ``"smollm2"``, ...), local path or hub name.
    """
    if spec.startswith(("http://", "https://")):
        from nextstate.agents.openai_policy import OpenAIPolicy
        return OpenAIPolicy(spec, **kw)
    from nextstate.agents.hf_policy import HFPolicy
    return HFPolicy(spec, **kw)


__all__ = ["Generation", "Policy", "PolicyError", "make_policy", "Step", "Trajectory"]
