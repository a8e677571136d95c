"""Train any agent: an OpenAI-compatible endpoint that serves the policy and learns from the next request.

``python -m train.proxy --model tiny --output runs/proxy`` serves ``POST /v1/chat/completions``
(plain and ``stream: true`` server-sent events, token by token; OpenAI tools and tool calls) and
``GET /v1/models`` from a local model (:class:`agents.hf_policy.HFPolicy`). An unmodified agent
pointed at it becomes a source of training data:

* **Sessions** (:mod:`train.sessions`): OpenClaw's ``X-Session-Id`` / ``X-Turn-Type: main|side`` /
  ``X-Session-Done`` headers or the same keys in the body (``session_id``, ``turn_type``,
  ``session_done``); without them, the session a request continues by longest-prefix match, and
  the turn type ``main``. Side turns are served, never trained on.
* **Exact tokens.** The proxy is the serving engine: each main-line turn keeps the prompt ids the
  model read, and the response ids and log-probs it sampled. A turn whose answer came back changed
  is ``rewritten`` and not trained on.
* **Next state.** The new messages of the session's next main-line request (tool results, the
  user's reply) are the previous turn's next state. They go to the judge in the background: by rule
  (:func:`judges.rules.text_state`: an error or a non-zero exit -1, success +1, else 0), an LLM
  (the policy itself, or a URL), or none. A session's last turn has no next state: it gets the
  outcome the client reports with ``POST /v1/sessions/{id}/outcome``, else no vote.
* **Training**: the reward of a turn is its vote (the majority of ``m``), or the outcome for a
  last turn; with ``--wait-outcome`` every turn waits for its session's outcome and gets
  ``outcome + vote``. ``--mode rl`` (binary RL): the advantage is the reward, and turns with 0
  are dropped; ``opd``: only turns the hint source hinted train, with the teacher's token-level
  advantages in the turn's prompt plus the hint (:mod:`judges.hints`, scored by
  :meth:`train.learner.Learner.score_teacher`); ``combine``: both. Every ``--batch`` such turns,
  one PPO step runs in a background thread (generation goes on with the old weights); the new
  weights are copied into the serving model once the rows generating are done (none joins
  meanwhile), and requests that arrive meanwhile wait in the batcher's queue (none is refused).
* **Concurrency**: two requests on one named session at once make two branches (trajectories);
  a streaming client that disconnects cancels its generation, and its turn is recorded aborted.
* **Records**: ``rollouts.jsonl`` (one episode per session, the env loop's schema, so
  ``python -m viewer DIR`` shows them), ``advantages.jsonl``, ``metrics.jsonl``,
  ``curves.png``, ``checkpoints/``. Every response carries ``X-Policy-Version`` (and
  ``system_fingerprint: v<version>``): the weights that produced it.
* **Safety**: binds 127.0.0.1 unless told otherwise; ``--api-key`` enforces a bearer key; bodies
  and ``max_tokens`` are bounded; a malformed request gets a 400 with a one-line reason; Ctrl-C
  saves a checkpoint and exits 130.

The serving and training parts only need a policy with ``stream``/``generate``, a ``lock`` and a
``version`` (:class:`agents.hf_policy.HFPolicy`) and a learner with ``step``/``publish``; a
veRL-backed policy can take their place later.

One module an idea:

* :mod:`~train.proxy.wire` -- the OpenAI wire format: requests parsed and checked, tool calls,
  assistant messages, finish reasons, usage, answer bodies and server-sent events;
* :mod:`~train.proxy.trainer` -- :class:`ProxyTrainer`, PPO steps in a background thread;
* :mod:`~train.proxy.service` -- :class:`TrainingProxy`: sessions, judging, credit;
* :mod:`~train.proxy.group` -- group sampling (``--samples N``): rankers, the quality-gate
  reward, the choice, group-normalized advantages;
* :mod:`~train.proxy.rubric` -- the evolving judge rubric (``--rubric``): preference sources,
  versions, the bound on change, pin and reset;
* :mod:`~train.proxy.registry` -- the name tables of rankers and preference sources;
* :mod:`~train.proxy.app` -- the FastAPI app, the bearer key, streamed answers, uvicorn
  (:func:`serving`, :func:`serve`);
* ``__main__`` -- the command line (its config, judge and hint source).
"""

from nextstate.train.proxy.app import make_app, server_config, serve, serving
from nextstate.train.proxy.service import TrainingProxy, next_state_text
from nextstate.train.proxy.trainer import ProxyTrainer
from nextstate.train.proxy.wire import (BadRequest, ChatRequest, assistant_message, finish_reason, parse_request,
                                        split_tool_calls, usage)

__all__ = ["BadRequest", "ChatRequest", "ProxyTrainer", "TrainingProxy", "assistant_message", "finish_reason",
           "make_app", "next_state_text", "parse_request", "serve", "server_config", "serving", "split_tool_calls",
           "usage"]
