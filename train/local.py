"""``--backend local``: the whole loop in one process, on CPU or one GPU.

Rollout and training are decoupled and overlap. When the rollout of step k
is done, the rollouts of the next ``train.max_staleness`` steps start at once
(episodes in the agent loop's threads, generation in the policy's worker
thread, judge requests fired in the background as each step lands) while the
learner trains on step k in its own thread. After each update the learner
copies its weights into the serving model under the policy's generate lock,
so later generations use them; a batch is therefore at most
``max_staleness`` updates behind the weights it trains (its pi_old log-probs
are the ones recorded at rollout). ``max_staleness=0`` runs strictly in turn.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np

from nextstate.agents.recorder import Recorder
from nextstate.agents.trajectory import Trajectory
from nextstate.envs import env_class
from nextstate.train import checkpoint
from nextstate.train.batch import build_batch, rollout_metrics
from nextstate.train.config import Config, ConfigError, policy_roles
from nextstate.train.learner import Learner
from nextstate.train.metrics import MetricsLog
from nextstate.train.rollout import agent_measures, collect, heldout
from nextstate.train.wiring import chat_config, load_tasks, make_envs, make_hinter, make_judge, role_router


Rollout = Callable[[int], Awaitable[list[Trajectory]]]


def tasks_for_step(n_tasks: int, step: int, per_step: int, seed: int) -> list[int]:
    """Task indices of training step ``step`` (0-based): consecutive slices of a fresh
    seeded permutation per epoch, so the data position is a function of the step."""
    out: list[int] = []
    pos = step * per_step
    while len(out) < per_step:
        epoch, offset = divmod(pos, n_tasks)
        order = np.random.default_rng([seed, epoch]).permutation(n_tasks)
        take = min(per_step - len(out), n_tasks - offset)
        out.extend(order[offset:offset + take].tolist())
        pos += take
    return out


async def overlapped_loop(start: int, total: int, staleness: int, rollout: Rollout,
                          train: Callable[[int, list[Trajectory]], dict[str, Any]],
                          after: Callable[[int, dict[str, Any]], None],
                          stopping: threading.Event | None = None) -> None:
    """Steps ``start..total-1``: roll out, then train while the next ``staleness`` rollouts run.

    ``train`` runs in its own thread; ``after(step, metrics)`` runs in the
    event loop's thread once the step is trained. ``stopping`` is set when the loop
    ends early (an error, a Ctrl-C), before it waits for a step still training.
    """
    loop = asyncio.get_running_loop()
    pending: dict[int, asyncio.Task] = {}
    started: dict[int, float] = {}

    def launch(step: int) -> None:
        if step < total and step not in pending:
            started[step] = time.monotonic()
            pending[step] = asyncio.ensure_future(rollout(step))

    trainer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="learner")
    step_done = start
    try:
        launch(start)
        for step in range(start, total):
            trajectories = await pending.pop(step)
            rollout_s = time.monotonic() - started.pop(step)
            for ahead in range(1, staleness + 1):
                launch(step + ahead)
            t0 = time.monotonic()
            metrics = await loop.run_in_executor(trainer, train, step, trajectories)
            metrics.update({"time/rollout_s": rollout_s, "time/train_s": time.monotonic() - t0})
            if staleness == 0:
                launch(step + 1)
            after(step, metrics)
            step_done = step + 1
    finally:
        if stopping is not None and step_done < total:
            stopping.set()
        for task in pending.values():
            task.cancel()
        await asyncio.gather(*pending.values(), return_exceptions=True)
        # wait for a step still training without blocking the loop: its evaluation runs there
        await loop.run_in_executor(None, trainer.shutdown)


def judge_failed_everywhere(trajectories: list[Trajectory]) -> str | None:
    """Why a run must stop when its judge failed on every step of a training step (a wrong
    ``judge.model``, a server that cannot judge): one line, else None."""
    errors = [s.judge_error for t in trajectories for s in t.steps]
    if not errors or any(e is None for e in errors):
        return None
    return (f"the judge failed on all {len(errors)} steps of the first training step "
            f"(first error: {str(errors[0])[:300]}); check judge.url and judge.model")


@dataclass
class Member:
    """One trained policy of a run: the roles it plays, its serving policy and its learner.

    ``part`` names it in the run's files: its folder in a checkpoint, the prefix of its metrics
    and the ``policy`` of its advantage records. It is ``""`` for the one policy of a run without
    ``agents``, whose files are the run's own (``step_N/model/``, unprefixed metrics)."""

    name: str
    roles: tuple[str, ...]
    policy: Any
    learner: Learner
    part: str

    def labels(self) -> dict[str, str]:
        """What each of its advantage records carries besides the step's own fields."""
        return {"policy": self.part} if self.part else {}

    def logged(self, own: dict[str, Any], team: dict[str, Any], trajectories: list[Trajectory]) -> dict[str, Any]:
        """Its metrics of a step as the run logs them, from ``own`` (its batch's and its learner's):
        as they are when its files are the run's; else those not the ``team``'s (the episodes',
        logged once), under ``<part>/``, with the valid-action rate of its roles' steps."""
        if not self.part:
            return own
        mine = [s for t in trajectories if t.status != "aborted" for s in t.steps if s.role in self.roles]
        return {**{f"{self.part}/{k}": v for k, v in own.items() if k not in team},
                f"{self.part}/valid_action_rate":
                    float(np.mean([bool(s.next_state.get("valid")) for s in mine])) if mine else 0.0}


class LocalTrainer:
    """Policies, learners, sandbox pool, judge and logs of one local run.

    Usually one policy (``model.name``) trained on the steps of ``train.role``; with ``agents``
    (:func:`~train.config.policy_roles`), one :class:`Member` per policy, each trained on the
    steps of its own roles, with its own optimizer, reference, checkpoint folder
    (``checkpoints/step_N/<name>/``) and metrics (prefixed ``<name>/``).
    """

    def __init__(self, cfg: Config, output: Path, *, resume: bool = False, progress: bool = True):
        import torch

        self.cfg, self.output, self.progress = cfg, output, progress
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.dtype = None if cfg.model.dtype == "auto" else getattr(torch, cfg.model.dtype)
        ckpt = checkpoint.latest(output) if resume else None
        self.start = 0
        starts: dict[str, str] = {}
        if cfg.sft.steps > 0:   # supervised warm starts first, one per policy (reused when already made)
            from nextstate.train.sft import warm_starts
            starts = warm_starts(cfg, output / "warm_start", progress=progress)
        self.members = [self._member(name, roles, starts.get(name) or cfg.agents.get(name, cfg.model.name), ckpt,
                                     part=name if cfg.agents else "")
                        for name, roles in policy_roles(cfg).items()]
        if ckpt is not None:
            meta, _ = checkpoint.load(ckpt, self.members[0].part)   # the RNG states
            self.start = int(meta["step"])
        if resume:   # which step it goes on from, before the slow parts
            where = ckpt or checkpoint.directory(output)
            print(checkpoint.resume_line(self.start if ckpt else None, cfg.run.steps, where),
                  file=sys.stderr, flush=True)
        self.env_cls = env_class(cfg.env.family)
        self.metrics = MetricsLog(output, resume_step=self.start if resume else None,
                                  members=[m.part for m in self.members if m.part],
                                  measures=getattr(self.env_cls, "measures", None))
        (output / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")  # for the viewer
        # every step's messages, action, next state, judge prompt, votes and hints
        self.recorder = Recorder(output / "rollouts.jsonl")
        # R_t and the advantage each trained step got, keyed by (group_id, sample, step)
        self.advantages = Recorder(output / "advantages.jsonl")
        self.judge = make_judge(cfg, self.policy)
        self.hinter = make_hinter(cfg, self.policy)
        self.pool, self.env_factory, self.tasks = make_envs(cfg)
        self.router = role_router(cfg)
        self.eval_tasks = load_tasks(cfg, cfg.eval.tasks) if cfg.eval.tasks else []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()   # the run ends early: no evaluation after the step in training

    def _member(self, name: str, roles: tuple[str, ...], initial: str, ckpt: Path | None, *, part: str) -> Member:
        """A policy and its learner, from ``initial`` or from its ``part`` of checkpoint ``ckpt``."""
        from nextstate.agents.hf_policy import HFPolicy

        saved = ckpt / part if ckpt is not None else None
        source = str(saved / "model") if saved is not None else initial
        try:
            policy = HFPolicy(source, device=self.device, dtype=self.dtype, seed=self.cfg.run.seed,
                              max_new_tokens=self.cfg.rollout.max_response_tokens)
        except OSError as e:
            raise ConfigError(f"cannot load model {source!r}: {str(e).splitlines()[0]}") from None
        reference = None
        if saved is not None and self.cfg.train.kl_coef > 0:   # the KL anchor stays the initial model
            anchor = HFPolicy(initial, device=self.device, dtype=self.dtype, seed=self.cfg.run.seed)
            reference = anchor.model
            asyncio.run(anchor.aclose())
        learner = Learner(policy, self.cfg, reference=reference)
        if saved is not None:
            learner.load_state_dict(checkpoint.load_state(saved))
        return Member(name, roles, policy, learner, part)

    @property
    def policy(self) -> Any:
        """The first policy (the only one without ``agents``): it serves as the ``policy`` judge."""
        return self.members[0].policy

    @property
    def learner(self) -> Learner:
        """The first learner (the only one without ``agents``)."""
        return self.members[0].learner

    def policies(self) -> dict[str, Any]:
        """Role -> the policy that plays it."""
        return {role: m.policy for m in self.members for role in m.roles}

    # -- one step ------------------------------------------------------------------
    async def rollout(self, step: int) -> list[Trajectory]:
        """The episodes of 0-based ``step``: its tasks, ``samples_per_task`` times each."""
        r = self.cfg.rollout
        chosen = [self.tasks[i] for i in tasks_for_step(len(self.tasks), step, r.tasks_per_step, self.cfg.run.seed)]
        return await collect(self.env_factory, self.policies(), chosen,
                             n_samples=r.samples_per_task, parallel=r.parallel, judge=self.judge,
                             router=self.router, chat=chat_config(self.cfg),
                             recorder=self.recorder,
                             sampling={"temperature": r.temperature, "top_p": r.top_p},
                             batch_tag=f"s{step + 1}", progress=self.progress, hinter=self.hinter)

    async def evaluate(self, step: int) -> dict[str, float]:
        """Success of the serving model on the held-out tasks after ``step`` updates (no judge, no
        training); the episodes go to rollouts.jsonl marked ``heldout``."""
        r, e = self.cfg.rollout, self.cfg.eval
        return await heldout(self.env_factory, self.policies(), self.eval_tasks, step=step,
                             n_samples=e.samples_per_task, parallel=r.parallel, router=self.router,
                             chat=chat_config(self.cfg), recorder=self.recorder,
                             sampling={"temperature": e.temperature, "top_p": r.top_p}, env_cls=self.env_cls)

    def eval_due(self, step: int) -> bool:
        """Whether held-out evaluation runs after ``step`` updates."""
        every, total = self.cfg.eval.every, self.cfg.run.steps
        return bool(self.eval_tasks) and (step == total or (every > 0 and step % every == 0))

    def train(self, step: int, trajectories: list[Trajectory]) -> dict[str, Any]:
        """Advantages, one update per policy on the steps of its roles, weights to the serving
        models, held-out evaluation when due (learner thread). A first step whose every judge
        call failed stops the run."""
        if step == self.start and (failed := judge_failed_everywhere(trajectories)):
            raise ConfigError(failed)
        metrics: dict[str, Any] = agent_measures(self.env_cls, self.tasks, trajectories)   # each agent's own, by role
        team = rollout_metrics(trajectories)   # the team's episodes, once
        metrics.update(team)
        samples = 0
        for m in self.members:
            batch = build_batch(trajectories, self.cfg.advantage, weight=self.cfg.judge.weight, role=m.roles,
                                opd=self.cfg.opd, seed=self.cfg.run.seed * 100003 + step)
            for row in batch.step_log:
                self.advantages.record("advantage", {"train_step": step + 1, **row, **m.labels()})
            own = dict(batch.metrics)
            own.update(m.learner.step(batch, progress=self.progress))
            m.learner.publish()
            metrics.update(m.logged(own, team, trajectories))
            samples += own.get("batch/samples", 0)
        metrics["batch/samples"] = samples
        if self.eval_due(step + 1) and self._loop is not None and not self._stopping.is_set():
            # runs on the event loop, with the new weights
            t0 = time.monotonic()
            metrics.update(asyncio.run_coroutine_threadsafe(self.evaluate(step + 1), self._loop).result())
            metrics["time/eval_s"] = time.monotonic() - t0
        if (step + 1) % self.cfg.run.save_every == 0 or step + 1 == self.cfg.run.steps:
            self.save(step + 1)
        return metrics

    def after(self, step: int, metrics: dict[str, Any]) -> None:
        """Throughput, then metrics to every sink."""
        now = time.monotonic()
        wall = now - self._last_done
        self._last_done = now
        metrics.update({"time/step_s": wall, "perf/samples_per_s": metrics.get("batch/samples", 0) / wall,
                        "perf/tokens_per_s": metrics.get("batch/response_tokens", 0) / wall,
                        "perf/episodes_per_s": metrics.get("episodes", 0) / wall})
        self.metrics.log(step + 1, metrics)
        self.bar.update(1)
        self.bar.set_postfix(outcome=f"{metrics.get('outcome/mean', 0):.2f}",
                             kl=f"{metrics.get('train/kl', 0):.3g}")

    def save(self, step: int) -> Path:
        """Checkpoint after ``step`` updates (the next step to run is ``step``)."""
        meta = {"data_position": step * self.cfg.rollout.tasks_per_step, "config": self.cfg.to_dict()}
        parts = {m.part: (m.learner.model, m.policy.tokenizer, m.learner.optimizer.state_dict()) for m in self.members}
        return checkpoint.save(self.output, step, parts=parts, meta=meta, keep=self.cfg.run.keep_checkpoints)

    # -- the run ---------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Train until ``run.steps``; returns the metrics rows of the whole run (``run.steps=0``:
        the held-out evaluation of the starting point alone)."""
        from tqdm.auto import tqdm

        total = self.cfg.run.steps
        self.bar = tqdm(total=total, initial=min(self.start, total), desc="steps", disable=not self.progress)
        self._last_done = time.monotonic()
        try:
            if self.start < total or (self.start == 0 and self.eval_tasks):
                asyncio.run(self._run(total))
        finally:
            self.bar.close()
            self.close()
        return self.metrics.rows

    async def _run(self, total: int) -> None:
        self._loop = asyncio.get_running_loop()
        if self.start == 0 and self.eval_tasks:   # the starting point, logged as step 0
            t0 = time.monotonic()
            self.metrics.log(0, {**await self.evaluate(0), "time/eval_s": time.monotonic() - t0})
            self._last_done = time.monotonic()
        await overlapped_loop(self.start, total, self.cfg.train.max_staleness, self.rollout, self.train,
                              self.after, self._stopping)

    def close(self) -> None:
        """Release sandboxes, threads and log files."""
        self.metrics.close()
        self.recorder.close()
        self.advantages.close()
        self.env_factory.close()
        if self.pool is not None:
            self.pool.close()
        for m in self.members:
            asyncio.run(m.policy.aclose())
