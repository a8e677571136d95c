"""The proxy's bookkeeping: :class:`TrainingProxy` finds each request's session, records its
turns, sends each turn's next state to the judge and the hint source in the background, and
credits the judged turns (their votes, their session's outcome) to the trainer."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path
from typing import Any

from nextstate.agents.policy import Generation, content_text
from nextstate.agents.recorder import Recorder
from nextstate.judges.hints import teacher_messages
from nextstate.judges.prm import DEFAULT_TEMPLATE, TEMPLATES, JudgeRequest, JudgeResult
from nextstate.judges.rules import text_state
from nextstate.train.config import GroupConfig
from nextstate.train.proxy import group as grouping
from nextstate.train.proxy.rubric import Rubric, with_rubric
from nextstate.train.proxy.trainer import ProxyTrainer
from nextstate.train.proxy.wire import BadRequest, ChatRequest, assistant_message
from nextstate.train.sessions import Session, SessionTable, Turn

log = logging.getLogger(__name__)
FAMILY = "proxy"   # the family of the proxy's judge requests: no env family's
JUDGE_TEMPLATES = {FAMILY: TEMPLATES / DEFAULT_TEMPLATE}   # so the LLM judge asks them the default prompt


def next_state_text(messages: list[dict]) -> str:
    """The new messages after an answer, as text for the judge (tool results and replies)."""
    return "\n\n".join(content_text(m.get("content")) for m in messages)


class TrainingProxy:
    """Serves chat completions from ``policy``, records main-line sessions, judges their next
    states and (with a trainer) trains on them."""

    def __init__(self, policy: Any, output: Path, *, judge: Any = None, trainer: ProxyTrainer | None = None,
                 hinter: Any = None, wait_outcome: bool = False, model_name: str = "policy",
                 max_tokens: int = 2048, max_body_bytes: int = 4 << 20, api_key: str | None = None,
                 group: GroupConfig | None = None, ranker: Any = None, seed: int = 0,
                 rubric: Rubric | None = None):
        self.policy, self.output, self.judge, self.trainer = policy, output, judge, trainer
        self.group = group if group is not None and group.samples > 1 else None
        self.ranker = ranker if self.group is not None else None
        if self.group is not None and ranker is None:
            raise ValueError("group sampling needs a ranker")
        self.rng = random.Random(seed)
        self.hinter, self.wait_outcome = hinter, wait_outcome
        self.model_name, self.max_tokens, self.max_body_bytes, self.api_key = model_name, max_tokens, max_body_bytes, api_key
        self.sessions = SessionTable()
        self.recorder = Recorder(output / "rollouts.jsonl")
        self.rubric = rubric
        if rubric is not None:
            rubric.start(self.recorder.record)
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
        if self.rubric is not None:
            said = prev.next_messages if prev is not None else (req.messages if session.turns == 0 else [])
            users = [content_text(m.get("content")) for m in said or [] if m.get("role") == "user"]
            if users:
                self._background(self._observe(session, session.turns, users))
        return session

    def _background(self, coro: Any) -> None:
        """Run ``coro`` in the background; :meth:`close` waits for it."""
        task = asyncio.ensure_future(coro)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _observe(self, session: Session, step: int, messages: list[str]) -> None:
        """The user's new messages, in order, to the evolving rubric (``step``: the turn they precede)."""
        for text in messages:
            try:
                await self.rubric.observe(text, {"session": session.id, "group_id": session.group_id, "step": step})
            except Exception as e:   # a preference source that raises: logged, the rubric unchanged
                log.warning("the rubric's preference source failed on a message: %s: %s", type(e).__name__, e)

    def grouped(self, req: ChatRequest, session: Session | None) -> bool:
        """Whether ``req`` is answered by group sampling: a main-line turn, with ``--samples`` > 1."""
        return self.group is not None and req.turn_type == "main" and session is not None

    async def answer(self, req: ChatRequest, session: Session | None) -> Generation:
        """The answer to ``req``: one generation, or with group sampling the candidate
        :func:`~train.proxy.group.pick` returns of ``samples`` sampled in one batch (``best``: after
        the ranker; ``random``: at once, the ranking and the group's training in the background)."""
        if not self.grouped(req, session):
            return await self.policy.generate(req.messages, req.tools, **req.sampling)
        g = self.group
        gens = await self.policy.generate_group(req.messages, req.tools, g.samples, **req.sampling)
        index = session.turns
        if g.choose == "random":
            chosen = grouping.pick("random", None, len(gens), self.rng)
            self._background(self._rank_group(req, session, index, gens, chosen))
            return gens[chosen]
        return gens[await self._rank_group(req, session, index, gens)]

    async def _rank_group(self, req: ChatRequest, session: Session, index: int, gens: list[Generation],
                          chosen: int | None = None) -> int:
        """Rank a group, choose (unless ``chosen`` was), record it (``"kind": "group"``) and offer
        its candidates to the trainer with their group-normalized advantages; the choice."""
        texts = [g.text for g in gens]
        version = self.rubric.current if self.rubric is not None else None
        t0 = time.monotonic()
        try:
            ranking = await self.ranker.rank(req.messages, texts, req.tools, version.text if version else "")
        except Exception as e:   # a ranker that raises: the group is recorded without scores, the answer served
            ranking = grouping.Ranking(None, f"the ranker failed: {type(e).__name__}: {e}")
        seconds = time.monotonic() - t0
        values, terms = grouping.rewards(self.group, ranking, req.messages, texts, req.tools)
        if chosen is None:
            chosen = grouping.pick(self.group.choose, values, len(gens), self.rng)
        adv, signal = grouping.advantages(values, self.trainer.eps if self.trainer else 1e-6) if values else (None, False)
        self.recorder.record("group", {
            "group_id": session.group_id, "task_id": session.id, "sample": 0, "step": index,
            "ranker": type(self.ranker).__name__, "reward_kind": self.group.reward, "choose": self.group.choose,
            "chosen": chosen, "texts": texts, "scores": ranking.scores, "terms": terms, "rewards": values,
            "advantages": adv, "error": ranking.error, "prompt": ranking.prompt, "raw": ranking.raw,
            "seconds": seconds, "policy_version": gens[0].policy_version,
            **({"rubric_version": version.version} if version else {})})
        if self.trainer is not None and values is not None and signal:
            temperature = float(req.sampling.get("temperature") or 0.0)
            members = []
            for i, (gen, r, a) in enumerate(zip(gens, values, adv)):
                turn = Turn(index, req.messages, gen, assistant_message(gen.text, req.tools), temperature,
                            req.tools, keys=req.keys, candidate=i, rubric_version=version and version.version)
                members.append((turn, r, a, self._why_not(turn)))
            self.trainer.offer_group(session, members)
        return chosen

    async def record_turn(self, req: ChatRequest, gen: Generation, reply: dict,
                          session: Session | None = None) -> Session | None:
        """Count a served answer; a main turn becomes ``session``'s latest (its next state comes
        with the session's next request); ``session_done`` ends the session."""
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
        instruction = session.instruction
        if self.rubric is not None:
            turn.rubric_version = self.rubric.current.version
            instruction = with_rubric(instruction, self.rubric.current)
        req = JudgeRequest(FAMILY, instruction, history, turn.generation.text, state)
        self._background(self._vote(session, turn, req))

    async def _ask(self, source: Any, kind: str, session: Session, turn: Turn, req: JudgeRequest) -> JudgeResult | None:
        """``source``'s answer about ``turn`` (a judge's votes, a hint source's hint), recorded."""
        if source is None:
            return None
        t0 = time.monotonic()
        result = await source.judge(req)
        self.recorder.record(kind, {"group_id": session.group_id, "task_id": session.id, "sample": 0,
                                    "step": turn.index, "seconds": time.monotonic() - t0, **result.to_dict(),
                                    **({"rubric_version": turn.rubric_version} if turn.rubric_version is not None
                                       else {})})
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
        """What ``GET /health`` reports: the weights' version, training, sessions and turns so far."""
        t = self.trainer
        return {"version": self.policy.version, "trained_steps": t.steps if t else 0,
                **({"rubric_version": self.rubric.current.version} if self.rubric is not None else {}),
                "ready_turns": len(t.ready) if t else 0, "training": bool(t and t.busy.is_set()),
                "sessions": len(self.sessions.sessions), "open_sessions": len(self.sessions.open()),
                "turns": dict(self.turns), "judging": len(self.pending), **(t.counts if t else {})}

