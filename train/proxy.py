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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import re
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from nextstate.agents.policy import Generation, content_text
from nextstate.agents.recorder import Recorder
from nextstate.judges.hints import teacher_messages
from nextstate.judges.prm import TEMPLATES, JudgeRequest, JudgeResult, StepJudge
from nextstate.judges.rules import RuleHints, RuleJudge, text_state
from nextstate.train import checkpoint
from nextstate.train.batch import Batch, Sample, rl_weight
from nextstate.train.config import Config, ConfigError, _apply, parse_overrides
from nextstate.train.sessions import Session, SessionTable, Turn, message_keys

log = logging.getLogger(__name__)

MODES = ("rl", "opd", "combine")
ROLES = {"system", "developer", "user", "assistant", "tool"}
TRUE = {"1", "true", "yes", "on"}
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class BadRequest(ValueError):
    """A request the proxy refuses (the message is the one-line reason; ``status`` the HTTP code)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# -- requests ---------------------------------------------------------------------------------
@dataclass
class ChatRequest:
    """A validated ``/v1/chat/completions`` body, with the session keys taken out."""

    messages: list[dict]
    tools: list[dict] | None
    sampling: dict[str, Any]
    stream: bool
    include_usage: bool
    session_id: str | None
    turn_type: str
    session_done: bool

    @functools.cached_property
    def keys(self) -> tuple[tuple, ...]:
        """The messages' session-matching keys (:func:`train.sessions.message_keys`), computed once."""
        return message_keys(self.messages)


def _check_message(i: int, m: Any) -> dict:
    if not isinstance(m, dict):
        raise BadRequest(f"messages[{i}] must be an object")
    role = m.get("role")
    if role not in ROLES:
        raise BadRequest(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}, got {role!r}")
    content = m.get("content")
    if content is None and not (role == "assistant" and m.get("tool_calls")):
        raise BadRequest(f"messages[{i}].content is missing")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") in ("text", "image_url") for p in content):
            raise BadRequest(f"messages[{i}].content parts must be text or image_url objects")
    elif content is not None and not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise BadRequest(f"messages[{i}].tool_calls must be a list on an assistant message")
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"messages[{i}].tool_calls entries need function.name")
    out = {k: v for k, v in m.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")}
    if role == "developer":   # chat templates know "system"
        out["role"] = "system"
    return out


def parse_request(raw: bytes, headers: dict[str, str], max_tokens_limit: int) -> ChatRequest:
    """Validate a chat completion body; raises :class:`BadRequest` with a one-line reason."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"the body is not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    messages = [_check_message(i, m) for i, m in enumerate(messages)]
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
                isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str) for t in tools):
            raise BadRequest("tools must be a list of {type: function, function: {name, parameters}}")
        tools = tools or None
    n = body.get("n", 1)
    if n not in (1, None):
        raise BadRequest("n must be 1 (one answer per request)")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = max_tokens_limit
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= max_tokens_limit:
        raise BadRequest(f"max_tokens must be an integer from 1 to {max_tokens_limit}, got {max_tokens!r}")
    temperature = body.get("temperature", 1.0)
    top_p = body.get("top_p", 1.0)
    for name, value, lo, hi in (("temperature", temperature, 0.0, 2.0), ("top_p", top_p, 1e-9, 1.0)):
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not lo <= value <= hi):
            raise BadRequest(f"{name} must be a number from {lo:g} to {hi:g}, got {value!r}")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (
            isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s for s in stop))):
        raise BadRequest("stop must be a string or a list of up to 4 strings")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest("seed must be an integer")
    sampling = {"max_tokens": max_tokens, "temperature": 1.0 if temperature is None else float(temperature),
                "top_p": 1.0 if top_p is None else float(top_p), "stop": stop, "seed": seed}
    turn_type = str(headers.get("x-turn-type") or body.get("turn_type") or "main").strip().lower()
    if turn_type not in ("main", "side"):
        raise BadRequest(f"turn type must be main or side, got {turn_type!r}")
    sid = headers.get("x-session-id") or body.get("session_id")
    if sid is not None and (not isinstance(sid, str) or not 0 < len(sid) <= 200):
        raise BadRequest("the session id must be a string of 1 to 200 characters")
    done = str(headers.get("x-session-done") or body.get("session_done") or "").strip().lower() in TRUE
    options = body.get("stream_options") or {}
    return ChatRequest(messages, tools, sampling, bool(body.get("stream")),
                       bool(isinstance(options, dict) and options.get("include_usage")), sid, turn_type, done)


# -- answers ----------------------------------------------------------------------------------
def split_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """``(content, tool_calls)`` of an answer written with ``<tool_call>{...}</tool_call>``
    blocks, in the OpenAI format; a block that is not a JSON ``{"name", "arguments"}`` object stays text."""
    calls, kept, pos = [], [], 0
    for m in _TOOL_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1).strip())
        except ValueError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
        kept.append(text[pos:m.start()])
        pos = m.end()
    if not calls:
        return text, []
    content = ("".join(kept) + text[pos:]).strip()
    return content or None, calls


def assistant_message(text: str, tools: list[dict] | None) -> dict:
    """The assistant message of an answer (tool calls parsed out when the request had tools)."""
    content, calls = split_tool_calls(text) if tools else (text, [])
    return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


def finish_reason(gen: Generation, reply: dict) -> str:
    return "tool_calls" if reply.get("tool_calls") else ("length" if gen.finish_reason == "length" else "stop")


def usage(gen: Generation) -> dict[str, int]:
    p, c = len(gen.prompt_ids), len(gen.response_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def next_state_text(messages: list[dict]) -> str:
    """The new messages after an answer, as text for the judge (tool results and replies)."""
    return "\n\n".join(content_text(m.get("content")) for m in messages)


# -- the learner side -------------------------------------------------------------------------
class ProxyTrainer:
    """Turns judged turns into PPO steps in a background thread. A turn's reward is its vote
    (binary RL), plus its session's outcome when the proxy waits for outcomes; its advantage
    is ``w_rl`` times that (:func:`train.batch.rl_weight`: 1 in mode ``rl``, 0 in ``opd``),
    and a hinted turn (``opd``/``combine``) also carries its teacher context, which the
    learner scores (:meth:`train.learner.Learner.score_teacher`).

    Serving comes first: generation goes on with the old weights during a step, and on Linux the
    learner thread (and the torch threads it starts) runs ``nice`` steps below the server, so a
    step that shares the CPU with generation takes the cycles generation leaves (0: same priority)."""

    def __init__(self, policy: Any, cfg: Config, output: Path, batch: int, save_every: int, nice: int = 10):
        from nextstate.train.learner import Learner
        from nextstate.train.metrics import MetricsLog

        self.policy, self.cfg, self.output, self.batch, self.save_every = policy, cfg, output, batch, save_every
        self.nice = nice
        self.learner = Learner(policy, cfg)
        self.temperature = self.learner.temperature
        self.w_rl = rl_weight(cfg.opd)
        self.weight_opd = cfg.opd.weight_opd if cfg.opd.mode != "rl" else 0.0
        self.metrics = MetricsLog(output)
        self.advantages = Recorder(output / "advantages.jsonl")
        self.ready: list[tuple[Session, Turn, float, float, list[int] | None]] = []
        self.steps = 0
        self.saved = 0
        self.busy = threading.Event()
        self.closing = False
        # ready and busy: offered on the event loop, taken on the learner thread; reentrant, as a step
        # that ended before its done callback was added runs that callback here, lock held
        self._lock = threading.RLock()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="proxy-learner",
                                           initializer=self._lower_priority)
        self.counts = {"judged": 0, "zero": 0, "untrainable": 0, "hinted": 0}
        self.swaps: list[tuple[float, float]] = []   # (start, end) of each weight swap, time.monotonic()
        self.updates: list[tuple[float, float]] = []   # (start, end) of each PPO step before its swap

    def _lower_priority(self) -> None:
        """Lower the learner thread's CPU priority by ``nice`` (it runs in that thread; Linux only:
        elsewhere a thread id is not a ``setpriority`` target)."""
        if self.nice > 0 and sys.platform.startswith("linux"):
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + self.nice))

    def offer(self, session: Session, turn: Turn, reward: float, why_not: str | None,
              teacher: list[int] | None = None) -> None:
        """A judged turn (or one that cannot train) with its reward and, when hinted, its teacher
        context's prompt ids; a step starts once ``batch`` turns wait."""
        if why_not is not None:
            self.counts["untrainable"] += 1
            return
        self.counts["judged"] += 1
        advantage = self.w_rl * reward
        teacher = teacher if self.weight_opd else None
        if not advantage and teacher is None:
            self.counts["zero"] += 1
            return
        self.counts["hinted"] += teacher is not None
        with self._lock:
            self.ready.append((session, turn, advantage, reward, teacher))
            if not self.busy.is_set():
                self._next_step()

    def _next_step(self) -> None:
        """(Lock held.) Start a step on the first ``batch`` waiting turns, if that many wait;
        ``busy`` is set while a step runs."""
        if len(self.ready) < self.batch or self.closing:
            self.busy.clear()
            return
        chosen, self.ready = self.ready[:self.batch], self.ready[self.batch:]
        self.busy.set()
        self.executor.submit(self._train, chosen).add_done_callback(self._trained)

    def _trained(self, fut: Any) -> None:
        """A step ended: the turns offered meanwhile start the next one at once (else they would
        wait for the next offer, and the last ones of a run would never train)."""
        if fut.exception() is not None:
            log.error("training step failed: %s", fut.exception(), exc_info=fut.exception())
        with self._lock:
            self._next_step()

    def _train(self, chosen: list[tuple[Session, Turn, float, float, list[int] | None]]) -> None:
        """One PPO step on ``chosen``, then the weights swap into the serving model (learner thread)."""
        samples = [Sample(list(t.generation.prompt_ids), list(t.generation.response_ids),
                          list(t.generation.logprobs), a, r, teacher_prompt_ids=h) for _, t, a, r, h in chosen]
        versions = [t.generation.policy_version or 0 for _, t, *_ in chosen]
        t0 = time.monotonic()
        metrics: dict[str, Any] = dict(self.learner.step(Batch(samples, weight_opd=self.weight_opd), progress=False))
        t1 = time.monotonic()
        self.learner.publish()
        t2 = time.monotonic()
        self.updates.append((t0, t1))
        self.swaps.append((t1, t2))
        self.steps += 1
        for s, t, a, r, h in chosen:
            self.advantages.record("advantage", {"train_step": self.steps, "group_id": s.group_id,
                                                 "task_id": s.id, "sample": 0, "step": t.index, "role": "agent",
                                                 "reward": r, "advantage": a, "kept": True,
                                                 **({"hint": t.hint} if h is not None else {})})
        adv = [a for _, _, a, _, _ in chosen]
        rewards = [r for _, _, _, r, _ in chosen]
        metrics.update({"batch/samples": len(samples), "batch/response_tokens": sum(len(s.response_ids) for s in samples),
                        "reward/mean": sum(rewards) / len(rewards), "advantage/mean": sum(adv) / len(adv),
                        "advantage/std": float(np.std(adv)),
                        **({"opd/hinted_samples": sum(h is not None for *_, h in chosen)} if self.weight_opd else {}),
                        "proxy/version": self.policy.version, "proxy/staleness_max": self.policy.version - 1 - min(versions),
                        "proxy/judged_turns": self.counts["judged"], "proxy/zero_turns": self.counts["zero"],
                        "proxy/untrainable_turns": self.counts["untrainable"],
                        "time/train_s": t1 - t0, "time/swap_s": t2 - t1})
        self.metrics.log(self.steps, metrics)
        if self.steps % self.save_every == 0:
            self.save()
        log.info("training step %d: %d turns, version %d", self.steps, len(samples), self.policy.version)

    def save(self) -> Path | None:
        """A checkpoint of the current weights (skipped when nothing trained since the last one)."""
        if self.steps == self.saved or self.steps == 0:
            return None
        self.saved = self.steps
        return checkpoint.save(self.output, self.steps, self.learner.model, self.policy.tokenizer,
                               self.learner.optimizer.state_dict(), {"version": self.policy.version}, keep=3)

    def close(self) -> None:
        with self._lock:
            self.closing = True   # no new step; the running one finishes
        self.executor.shutdown(wait=True)
        self.save()
        self.metrics.close()
        self.advantages.close()


# -- the proxy --------------------------------------------------------------------------------
class TrainingProxy:
    """Serves chat completions from ``policy``, records main-line sessions, judges their next
    states and (with a trainer) trains on them."""

    def __init__(self, policy: Any, output: Path, *, judge: Any = None, trainer: ProxyTrainer | None = None,
                 hinter: Any = None, wait_outcome: bool = False, model_name: str = "policy",
                 max_tokens: int = 2048, max_body_bytes: int = 4 << 20, api_key: str | None = None):
        self.policy, self.output, self.judge, self.trainer = policy, output, judge, trainer
        self.hinter, self.wait_outcome = hinter, wait_outcome
        self.model_name, self.max_tokens, self.max_body_bytes, self.api_key = model_name, max_tokens, max_body_bytes, api_key
        self.sessions = SessionTable()
        self.recorder = Recorder(output / "rollouts.jsonl")
        self.pending: set[asyncio.Task] = set()
        self.turns = {"main": 0, "side": 0}
        self.lock = asyncio.Lock()   # session bookkeeping is short; it keeps claim/add atomic

    # -- serving ------------------------------------------------------------------------
    async def claim(self, req: ChatRequest) -> Session | None:
        """Find the request's session before generation; its previous turn's next state goes to the judge."""
        if req.turn_type != "main":
            return self.sessions.get(req.session_id) if req.session_id else None
        async with self.lock:
            session, prev = self.sessions.claim(req.messages, req.session_id, req.keys)
        if prev is not None:
            self._judge(session, prev)
        return session

    async def record_turn(self, req: ChatRequest, gen: Generation, reply: dict,
                          session: Session | None = None) -> Session | None:
        self.turns[req.turn_type] += 1
        if req.turn_type == "main" and session is not None:
            turn = Turn(session.turns, req.messages, gen, reply, float(req.sampling.get("temperature") or 0.0),
                        req.tools, keys=req.keys)
            self.sessions.add(session, turn)
        if req.session_done and session is not None:
            self.end(session)
        return session

    def abort_turn(self, req: ChatRequest, session: Session | None, why: str, text: str = "") -> None:
        """A main request that got no complete answer (the client went away mid-stream, the
        generation failed): recorded as an ``aborted`` step, never trained on; the session
        stays open."""
        if req.turn_type != "main" or session is None:
            return
        self.sessions.release(session)
        self.turns["aborted"] = self.turns.get("aborted", 0) + 1
        self.recorder.record("step", {
            "group_id": session.group_id, "task_id": session.id, "sample": 0, "step": session.turns,
            "role": "agent", "messages": req.messages, "text": text, "action": None, "aborted": why,
            "next_state": {"valid": False, "error": why, "output": ""}, "observation": "", "reward": None})

    # -- next states and votes ------------------------------------------------------------
    def _step_record(self, session: Session, turn: Turn, state: dict) -> None:
        self.recorder.record("step", {
            "group_id": session.group_id, "task_id": session.id, "sample": 0, "step": turn.index, "role": "agent",
            "messages": turn.messages, "text": turn.generation.text, "action": turn.reply,
            "next_state": state, "observation": state.get("output", ""), "reward": None,
            "ids_from_server": turn.generation.ids_from_server, "rewritten": turn.rewritten, "dropped": turn.dropped,
            "policy_version": turn.generation.policy_version})

    def _why_not(self, turn: Turn) -> str | None:
        """Why a turn cannot train, or None."""
        g = turn.generation
        if turn.rewritten:
            return "the client sent the answer back changed"
        if not (g.ids_from_server and g.response_ids and len(g.logprobs) == len(g.response_ids)):
            return "no exact token ids"
        learner = self.trainer.temperature if self.trainer is not None else 1.0
        if turn.temperature != learner and not (turn.temperature == 0.0 and learner == 1.0):
            return f"sampled at temperature {turn.temperature:g}; the learner computes log-probs at {learner:g}"
        return None

    def _judge(self, session: Session, turn: Turn) -> None:
        """Record the turn with its next state and judge it in the background."""
        state = text_state(next_state_text(turn.next_messages or []))
        state["messages"] = turn.next_messages
        self._step_record(session, turn, state)
        history = list(session.history[-8:])
        session.history.append({"action": turn.generation.text, "next_state": {"output": state["output"][:600]}})
        if (self.judge is None and self.hinter is None) or not turn.next_messages:
            return
        req = JudgeRequest("proxy", session.instruction, history, turn.generation.text, state)
        task = asyncio.ensure_future(self._vote(session, turn, req))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _ask(self, source: Any, kind: str, session: Session, turn: Turn, req: JudgeRequest) -> JudgeResult | None:
        """``source``'s answer about ``turn`` (a judge's votes, a hint source's hint), recorded."""
        if source is None:
            return None
        t0 = time.monotonic()
        result = await source.judge(req)
        self.recorder.record(kind, {"group_id": session.group_id, "task_id": session.id, "sample": 0,
                                    "step": turn.index, "seconds": time.monotonic() - t0, **result.to_dict()})
        return result

    async def _vote(self, session: Session, turn: Turn, req: JudgeRequest) -> None:
        """Judge and hint ``turn`` (at once), then credit it: its vote, and its teacher context
        (the turn's prompt with the hint in its last user or tool message) when hinted."""
        result, hinted = await asyncio.gather(self._ask(self.judge, "judge", session, turn, req),
                                              self._ask(self.hinter, "hint", session, turn, req))
        vote = float(result.score) if result is not None and result.votes else None
        if vote is not None:
            session.scores.append(vote)
        teacher = None
        if hinted is not None and hinted.hint:
            turn.hint = hinted.hint
            teacher = self.policy.prompt_ids(teacher_messages(turn.messages, hinted.hint), turn.tools)
        if vote is not None or teacher is not None:
            self._credit(session, turn, vote or 0.0, teacher)

    def _credit(self, session: Session, turn: Turn, vote: float, teacher: list[int] | None = None) -> None:
        """Hand a judged turn to the trainer; with ``wait_outcome``, once its session's outcome is
        known, which is then added to its vote (``R_t = o + vote``, the env loop's reward)."""
        if self.trainer is None:
            return
        if not self.wait_outcome:
            self.trainer.offer(session, turn, vote, self._why_not(turn), teacher)
        elif session.outcome is None:
            session.waiting.append((turn, vote, teacher))
        else:
            self.trainer.offer(session, turn, session.outcome + vote, self._why_not(turn), teacher)

    def end(self, session: Session) -> None:
        """The session is over: its last turn is recorded without a next state (it trains only
        on an outcome, see :meth:`report`)."""
        if session.done:
            return
        self.sessions.end(session)
        if session.last is not None:
            self._step_record(session, session.last, {"valid": True, "output": "", "session_end": True})
        self._trajectory(session)

    def _trajectory(self, session: Session, status: str = "finished") -> None:
        self.recorder.record("trajectory", {"group_id": session.group_id, "task_id": session.id, "sample": 0,
                                            "status": status, "error": None, "outcome": session.outcome,
                                            "steps": session.turns, "step_scores": session.scores})

    def report(self, sid: str, outcome: float) -> Session:
        """A client's outcome for session ``sid`` (every open branch of it; else its latest): it
        ends the session and is the reward of its last turn; with ``wait_outcome`` it is added to
        the votes of its other turns too, which train only now."""
        found = self.sessions.branches(sid) or [s for s in [self.sessions.get(sid)] if s is not None]
        if not found:
            raise BadRequest(f"no session {sid!r}", status=404)
        for session in found:
            last = session.last
            session.outcome = outcome
            if session.done:
                self._trajectory(session)
            else:
                self.end(session)
            waiting, session.waiting = session.waiting, []
            for turn, vote, teacher in waiting:
                self._credit(session, turn, vote, teacher)
            if last is not None and self.trainer is not None:
                self.sessions.pop_last(session)
                self.trainer.offer(session, last, outcome, self._why_not(last))
        return found[-1]

    async def close(self) -> None:
        """Wait for the judges, end open sessions (``truncated``), save, close the logs."""
        if self.pending:
            await asyncio.wait(self.pending, timeout=30)
        for session in self.sessions.open():
            self.sessions.end(session)
            if session.last is not None:
                self._step_record(session, session.last, {"valid": True, "output": "", "session_end": True})
            self._trajectory(session, "truncated")
        if self.trainer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.trainer.close)
        self.recorder.close()
        await self.policy.aclose()

    def status(self) -> dict[str, Any]:
        t = self.trainer
        return {"version": self.policy.version, "trained_steps": t.steps if t else 0,
                "ready_turns": len(t.ready) if t else 0, "training": bool(t and t.busy.is_set()),
                "sessions": len(self.sessions.sessions), "open_sessions": len(self.sessions.open()),
                "turns": dict(self.turns), "judging": len(self.pending), **(t.counts if t else {})}


# -- HTTP -------------------------------------------------------------------------------------
def _chunk(cid: str, created: int, model: str, version: int, delta: dict, finish: str | None = None) -> str:
    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": f"v{version}", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def make_app(proxy: TrainingProxy) -> Any:
    """The FastAPI app of ``proxy``; shutting it down (Ctrl-C included) closes the proxy:
    judges awaited, sessions ended, a checkpoint saved."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await proxy.close()

    app = FastAPI(title="nextstate training proxy", lifespan=lifespan)

    def error(message: str, status: int = 400) -> JSONResponse:
        kind = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}.get(
            status, "invalid_request_error" if status < 500 else "server_error")
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    async def body_of(request: Request) -> bytes:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > proxy.max_body_bytes:
            raise BadRequest(f"the body is {size} bytes; the limit is {proxy.max_body_bytes}", 413)
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > proxy.max_body_bytes:
                raise BadRequest(f"the body is over the limit of {proxy.max_body_bytes} bytes", 413)
        return bytes(data)

    if proxy.api_key:
        app.add_middleware(_BearerKey, key=proxy.api_key,
                           refuse=error("missing or wrong bearer key (Authorization: Bearer <key>)", 401))

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [{"id": proxy.model_name, "object": "model", "created": 0,
                                            "owned_by": "nextstate"}]}

    @app.get("/health")
    async def health() -> Any:
        return proxy.status()

    @app.post("/v1/sessions/{sid}/outcome")
    async def outcome(sid: str, request: Request) -> Any:
        try:
            body = json.loads(await body_of(request))
            value = float(body["outcome"] if "outcome" in body else body["reward"])
        except BadRequest as e:
            return error(str(e), e.status)
        except (ValueError, KeyError, TypeError):
            return error('the body must be {"outcome": <number>}')
        if not math.isfinite(value):
            return error("the outcome must be a finite number")
        try:
            session = proxy.report(sid, value)
        except BadRequest as e:
            return error(str(e), e.status)
        return {"session_id": session.id, "outcome": value, "turns": session.turns}

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Any:
        try:
            req = parse_request(await body_of(request), {k.lower(): v for k, v in request.headers.items()},
                                proxy.max_tokens)
        except BadRequest as e:
            return error(str(e), e.status)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        session = await proxy.claim(req)
        headers = {"X-Session-Id": session.id} if session is not None else {}
        if not req.stream:
            try:
                gen = await proxy.policy.generate(req.messages, req.tools, **req.sampling)
            except ValueError as e:   # bad sampling values, a template that cannot render the messages
                proxy.abort_turn(req, session, "the request could not be served")
                return error(str(e).splitlines()[0] if str(e) else type(e).__name__)
            except BaseException:
                proxy.abort_turn(req, session, "the generation failed")
                raise
            reply = assistant_message(gen.text, req.tools)
            await proxy.record_turn(req, gen, reply, session)
            body = {"id": cid, "object": "chat.completion", "created": created, "model": proxy.model_name,
                    "system_fingerprint": f"v{gen.policy_version}",
                    "choices": [{"index": 0, "message": reply, "finish_reason": finish_reason(gen, reply),
                                 "logprobs": None}], "usage": usage(gen)}
            if session is not None:
                body["session_id"] = session.id
            return JSONResponse(body, headers={**headers, "X-Policy-Version": str(gen.policy_version)})
        pieces = proxy.policy.stream(req.messages, req.tools, **req.sampling)
        try:
            first = await anext(pieces)
        except ValueError as e:
            proxy.abort_turn(req, session, "the request could not be served")
            return error(str(e).splitlines()[0] if str(e) else type(e).__name__)
        except BaseException:   # the client left before the first token (the request is cancelled)
            await pieces.aclose()
            proxy.abort_turn(req, session, "the client disconnected")
            raise
        version = first[1] if isinstance(first, tuple) else first.policy_version
        return _Stream(_events(proxy, req, session, pieces, first, cid, created, version),
                       media_type="text/event-stream",
                       headers={**headers, "X-Policy-Version": str(version), "Cache-Control": "no-cache"})

    return app


class _BearerKey:
    """ASGI middleware that answers ``refuse`` to a request without ``Authorization: Bearer <key>``
    (plain ASGI: Starlette's ``BaseHTTPMiddleware`` costs every request a task group and streams)."""

    def __init__(self, app: Any, key: str, refuse: JSONResponse):
        self.app, self.expected, self.refuse = app, f"Bearer {key}".encode(), refuse

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != self.expected:
            await self.refuse(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _Stream(StreamingResponse):
    """A streaming response that closes its event generator whatever happens: when the client
    disconnects, Starlette cancels the send and leaves the generator suspended; closing it
    cancels the generation and records the turn as aborted (:func:`_events`)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def _events(proxy: TrainingProxy, req: ChatRequest, session: Session | None, pieces: AsyncIterator,
                  first: Any, cid: str, created: int, version: int) -> AsyncIterator[str]:
    """Server-sent events of one streamed answer: the role, text pieces as they are sampled
    (held back from a ``<tool_call>`` tag on when the request has tools), the tool calls, the end."""
    model = proxy.model_name
    sent, text, item = 0, "", first
    done = False
    try:
        yield _chunk(cid, created, model, version, {"role": "assistant", "content": ""})
        while True:
            if isinstance(item, tuple):
                text += item[0]
                upto = text.find("<tool_call>") if req.tools else -1
                upto = len(text) if upto < 0 else upto
                if upto > sent:
                    yield _chunk(cid, created, model, version, {"content": text[sent:upto]})
                    sent = upto
            else:
                gen: Generation = item
                break
            item = await anext(pieces)
        # the answer is complete: it is the session's turn even if the client leaves now
        reply = assistant_message(gen.text, req.tools)
        await proxy.record_turn(req, gen, reply, session)
        done = True
        for i, call in enumerate(reply.get("tool_calls") or []):
            yield _chunk(cid, created, model, version, {"tool_calls": [{"index": i, **call}]})
        yield _chunk(cid, created, model, version, {}, finish_reason(gen, reply))
        if req.include_usage:
            body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [], "usage": usage(gen)}
            yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if not done:   # the client went away mid-answer: stop sampling, record the turn as aborted
            await pieces.aclose()
            proxy.abort_turn(req, session, "the client disconnected mid-stream", text)


# -- command line ---------------------------------------------------------------------------
def _llm(spec: str, policy: Any, flag: str) -> Any:
    """The model an LLM judge or hint source asks: ``policy`` (the served model) or a URL's."""
    if spec == "policy":
        return policy
    if spec.startswith(("http://", "https://")):
        from nextstate.agents.openai_policy import OpenAIPolicy
        return OpenAIPolicy(spec)
    raise ConfigError(f"{flag} must be rules, policy, none or an http(s) URL, got {spec!r}")


def make_judge(spec: str, policy: Any, votes: int, hints: bool) -> Any:
    """``rules``, ``policy`` (the served model judges), an OpenAI-compatible URL, or ``none``."""
    if spec == "none":
        return None
    if spec == "rules":
        return RuleJudge(m=votes)
    return StepJudge(_llm(spec, policy, "--judge"), m=votes, hints=hints,
                     templates={"proxy": TEMPLATES / "default.yaml"})


def make_hinter(spec: str, policy: Any, votes: int) -> Any:
    """OPD's hint source (:mod:`judges.hints`): ``rules`` (:class:`judges.rules.RuleHints`),
    ``policy`` or a URL (:class:`judges.hints.HintJudge` on that model), or ``none``."""
    if spec == "none":
        return None
    if spec == "rules":
        return RuleHints(m=votes)
    from nextstate.judges.hints import HintJudge
    return HintJudge(_llm(spec, policy, "--hint-source"), m=votes, templates={"proxy": TEMPLATES / "default.yaml"})


def build(args: argparse.Namespace) -> TrainingProxy:
    """The proxy a command line asks for."""
    import torch

    from nextstate.agents.hf_policy import HFPolicy

    if args.batch < 1:
        raise ConfigError("--batch must be at least 1")
    cfg = Config()
    cfg.train.kl_coef = 0.0   # no reference model unless asked for (--set train.kl_coef=...)
    cfg.rollout.temperature = 1.0
    _apply(cfg, parse_overrides(args.set or []))
    cfg.opd.mode = args.mode
    hint_source = args.hint_source or (args.judge if args.judge not in ("none", "rules") else "rules")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        policy = HFPolicy(args.model, device=device, seed=args.seed, max_new_tokens=args.max_tokens)
    except OSError as e:
        raise ConfigError(f"cannot load model {args.model!r}: {str(e).splitlines()[0]}") from None
    judge = make_judge(args.judge, policy, args.votes, args.hints)
    hinter = make_hinter(hint_source, policy, args.votes) if args.mode != "rl" else None
    trainer = (ProxyTrainer(policy, cfg, output, args.batch, args.save_every, nice=args.learner_nice)
               if args.batch and not args.no_train else None)
    (output / "proxy.json").write_text(json.dumps({**vars(args), "api_key": bool(args.api_key),
                                                   "config": cfg.to_dict()}, indent=1, default=str) + "\n")
    return TrainingProxy(policy, output, judge=judge, hinter=hinter, trainer=trainer,
                         wait_outcome=args.wait_outcome, model_name=args.served_name or args.model,
                         max_tokens=args.max_tokens, max_body_bytes=args.max_body_mb << 20, api_key=args.api_key)


def server_config(app: Any, host: str, port: int) -> "uvicorn.Config":
    """uvicorn's settings for the proxy's app (or another ASGI app). Idle keep-alive connections
    are kept for 75 s, longer than clients keep them (httpx, and so the ``openai`` SDK: 5 s):
    with uvicorn's own 5 s both ends close at the same moment, and a request sent on a connection
    the server is closing fails with "Server disconnected" (a client with ``max_retries=0`` sees a
    connection error)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_keep_alive=75)


@contextlib.contextmanager
def serving(proxy: TrainingProxy | Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The proxy (or another ASGI app: ``bench.proxy``'s plain server) served by uvicorn in a
    background thread (``port`` 0: a free one); yields the base URL (``http://host:port/v1``).
    Leaving the block shuts the server down, which closes the proxy."""
    import uvicorn

    app = make_app(proxy) if isinstance(proxy, TrainingProxy) else proxy
    server = uvicorn.Server(server_config(app, host, port))
    thread = threading.Thread(target=server.run, daemon=True, name="proxy-server")
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the proxy could not start on {host}:{port}")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        thread.join()


def serve(proxy: TrainingProxy, host: str, port: int) -> int:
    """Run the server until Ctrl-C (returns 130) or shutdown (0); the app saves on the way out."""
    import uvicorn

    server = uvicorn.Server(server_config(make_app(proxy), host, port))
    try:
        server.run()   # on a signal: graceful shutdown (the app's lifespan saves), then the signal again
    except KeyboardInterrupt:
        return 130
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m train.proxy", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="tiny, a local path or a hub name")
    p.add_argument("--output", required=True, help="run folder (rollouts.jsonl, metrics, checkpoints)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--judge", default="rules", help="rules | policy | none | an OpenAI-compatible URL")
    p.add_argument("--votes", type=int, default=1, help="m: judge answers per turn")
    p.add_argument("--hints", action="store_true", help="ask the LLM judge for hindsight hints")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer <key>")
    p.add_argument("--mode", choices=MODES, default="rl",
                   help="rl: the vote; opd: hinted turns only, the teacher's token advantages; combine: both")
    p.add_argument("--hint-source", default=None,
                   help="OPD's hints: rules | policy | none | a URL (default: --judge's LLM, else rules)")
    p.add_argument("--wait-outcome", action="store_true",
                   help="judged turns train once their session's outcome is reported, with reward outcome + vote")
    p.add_argument("--batch", type=int, default=16, help="judged turns per training step")
    p.add_argument("--no-train", action="store_true", help="serve, record and judge only")
    p.add_argument("--save-every", type=int, default=10, help="training steps between checkpoints")
    p.add_argument("--learner-nice", type=int, default=10,
                   help="how far below serving the learner thread's CPU priority is (Linux; 0: the same)")
    p.add_argument("--max-tokens", type=int, default=2048, help="the largest max_tokens a request may ask")
    p.add_argument("--max-body-mb", type=int, default=4, help="the largest request body, in MiB")
    p.add_argument("--served-name", default=None, help="the model name /v1/models reports")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="trainer settings, e.g. train.lr=1e-5 train.kl_coef=0.01 (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        proxy = build(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"serving {args.model} on http://{args.host}:{args.port}/v1 (output {args.output})", flush=True)
    return serve(proxy, args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
