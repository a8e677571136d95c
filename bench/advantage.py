"""Benchmark: step-index group normalization over many step rows, vectorized vs a Python loop.

``python -m bench.advantage [--rows N] [--json]``. The workload looks like a
big batch: groups of 8 samples, episodes of 1..10 steps (so later step
buckets are smaller), outcomes in {0, 1}, judge vote means in {0, .5, 1} or
missing. Both implementations run in the same process on the same rows and
must agree; the figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from bench import report as show
from nextstate.train.advantage import EPS, StepRows, compute_advantages


def make_rows(n: int, seed: int = 0, samples: int = 8, max_steps: int = 10) -> StepRows:
    """About ``n`` step rows: episodes of random length in groups of ``samples``."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_steps + 1, size=n // ((max_steps + 1) // 2) + samples)
    ends = np.cumsum(lengths)
    lengths = lengths[: int(np.searchsorted(ends, n)) + 1]
    episode = np.repeat(np.arange(len(lengths)), lengths)[:n]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    step = np.arange(len(episode)) - starts[episode]
    outcome = rng.integers(0, 2, size=len(lengths)).astype(float)[episode]
    votes = rng.choice([np.nan, 0.0, 0.5, 1.0], size=len(episode))
    return StepRows(group=episode // samples, step=step, outcome=outcome, vote_mean=votes)


def python_loop(rows: StepRows, c: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The straightforward version: a dict of buckets, then a loop over them."""
    buckets: dict[tuple, list[int]] = defaultdict(list)
    rewards = []
    for i, (g, s, o, v) in enumerate(zip(rows.group.tolist(), rows.step.tolist(), rows.outcome.tolist(),
                                         rows.vote_mean.tolist())):
        buckets[(g, s)].append(i)
        rewards.append(o + (0.0 if v != v else c * v))
    adv = [0.0] * len(rewards)
    keep = [True] * len(rewards)
    for members in buckets.values():
        vals = [rewards[i] for i in members]
        if len(vals) == 1:
            adv[members[0]] = vals[0]
            continue
        if min(vals) == max(vals):
            for i in members:
                keep[i] = False
            continue
        mean = sum(vals) / len(vals)
        std = (sum((x - mean) ** 2 for x in vals) / len(vals)) ** 0.5
        for i, x in zip(members, vals):
            adv[i] = (x - mean) / (std + EPS)
    return np.array(adv), np.array(keep)


def best_of(fn, repeat: int) -> float:
    """Fastest wall time of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    rows = make_rows(args.rows)
    result = compute_advantages(rows)
    loop_adv, loop_keep = python_loop(rows)
    agree = bool(np.allclose(result.advantages, loop_adv, rtol=1e-9, atol=1e-12)
                 and (result.keep == loop_keep).all())
    vec_s = best_of(lambda: compute_advantages(rows), args.repeat)
    loop_s = best_of(lambda: python_loop(rows), 1)
    report = {"rows": len(rows), "buckets": result.buckets, "constant_buckets": result.constant_buckets,
              "vectorized_s": round(vec_s, 4), "python_loop_s": round(loop_s, 4),
              "speedup": round(loop_s / vec_s, 1), "same_result": agree,
              "goal": "vectorized < 1 s and >= 20x the loop"}
    show(report, args.json)


if __name__ == "__main__":
    main()
