"""The proxy's learner side: :class:`ProxyTrainer` turns judged turns into PPO steps in a
background thread and swaps the new weights into the serving model."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from nextstate.agents.recorder import Recorder
from nextstate.train import checkpoint
from nextstate.train.batch import Batch, Sample, rl_weight
from nextstate.train.config import Config
from nextstate.train.sessions import Session, Turn

log = logging.getLogger(__name__)


class ProxyTrainer:
    """Turns judged turns into PPO steps in a background thread. A turn's reward is its vote
    (binary RL), plus its session's outcome when the proxy waits for outcomes; its advantage
    is ``w_rl`` times that (:func:`train.batch.rl_weight`: 1 in mode ``rl``, 0 in ``opd``),
    and a hinted turn (``opd``/``combine``) also carries its teacher context, which the
    learner scores (:meth:`train.learner.Learner.score_teacher`).

    Serving comes first: generation goes on with the old weights during a step, and on Linux the
    learner thread (and the torch threads it starts) runs ``nice`` steps below the server, so a
    step that shares the CPU with generation takes the cycles generation leaves (0: same priority)."""

    def __init__(self, policy: Any, cfg: Config, output: Path, batch: int, save_every: int, nice: int = 10,
                 resume: Path | None = None):
        from nextstate.train.learner import Learner
        from nextstate.train.metrics import MetricsLog

        self.policy, self.cfg, self.output, self.batch, self.save_every = policy, cfg, output, batch, save_every
        self.nice = nice
        self.learner = Learner(policy, cfg)
        self.steps = 0
        if resume is not None:   # checkpoint ``resume``: its weights are the policy's; here the rest
            meta, state = checkpoint.load(resume)
            self.learner.load_state_dict(state)
            self.steps = int(meta["step"])
            policy.version = int(meta.get("version", self.steps))
        self.temperature = self.learner.temperature
        self.eps = cfg.advantage.eps
        self.w_rl = rl_weight(cfg.opd)
        self.weight_opd = cfg.opd.weight_opd if cfg.opd.mode != "rl" else 0.0
        self.metrics = MetricsLog(output, resume_step=self.steps if resume is not None else None)
        self.advantages = Recorder(output / "advantages.jsonl")
        self.ready: list[tuple[Session, Turn, float, float, list[int] | None]] = []
        self.saved = self.steps
        self.busy = threading.Event()
        self.closing = False
        # ready and busy: offered on the event loop, taken on the learner thread; reentrant, as a step
        # that ended before its done callback was added runs that callback here, lock held
        self._lock = threading.RLock()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="proxy-learner",
                                           initializer=self._lower_priority)
        self.counts = {"judged": 0, "zero": 0, "untrainable": 0, "hinted": 0, "grouped": 0}
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

    def offer_group(self, session: Session, members: list[tuple[Turn, float, float, str | None]]) -> None:
        """A group's candidates (``--samples``) as ``(turn, reward, group-normalized advantage, why
        not trainable)``: each trains with ``w_rl`` times its advantage (0: dropped)."""
        with self._lock:
            for turn, reward, advantage, why_not in members:
                self.counts["grouped"] += 1
                if why_not is not None:
                    self.counts["untrainable"] += 1
                elif not self.w_rl * advantage:
                    self.counts["zero"] += 1
                else:
                    self.ready.append((session, turn, self.w_rl * advantage, reward, None))
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
                                                 **({"hint": t.hint} if h is not None else {}),
                                                 **({"candidate": t.candidate} if t.candidate is not None else {}),
                                                 **({"rubric_version": t.rubric_version}
                                                    if t.rubric_version is not None else {})})
        adv = [a for _, _, a, _, _ in chosen]
        rewards = [r for _, _, _, r, _ in chosen]
        rubric = sorted({t.rubric_version for _, t, *_ in chosen if t.rubric_version is not None})
        metrics.update({"batch/samples": len(samples), "batch/response_tokens": sum(len(s.response_ids) for s in samples),
                        "reward/mean": sum(rewards) / len(rewards), "advantage/mean": sum(adv) / len(adv),
                        "advantage/std": float(np.std(adv)),
                        **({"opd/hinted_samples": sum(h is not None for *_, h in chosen)} if self.weight_opd else {}),
                        "group/samples": sum(t.candidate is not None for _, t, *_ in chosen),
                        **({"rubric/versions": rubric} if rubric else {}),
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
        parts = {"": (self.learner.model, self.policy.tokenizer, self.learner.optimizer.state_dict())}
        return checkpoint.save(self.output, self.steps, parts=parts, meta={"version": self.policy.version}, keep=3)

    def close(self) -> None:
        """Start no new step, let the running one finish, save a checkpoint, close the logs."""
        with self._lock:
            self.closing = True   # no new step; the running one finishes
        self.executor.shutdown(wait=True)
        self.save()
        self.metrics.close()
        self.advantages.close()

