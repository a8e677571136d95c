"""Step rewards and group-normalized advantages: the paper's general-agent recipe.

Every agent step is one training sample. Its reward mixes the episode outcome
with the judge's verdict on that step::

    R_t = o + c * mean(valid votes at step t)      (o alone when no vote was valid)

Advantages are normalized inside *buckets* of comparable samples. The default
bucket is ``(task group, step index)``: the t-th steps of the n rollouts of one
task are compared with each other, so a good step 3 is measured against the
other step-3s, not against step 0s whose context was much shorter::

    A = (R - mean_bucket(R)) / (std_bucket(R) + eps)     population std

A bucket with one member keeps its raw reward (there is nothing to compare it
with). A bucket whose rewards are all equal carries no learning signal: its
samples are dropped from the batch, or kept with advantage 0 when
``drop_constant=False``.

The key is pluggable: a grouping (:func:`register_grouping`) names the buckets and rewards of
one bucket normalization; an estimator (:func:`register_estimator`) computes the advantages
itself. A key can be registered once (a second registration raises ValueError).

* ``step_index`` (default): bucket = (group, step index), reward = R_t.
* ``outcome``: outcome-only GRPO; bucket = group, reward = o.
* ``state``: identical-state groups in the spirit of GiGPO; bucket =
  (group, hash of the observation before the step), reward = R_t.
* ``trajectory`` (estimator): ``A_t = A_o + c * (v_t - mean of the episode's valid votes)``,
  ``A_o`` the outcome normalized over the group's episodes (one value per episode, the rules
  above for one-member and constant groups); a step is dropped when its ``A_o`` bucket is
  constant and its vote term is 0. The vote terms of an episode sum to 0, so the number of
  steps adds no credit. Needs ``StepRows.episode``.

Length (veRL RFC #7244, ``docs/learning.md``): with per-step-index buckets, bucket t only
holds the episodes that lasted at least t+1 steps. Here each step's advantage multiplies only
that step's own log-prob, and bucket t's members and statistics do not depend on the action
taken at step t, so when rewards do not depend on the actions the stop decision gets no
hidden bonus. What does depend on length is an episode's *summed* advantage: a one-member
bucket keeps its raw reward, ``(E[o] + c E[v]) * P(all others stopped)`` per extra step; it
turns into a gradient bias only when advantages are summed over the steps to go, which no
key here does (``python -m bench.advantage_bias`` measures both).

On-Policy Distillation (``opd.mode`` ``opd`` or ``combine``) adds a per-token term on the
steps that have a hindsight hint; both backends take it from here (:func:`rl_weight`,
:func:`trained_rows`, :func:`token_advantages`)::

    A_t = w_opd * (log pi_teacher(a_t | s + hint) - log pi_old(a_t | s)) + w_rl * A

A step without a hint keeps ``w_rl * A``; in mode ``opd`` ``w_rl`` is 0, so only hinted
steps train.

Everything here is vectorized over numpy arrays: bucket ids from integer
arithmetic (``np.unique`` only for non-integer keys), then a few
``np.bincount`` / ``ufunc.at`` reductions, whatever the bucket count.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

EPS = 1e-6


@dataclass
class StepRows:
    """One row per agent step of a batch, as parallel arrays of equal length.

    Attributes:
        group: task group of the episode (the n samples of one task share it).
        step: 0-based step index inside its episode.
        outcome: episode outcome ``o``, repeated on each of its steps.
        vote_mean: mean of the step's valid judge votes; NaN when none was valid.
        state: hash of the observation before the step (``state`` grouping only).
        role: which policy took the step; buckets never mix roles.
        episode: id of the step's episode (``trajectory`` estimator only).
    """

    group: np.ndarray
    step: np.ndarray
    outcome: np.ndarray
    vote_mean: np.ndarray
    state: np.ndarray | None = None
    role: np.ndarray | None = None
    episode: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.group = np.asarray(self.group)
        self.step = np.asarray(self.step, dtype=np.int64)
        self.outcome = np.asarray(self.outcome, dtype=np.float64)
        self.vote_mean = np.asarray(self.vote_mean, dtype=np.float64)
        n = len(self.group)
        for name in ("step", "outcome", "vote_mean", "state", "role", "episode"):
            col = getattr(self, name)
            if col is not None and len(col) != n:
                raise ValueError(f"StepRows.{name} has {len(col)} rows, group has {n}")

    def __len__(self) -> int:
        return len(self.group)


@dataclass
class Advantages:
    """Result of :func:`compute_advantages`, aligned with the input rows.

    ``keep`` is False for rows dropped as members of a constant bucket; their
    advantage is 0. Counts are over buckets of the chosen grouping key.
    """

    advantages: np.ndarray
    rewards: np.ndarray
    keep: np.ndarray
    buckets: int
    singleton_buckets: int
    constant_buckets: int

    @property
    def dropped(self) -> int:
        """Rows removed from the batch."""
        return int((~self.keep).sum())

    def summary(self) -> dict[str, float]:
        """What both backends log of one batch: bucket and drop counts, the mean step reward,
        and the mean and std of the kept advantages (0 where there are none)."""
        kept = self.advantages[self.keep] if len(self.keep) else np.zeros(0)
        return {"dropped_samples": self.dropped, "dropped_buckets": self.constant_buckets,
                "buckets": self.buckets, "singleton_buckets": self.singleton_buckets,
                "reward_mean": float(self.rewards.mean()) if len(self.rewards) else 0.0,
                "advantage_mean": float(kept.mean()) if len(kept) else 0.0,
                "advantage_std": float(kept.std()) if len(kept) else 0.0}


def step_rewards(outcome: np.ndarray, vote_mean: np.ndarray, c: float = 1.0) -> np.ndarray:
    """``R_t = o + c * vote_mean`` where a NaN vote mean (no valid vote) adds nothing."""
    votes = np.asarray(vote_mean, dtype=np.float64)
    return np.asarray(outcome, dtype=np.float64) + c * np.where(np.isnan(votes), 0.0, votes)


def _dense(col: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes 0..k-1 of ``col`` and k (a sort: the slow path)."""
    _, inv = np.unique(col, return_inverse=True)
    inv = inv.reshape(-1).astype(np.int64)
    return inv, int(inv.max(initial=-1)) + 1


def _column_codes(col: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes of one key column: integer columns of small range are offset, not sorted."""
    col = np.asarray(col)
    if col.dtype.kind in "iub" and len(col):
        lo, hi = int(col.min()), int(col.max())
        if hi - lo < 4 * len(col) + 16:
            return (col.astype(np.int64) - lo), hi - lo + 1
    return _dense(col)


def bucket_codes(*columns: np.ndarray) -> np.ndarray:
    """Int64 bucket ids of the row-wise tuples of ``columns``.

    Ids are below ``4 * rows + 16`` but need not be contiguous (the mixed-radix
    id of small integer columns is used as is; large or non-integer columns
    are factorized with ``np.unique``).
    """
    n = len(columns[0])
    codes, span = np.zeros(n, dtype=np.int64), 1
    for col in columns:
        c, k = _column_codes(col)
        if span * k > 4 * n + 16:
            codes, span = _dense(codes)
        codes, span = codes * k + c, span * k
    if span > 4 * n + 16:
        codes, span = _dense(codes)
    return codes


def bucket_normalize(codes: np.ndarray, values: np.ndarray, *, eps: float = EPS,
                     drop_constant: bool = True) -> Advantages:
    """Normalize ``values`` inside the buckets given by non-negative int ``codes``.

    Counts, sums and squared deviations per bucket come from ``np.bincount``
    (two passes, so the variance does not lose precision); a bucket is
    constant when its min equals its max (exact, no tolerance). One-member
    buckets keep their raw value.
    """
    values = np.asarray(values, dtype=np.float64)
    codes = np.asarray(codes, dtype=np.int64)
    k = int(codes.max(initial=-1)) + 1
    count = np.bincount(codes, minlength=k).astype(np.float64)
    mean = np.bincount(codes, weights=values, minlength=k) / np.maximum(count, 1)
    dev = values - mean[codes]
    std = np.sqrt(np.bincount(codes, weights=dev * dev, minlength=k) / np.maximum(count, 1))
    lo, hi = np.full(k, np.inf), np.full(k, -np.inf)
    np.minimum.at(lo, codes, values)
    np.maximum.at(hi, codes, values)
    used = count > 0
    single = count == 1
    constant = used & ~single & (lo == hi)

    adv = np.where(single[codes], values, dev / (std[codes] + eps))
    adv = np.where(constant[codes], 0.0, adv)
    keep = ~constant[codes] if drop_constant else np.ones(len(codes), dtype=bool)
    return Advantages(advantages=adv, rewards=values, keep=keep, buckets=int(used.sum()),
                      singleton_buckets=int(single.sum()), constant_buckets=int(constant.sum()))


Grouping = Callable[[StepRows, float], tuple[np.ndarray, np.ndarray]]
GROUPINGS: dict[str, Grouping] = {}
Estimator = Callable[..., Advantages]
ESTIMATORS: dict[str, Estimator] = {}


def _check_new(name: str) -> None:
    """Raise when ``name`` is already an advantage key (a grouping or an estimator)."""
    if name in GROUPINGS or name in ESTIMATORS:
        raise ValueError(f"advantage key {name!r} is already registered")


def register_grouping(name: str) -> Callable[[Grouping], Grouping]:
    """Register ``fn(rows, c) -> (bucket codes, rewards)`` as grouping key ``name``
    (ValueError when the key is taken)."""
    def deco(fn: Grouping) -> Grouping:
        _check_new(name)
        GROUPINGS[name] = fn
        return fn
    return deco


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Register ``fn(rows, c=, eps=, drop_constant=) -> Advantages`` as advantage key ``name``: an
    estimator that is not one bucket normalization (ValueError when the key is taken)."""
    def deco(fn: Estimator) -> Estimator:
        _check_new(name)
        ESTIMATORS[name] = fn
        return fn
    return deco


def advantage_keys() -> list[str]:
    """Every registered advantage key (``advantage.key``), groupings and estimators."""
    return sorted([*GROUPINGS, *ESTIMATORS])


def _role(rows: StepRows) -> np.ndarray:
    return rows.role if rows.role is not None else np.zeros(len(rows), dtype=np.int64)


@register_grouping("step_index")
def _by_step_index(rows: StepRows, c: float) -> tuple[np.ndarray, np.ndarray]:
    return bucket_codes(_role(rows), rows.group, rows.step), step_rewards(rows.outcome, rows.vote_mean, c)


@register_grouping("outcome")
def _by_outcome(rows: StepRows, c: float) -> tuple[np.ndarray, np.ndarray]:
    return bucket_codes(_role(rows), rows.group), rows.outcome.astype(np.float64)


@register_grouping("state")
def _by_state(rows: StepRows, c: float) -> tuple[np.ndarray, np.ndarray]:
    if rows.state is None:
        raise ValueError("the 'state' grouping needs StepRows.state (observation hashes)")
    return bucket_codes(_role(rows), rows.group, rows.state), step_rewards(rows.outcome, rows.vote_mean, c)


@register_estimator("trajectory")
def _by_trajectory(rows: StepRows, c: float, *, eps: float = EPS, drop_constant: bool = True) -> Advantages:
    """``A_t = A_o + c * (v_t - mean of the episode's valid votes)``: ``A_o`` normalizes the
    outcome over the episodes of a (role, group), one value per episode; the process term
    sums to 0 over each episode, so the number of steps adds no credit (module doc)."""
    if rows.episode is None:
        raise ValueError("the 'trajectory' estimator needs StepRows.episode (episode ids)")
    unit = bucket_codes(_role(rows), rows.episode)
    first = np.unique(unit, return_index=True)[1]
    per_unit = bucket_normalize(bucket_codes(np.asarray(_role(rows))[first], rows.group[first]), rows.outcome[first],
                                eps=eps, drop_constant=drop_constant)
    a_o, keep_o = np.zeros(int(unit.max()) + 1), np.ones(int(unit.max()) + 1, dtype=bool)
    a_o[unit[first]], keep_o[unit[first]] = per_unit.advantages, per_unit.keep
    voted = ~np.isnan(rows.vote_mean)
    votes = np.where(voted, rows.vote_mean, 0.0)
    n_votes = np.bincount(unit, weights=voted, minlength=len(a_o))
    own = np.bincount(unit, weights=votes, minlength=len(a_o)) / np.maximum(n_votes, 1)
    process = np.where(voted, c * (votes - own[unit]), 0.0)
    return Advantages(advantages=a_o[unit] + process, rewards=step_rewards(rows.outcome, rows.vote_mean, c),
                      keep=keep_o[unit] | (process != 0), buckets=per_unit.buckets,
                      singleton_buckets=per_unit.singleton_buckets, constant_buckets=per_unit.constant_buckets)


def state_hash(observation: Any) -> int:
    """A stable 63-bit hash of an observation (text, bytes, or JSON-able data)."""
    if isinstance(observation, bytes):
        raw = observation
    elif isinstance(observation, str):
        raw = observation.encode()
    else:
        raw = json.dumps(observation, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") >> 1


def states_before(trajectory: Any) -> list[int]:
    """``state`` keys of a trajectory's steps: the hash of the observation each step saw
    (for step 0, the task itself, which every sample of the group shares)."""
    prev: Any = ["task", trajectory.task_id]
    out = []
    for step in trajectory.steps:
        out.append(state_hash(prev))
        prev = step.observation
    return out


def compute_advantages(rows: StepRows, key: str = "step_index", *, c: float = 1.0, eps: float = EPS,
                       drop_constant: bool = True) -> Advantages:
    """Step rewards and bucket-normalized advantages for ``rows`` (see module doc)."""
    if key not in GROUPINGS and key not in ESTIMATORS:
        raise ValueError(f"unknown advantage grouping {key!r}; known: {', '.join(advantage_keys())}")
    if len(rows) == 0:
        empty = np.zeros(0)
        return Advantages(empty, empty, np.zeros(0, dtype=bool), 0, 0, 0)
    if key in ESTIMATORS:
        return ESTIMATORS[key](rows, c, eps=eps, drop_constant=drop_constant)
    codes, rewards = GROUPINGS[key](rows, c)
    return bucket_normalize(codes, rewards, eps=eps, drop_constant=drop_constant)


def rl_weight(opd: Any) -> float:
    """``w_rl`` of an ``opd`` config section (None: no OPD): 1 in mode ``rl``, 0 in mode ``opd``,
    ``weight_rl`` in ``combine``."""
    if opd is None or opd.mode == "rl":
        return 1.0
    return 0.0 if opd.mode == "opd" else float(opd.weight_rl)


def trained_rows(keep: Any, hinted: Any, w_rl: float) -> np.ndarray:
    """Which steps train: the kept ones (not in a dropped constant bucket) while the RL part
    counts (``w_rl != 0``), and every hinted one."""
    return (np.asarray(keep, dtype=bool) & (w_rl != 0)) | np.asarray(hinted, dtype=bool)


def token_advantages(teacher_log_probs: Any, old_log_probs: Any, a_rl: Any, weight_opd: float) -> np.ndarray:
    """``weight_opd * (log pi_teacher - log pi_old) + a_rl`` per response token, ``a_rl`` being the
    step's already weighted ``w_rl * A``: one step's tokens with a scalar ``a_rl``, or a batch's
    ``[n, T]`` rows with ``a_rl`` of shape ``[n, 1]``."""
    teacher = np.asarray(teacher_log_probs, dtype=np.float64)
    old = np.asarray(old_log_probs, dtype=np.float64)
    return weight_opd * (teacher - old) + np.asarray(a_rl, dtype=np.float64)
