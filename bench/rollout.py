"""Rollout throughput of a local policy with batched generation, at 1, 8, 32 and 128 episodes at once.

``python -m bench.rollout --json`` prints one JSON object. Real terminal
episodes run through the agent loop (:func:`train.rollout.collect`) on the
Docker sandbox pool, wired as ``python -m train`` wires them
(:func:`train.wiring.make_envs`, :func:`train.wiring.make_judge`): a
local model (``--model``, default ``tiny``) acts on CPU, and the same local
policy judges every step (``judge.mode=policy``, the default judge timeout).
Each level runs ``max(level, --min-episodes)`` episodes of at most
``--max-steps`` steps with short generations, one level after another in one
run. Tasks in the family image lease from one warm pool; the shipped tasks
have images of their own, and each episode starts its sandbox (as in training).

- ``samples_per_s``: training samples (agent steps with token ids) per second
  of wall time, keyed by concurrent episodes ("1", "8", "32", "128");
- ``speedup_128``: samples/s at 128 over samples/s at 1;
- ``judge_timeouts_128``: judge calls that timed out at 128 (goal: 0);
- per level: episodes, samples, wall time, judge calls / timeouts / errors,
  mean seconds per step generating, in the env and judging (``step_s``; waits
  in the batcher's queue included), the batching seen (batches, mean requests
  per batch), and the prompt tokens
  prefilled vs reused from earlier sequences' KV caches (:class:`agents.batching.PrefixCache`);
- per level, ``cpu``: how busy the machine's cores were (``busy``, 1.0 = every core all
  the time) and the CPU seconds per sample spent in this process (the model, the judge,
  the agent loop) and everywhere else (``rest``: dockerd, containerd, the sandboxes'
  own processes, and whatever else shares the machine) and, where the engine's containers
  share a parent cgroup, ``rest_in_containers_s_per_sample``: the part of ``rest`` spent inside
  containers (the agent's commands, the tasks' own tests, the shells), so what is left of
  ``rest`` is the engine and the machine's other work; ``cpu_ceiling_samples_per_s``:
  the cores over the top level's CPU seconds per sample, the most this machine could
  reach on this workload at any concurrency;
- ``generation``: the model alone on the agent requests the top level made (same prompts,
  prefix cache emptied first), sent one at a time and then all at once: requests/s and
  ``speedup`` (what batched generation buys, without the environments);
- ``load_avg``: the machine's 1-minute load average before and after (these
  machines are shared: read the figures with it).

``--resets replace verified`` runs the levels once per pool reset (``env.sandbox_reset``:
a fresh sandbox per episode, or the same one after a verified reset), one after the other in
the same run; the figures above then sit under ``by_reset``, keyed by the reset, with each
reset's sandboxes ``reused`` and ``discarded`` (over every pool the run made). ``--image-pools
per-env shared`` runs each reset once per kind of per-image pools (``env.image_pools``: each env's
own, or shared by all the envs of the run); the keys are then ``<reset>/<pools>``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
from dataclasses import replace
from itertools import cycle, islice
from typing import Any

import torch

from nextstate.agents.hf_policy import HFPolicy
from bench import busy_cpu_s, containers_cpu_s, report
from bench.judge import settle
from nextstate.containers.pool import SandboxPool
from nextstate.train.batch import trainable
from nextstate.train.config import load_config
from nextstate.train.rollout import collect, single_role
from nextstate.train.wiring import chat_config, make_envs, make_judge


def cpu_figures(machine: float | None, own: float, wall: float, samples: int,
                sandboxes: float | None = None) -> dict[str, Any]:
    """How busy the cores were and where the CPU went, per sample: this process, and the rest
    (``sandboxes``: the part of it spent inside containers, where known)."""
    per = max(1, samples)
    if machine is None:
        return {"this_process_s_per_sample": round(own / per, 4)}
    figures = {"busy": round(machine / (wall * (os.cpu_count() or 1)), 2),
               "s_per_sample": {"this_process": round(own / per, 4),
                                "rest": round(max(0.0, machine - own) / per, 4)}}
    if sandboxes is not None:
        figures["rest_in_containers_s_per_sample"] = round(sandboxes / per, 4)
    return figures


async def replay(policy: HFPolicy, requests: list[tuple], concurrency: int) -> float:
    """Requests per second of the model alone on ``requests``, ``concurrency`` at a time."""
    policy.prefixes.clear()
    gate = asyncio.Semaphore(concurrency)

    async def one(messages: list[dict], tools: Any, sampling: dict[str, Any]) -> None:
        async with gate:
            await policy.generate(messages, tools, **sampling)

    start = time.monotonic()
    await asyncio.gather(*(one(*r) for r in requests))
    return len(requests) / (time.monotonic() - start)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    levels = sorted(args.levels)
    cfg = load_config("terminal", overrides=[
        f"model.name={args.model}", "judge.mode=policy", f"judge.votes={args.votes}",
        f"judge.max_tokens={args.judge_tokens}", f"env.max_steps={args.max_steps}",
        f"rollout.max_response_tokens={args.max_new_tokens}", f"rollout.parallel={levels[-1]}",
        *args.overrides])
    policy = HFPolicy(args.model, seed=cfg.run.seed, max_new_tokens=args.max_new_tokens)
    judge = make_judge(cfg, policy)
    role = cfg.train.role
    chat = chat_config(cfg)
    load_before = os.getloadavg()[0]
    recorded: list[tuple] = []
    generate = policy.generate

    async def recording(messages: list[dict], tools: Any = None, **sampling: Any) -> Any:
        if record:
            recorded.append((messages, tools, sampling))
        return await generate(messages, tools, **sampling)

    policy.generate = recording  # type: ignore[method-assign]
    record = False

    async def levels_run(cfg: Any, levels: list[int], last: bool) -> dict[str, dict[str, Any]]:
        """Every level on envs made for ``cfg`` (recording the top level's requests when ``last``)."""
        nonlocal record
        pool, factory, tasks = make_envs(cfg, pool_size=levels[-1])
        per_level: dict[str, dict[str, Any]] = {}
        try:
            for level in levels:
                if pool is not None:  # every level starts from a warm pool, the previous level's containers gone
                    settle(pool)
                chosen = list(islice(cycle(tasks), max(level, args.min_episodes)))
                batches, items = policy.batcher.batches, policy.batcher.items
                prefilled, reused = policy.prefixes.prefilled_tokens, policy.prefixes.reused_tokens
                record = last and level == levels[-1]
                machine0, own0, boxes0 = busy_cpu_s(), time.process_time(), containers_cpu_s()
                start = time.monotonic()
                trajs = await collect(factory, {role: policy}, chosen, n_samples=1, parallel=level, judge=judge,
                                      router=single_role(role), chat=chat, progress=False,
                                      sampling={"temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p})
                wall = time.monotonic() - start
                machine1, own, boxes1 = busy_cpu_s(), time.process_time() - own0, containers_cpu_s()
                steps = [s for t in trajs for s in t.steps]
                samples = sum(trainable(s, role) for s in steps)
                errors = [s.judge_error for s in steps if s.judge_error]
                n_batches = policy.batcher.batches - batches
                per_level[str(level)] = {
                    "episodes": len(trajs), "aborted": sum(t.status == "aborted" for t in trajs),
                    "samples": samples, "wall_s": round(wall, 2),
                    "judge_calls": sum(bool(s.votes) or s.judge_error is not None for s in steps),
                    "judge_timeouts": sum("Timeout" in e for e in errors), "judge_errors": len(errors),
                    "batches": n_batches,
                    "requests_per_batch": round((policy.batcher.items - items) / max(1, n_batches), 2),
                    "step_s": {k: round(statistics.fmean(s.timing[k] for s in steps if k in s.timing), 3)
                               for k in ("generate", "env", "judge") if any(k in s.timing for s in steps)},
                    "prefilled_tokens": policy.prefixes.prefilled_tokens - prefilled,
                    "reused_tokens": policy.prefixes.reused_tokens - reused,
                    "cpu": cpu_figures(None if machine0 is None or machine1 is None else machine1 - machine0,
                                       own, wall, samples,
                                       None if boxes0 is None or boxes1 is None else boxes1 - boxes0),
                }
        finally:
            factory.close()
            if pool is not None:
                pool.close()
        return per_level

    by_reset: dict[str, dict[str, dict[str, Any]]] = {}
    reuse: dict[str, dict[str, int]] = {}
    generation = None
    try:
        runs = [(reset, pools) for pools in args.image_pools for reset in args.resets]
        for reset, pools in runs:
            key = reset if len(args.image_pools) == 1 else f"{reset}/{pools}"
            before = dict(SandboxPool.all_resets)
            env = replace(cfg.env, sandbox_reset=reset, image_pools=pools)
            by_reset[key] = await levels_run(replace(cfg, env=env), levels, (reset, pools) == runs[-1])
            reuse[key] = {"reused": SandboxPool.all_resets["verified"] - before.get("verified", 0),
                          "discarded": SandboxPool.all_resets["discarded"] - before.get("discarded", 0)}
        record, alone = False, recorded[:args.replay]
        if alone:   # none when every episode of the top level aborted before acting
            one_at_a_time = await replay(policy, alone[:max(1, len(alone) // 8)], 1)
            all_at_once = await replay(policy, alone, levels[-1])
            generation = {"requests": len(alone), "requests_per_s": {
                "1": round(one_at_a_time, 2), str(levels[-1]): round(all_at_once, 2)},
                "speedup": round(all_at_once / one_at_a_time, 2)}
    finally:
        await policy.aclose()
    figures = {reset: level_figures(per_level, levels) for reset, per_level in by_reset.items()}
    for reset in figures:
        figures[reset]["sandboxes"] = reuse[reset]
    common = {
        "generation": generation,
        "judge_timeout_s": judge.timeout, "judge_votes": args.votes, "judge_max_tokens": args.judge_tokens,
        "model": args.model, "overrides": args.overrides, "max_steps": args.max_steps, "max_new_tokens": args.max_new_tokens,
        "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    if len(figures) == 1:
        return {**next(iter(figures.values())), **common}
    return {"by_reset": figures, **common}


def level_figures(per_level: dict[str, dict[str, Any]], levels: list[int]) -> dict[str, Any]:
    """Samples/s per level, the speedup and judge timeouts at the top level, the CPU ceiling, the levels."""
    rate = {k: round(v["samples"] / v["wall_s"], 3) for k, v in per_level.items()}
    top, bottom = str(levels[-1]), str(levels[0])
    top_cpu = per_level[top]["cpu"].get("s_per_sample")
    return {
        "samples_per_s": rate,
        f"speedup_{top}": round(rate[top] / rate[bottom], 2) if rate[bottom] else None,
        f"judge_timeouts_{top}": per_level[top]["judge_timeouts"],
        "cpu_ceiling_samples_per_s": round((os.cpu_count() or 1) / sum(top_cpu.values()), 2) if top_cpu else None,
        "levels": per_level,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32, 128],
                    help="concurrent episodes to measure (the first is the speedup's baseline)")
    ap.add_argument("--min-episodes", type=int, default=4, help="episodes per level at least")
    ap.add_argument("--max-steps", type=int, default=3, help="agent steps per episode at most")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens per agent generation")
    ap.add_argument("--judge-tokens", type=int, default=32, help="tokens per judge answer")
    ap.add_argument("--votes", type=int, default=1, help="judge votes per step (one request, n=m)")
    ap.add_argument("--replay", type=int, default=256,
                    help="agent requests of the top level replayed to the model alone (an eighth of them one at a time)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--model", default="tiny", help="local model (a preset, a path or a hub name) acting and judging")
    ap.add_argument("--resets", nargs="+", default=["replace"], choices=["replace", "verified"],
                    help="pool resets to run the levels with, one after the other (env.sandbox_reset)")
    ap.add_argument("--image-pools", nargs="+", default=["shared"], choices=["shared", "per-env"],
                    help="per-image pools shared by the factory's envs, or each env's own (env.image_pools); "
                         "with several, every reset runs once with each")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("overrides", nargs="*", help="config overrides (KEY=VALUE, as for python -m train), "
                    "e.g. env.sandbox_disk=null")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    report(asyncio.run(run(args)), args.json)


if __name__ == "__main__":
    main()
