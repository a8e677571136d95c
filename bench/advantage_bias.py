"""Benchmark: does an advantage key put a hidden bonus on "take another step"? (veRL RFC #7244)

``python -m bench.advantage_bias [--groups G] [--samples N] [--max-steps T] [--stop P] [--json]``
simulates rewards over synthetic episodes where the right answer is known and runs every
registered advantage key of :mod:`train.advantage` (the real functions) on them:

* a "policy" with one parameter, the logit of stopping: after each step it stops with
  probability ``P`` (the episode also ends at ``T`` steps), so the length ``L`` is the
  policy's choice; groups of ``N`` episodes of one task, as the trainer samples them;
* the outcome is 1 with probability 0.5, independent of ``L``; each step's vote mean is
  +1 with probability ``q`` else -1, independent of everything (two scenarios: votes mostly
  +1, ``q = 0.9``, and mostly -1, ``q = 0.1``).

Nothing here depends on when the policy stops, so an unbiased estimator's gradient on the stop
logit is 0. Per key it prints ``stop_gradient`` (the mean over episodes of
``sum_t A_t * d log pi(a_t) / d logit``, with its 95% interval) and ``extra_step_bonus``
(``E[sum_t A_t | L = l + 1] - E[sum_t A_t | L = l]`` for ``l = 1 .. T-1``: what one more step
adds to an episode's summed advantage, the RFC's "aggregated" view), each beside its closed
form where ``docs/learning.md`` derives one (``null`` where it does not). The reference row
``step_index_to_go`` sums the ``step_index`` advantages to go (``A'_t = sum_{u >= t} A_u``),
the aggregated construction the RFC warns about; no advantage key does that. Figures are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import numpy as np

from bench import report as show
from nextstate.train.advantage import StepRows, advantage_keys, compute_advantages

SUCCESS = 0.5
SCENARIOS = {"votes_mostly_+1": 0.9, "votes_mostly_-1": 0.1}
TO_GO = "step_index_to_go"


def episodes(rng: np.random.Generator, groups: int, samples: int, max_steps: int, stop: float,
             q: float) -> tuple[StepRows, np.ndarray, np.ndarray]:
    """Step rows of ``groups * samples`` simulated episodes, each step's score
    ``d log pi(a_t) / d logit(stop) = stop_t - P`` and each row's episode id."""
    n = groups * samples
    stops = rng.random((n, max_steps)) < stop
    lengths = np.where(stops.any(1), stops.argmax(1) + 1, max_steps)
    episode = np.repeat(np.arange(n), lengths)
    step = np.arange(len(episode)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    votes = np.where(rng.random(len(episode)) < q, 1.0, -1.0)
    outcome = (rng.random(n) < SUCCESS).astype(np.float64)
    history = np.zeros(len(episode), dtype=np.int64)   # the state a step saw: its index and the votes before it
    for t in range(1, max_steps):
        at = np.flatnonzero(step == t)
        history[at] = history[at - 1] * 2 + (votes[at - 1] > 0)
    rows = StepRows(group=episode // samples, step=step, outcome=outcome[episode], vote_mean=votes,
                    state=(history << 8) + step, episode=episode)
    return rows, stops[episode, step].astype(np.float64) - stop, episode


def to_go(adv: np.ndarray, episode: np.ndarray) -> np.ndarray:
    """``sum_{u >= t} A_u`` inside each episode (rows of an episode are contiguous, in step order)."""
    total = np.bincount(episode, weights=adv)
    before = np.cumsum(adv) - np.repeat(np.cumsum(total) - total, np.bincount(episode))
    return total[episode] - before + adv


def closed_forms(key: str, samples: int, max_steps: int, stop: float, q: float, c: float) -> dict[str, Any]:
    """``docs/learning.md``'s closed forms: ``step_index`` and ``trajectory`` have none of the
    bias in their gradient; ``step_index``'s summed bonus is its one-member buckets' raw reward,
    ``(E[o] + c E[v]) * F(l)^(N-1)`` with ``F(l) = P(L <= l)``."""
    mean_reward = SUCCESS + c * (2 * q - 1)
    below = [1 - (1 - stop) ** t for t in range(max_steps)]          # F(t) = P(L <= t), t < T
    alone = [f ** (samples - 1) for f in below]
    if key in ("step_index", "trajectory"):
        bonus = [round(mean_reward * alone[l], 4) if key == "step_index" else 0.0 for l in range(1, max_steps)]
        return {"stop_gradient": 0.0, "extra_step_bonus": bonus}
    if key == TO_GO:
        grad = -stop * mean_reward * sum(t * (1 - stop) ** t * alone[t] for t in range(max_steps))
        return {"stop_gradient": round(grad, 4),
                "extra_step_bonus": [round(mean_reward * (l + 1) * alone[l], 4) for l in range(1, max_steps)]}
    return {"stop_gradient": None, "extra_step_bonus": None}


def measure(adv: np.ndarray, score: np.ndarray, episode: np.ndarray, max_steps: int) -> dict[str, Any]:
    """Stop-logit gradient per episode (mean, 95% interval) and the summed-advantage step bonus."""
    grad = np.bincount(episode, weights=adv * score)
    total = np.bincount(episode, weights=adv)
    length = np.bincount(episode)
    half = 1.96 * grad.std(ddof=1) / math.sqrt(len(grad))
    by_length = [total[length == l].mean() if (length == l).any() else math.nan for l in range(1, max_steps + 1)]
    return {"stop_gradient": round(float(grad.mean()), 4),
            "stop_gradient_ci95": [round(float(grad.mean() - half), 4), round(float(grad.mean() + half), 4)],
            "extra_step_bonus": [round(float(b - a), 4) for a, b in zip(by_length, by_length[1:])]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.advantage_bias", description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=100000, help="task groups per scenario (default 100000)")
    p.add_argument("--samples", type=int, default=4, help="episodes per group (default 4, the CPU demo's)")
    p.add_argument("--max-steps", type=int, default=4, help="step limit T (default 4, outdir's)")
    p.add_argument("--stop", type=float, default=0.35, help="probability of stopping after a step (default 0.35)")
    p.add_argument("--c", type=float, default=1.0, help="judge weight c in R_t = o + c * vote mean")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    scenarios = {}
    for name, q in SCENARIOS.items():
        rows, score, episode = episodes(rng, args.groups, args.samples, args.max_steps, args.stop, q)
        out = {}
        for key in [*advantage_keys(), TO_GO]:
            adv = compute_advantages(rows, "step_index" if key == TO_GO else key, c=args.c).advantages
            adv = to_go(adv, episode) if key == TO_GO else adv
            closed = closed_forms(key, args.samples, args.max_steps, args.stop, q, args.c)
            out[key] = {**measure(adv, score, episode, args.max_steps),
                        **{f"{k}_closed_form": v for k, v in closed.items()}}
        scenarios[name] = {"vote_plus_probability": q, "estimators": out}
    show({"scenarios": scenarios, "groups": args.groups, "samples": args.samples, "max_steps": args.max_steps,
          "stop": args.stop, "success": SUCCESS, "c": args.c, "seed": args.seed}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
