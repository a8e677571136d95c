"""Benchmark: wall time of N training steps with rollout/training overlap on (staleness 1) vs off (0).

``python -m bench.overlap [--load synthetic|tiny] [--steps N] [--json]``. Both
loads go through the local backend's own scheduler
(:func:`train.local.overlapped_loop`), so what is timed is how it overlaps:

* ``synthetic`` (default) -- a balanced load: each rollout waits ``--seconds``
  (``asyncio.sleep``: generation on a GPU server and sandbox I/O, which leave
  the trainer's CPU free) and each update holds the learner thread as long
  (``time.sleep``: a GPU update). Ideal speed-up ``2N / (N + 1)``.
* ``tiny`` -- real pieces on the CPU: each rollout is ``train.rollout.collect``
  of toolcall episodes (local sandboxes) with a scripted policy whose replies
  take a fixed delay (the server's latency), each update the learner's real
  PPO step on the ``tiny`` model; the delay is calibrated so that a rollout
  lasts about one update (a balanced load).

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any, Callable

from bench import report as show
from nextstate.train.local import overlapped_loop


def timed(steps: int, staleness: int, rollout: Callable[[int], Any], train: Callable[[int, Any], dict]) -> float:
    """Wall seconds of ``steps`` steps through the local backend's scheduler."""
    t = time.perf_counter()
    asyncio.run(overlapped_loop(0, steps, staleness, rollout, train, lambda s, m: None))
    return time.perf_counter() - t


def synthetic(seconds: float) -> tuple[Callable, Callable, dict, Callable[[], None]]:
    async def rollout(step: int) -> list:
        await asyncio.sleep(seconds)
        return []

    def train(step: int, trajectories: list) -> dict:
        time.sleep(seconds)
        return {}

    return rollout, train, {"rollout_s": seconds, "train_s": seconds}, lambda: None


def tiny(episodes: int) -> tuple[Callable, Callable, dict, Callable[[], None]]:
    from nextstate.agents.hf_policy import HFPolicy
    from nextstate.train.rollout import collect
    from nextstate.agents.testing import ScriptedPolicy
    from nextstate.train.batch import build_batch
    from nextstate.train.config import load_config
    from nextstate.train.learner import Learner
    from nextstate.train.wiring import make_envs

    cfg = load_config("toolcall", cpu_demo=True, overrides=[
        "env.sandbox_backend=local", f"rollout.parallel={episodes}", "advantage.drop_constant=false",
        f"train.micro_batch_size={episodes}"])
    pool, factory, tasks = make_envs(cfg)
    learner = Learner(HFPolicy("tiny"), cfg)
    answer = '<tool_call>{"name": "answer", "arguments": {"answer": "\\\\boxed{0}"}}</tool_call>'
    policy = ScriptedPolicy([answer])

    async def rollout(step: int) -> list:
        return await collect(factory, policy, tasks[:episodes], n_samples=1, parallel=episodes, progress=False)

    def train(step: int, trajectories: list) -> dict:
        batch = build_batch(trajectories, cfg.advantage, weight=1.0, role="agent")
        metrics = learner.step(batch, progress=False)
        learner.publish()
        return metrics

    trajs = asyncio.run(rollout(0))            # warm up, then calibrate: a rollout lasts one update
    t = time.perf_counter()
    train(0, trajs)
    policy.delay = time.perf_counter() - t
    t = time.perf_counter()
    asyncio.run(rollout(0))
    info = {"rollout_s": round(time.perf_counter() - t, 3), "train_s": round(policy.delay, 3)}
    return rollout, train, info, pool.close


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", choices=["synthetic", "tiny"], default="synthetic")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=0.5, help="synthetic: rollout and update time")
    ap.add_argument("--episodes", type=int, default=4, help="tiny: episodes per rollout")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    rollout, train, load, close = synthetic(args.seconds) if args.load == "synthetic" else tiny(args.episodes)
    try:
        off = timed(args.steps, 0, rollout, train)
        on = timed(args.steps, 1, rollout, train)
    finally:
        close()
    report = {"load": args.load, "steps": args.steps, **load, "overlap_off_s": round(off, 3),
              "overlap_on_s": round(on, 3), "speedup": round(off / on, 2),
              "ideal": round(2 * args.steps / (args.steps + 1), 2), "goal": ">= 1.6x on a balanced load"}
    show(report, args.json)


if __name__ == "__main__":
    main()
