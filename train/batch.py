"""From trajectories to training samples: one sample per agent step.

A sample's prompt is the context token ids the policy saw at that step, its
response the tokens it sampled there, and its old log-probs the ones recorded
at rollout (pi_old). Aborted episodes, steps of other roles and steps whose
token ids the backend did not report are left out (and counted). The
advantage of a step comes from :mod:`train.advantage` and is spread over
every token of its response. ``Batch.step_log`` keeps, per trainable step,
the ``R_t`` and advantage it was trained with (the trainer writes them to
``advantages.jsonl``, where ``python -m viewer`` reads them).

On-Policy Distillation (``opd.mode`` ``opd`` or ``combine``): a step with a hint
carries its teacher context (``Step.teacher_prompt_ids``); the learner scores the
step's response there with the teacher and gives each token
``w_opd * (log pi_teacher - log pi_old) + w_rl * A_rl`` (:func:`train.advantage.token_advantages`,
which the veRL backend shares). A step without a hint keeps ``w_rl * A_rl``; in mode ``opd``
``w_rl`` is 0, so only hinted steps train (:func:`train.advantage.trained_rows`).

Packing (``train.pack``, :func:`pack`): an episode's steps whose prompt + response is a prefix of
its last step's sequence (each turn's prompt holds the earlier turns verbatim) become one row, the
last sequence, with a mask on the steps' response tokens and each token's own advantage and old
log-prob. The token-mean loss and its gradient are the ones of the per-step samples; the shared
prefix is computed once instead of once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from nextstate.agents.trajectory import Step, Trajectory
from nextstate.train.advantage import StepRows, compute_advantages, rl_weight, states_before, trained_rows
from nextstate.train.config import AdvantageConfig, OPDConfig
from nextstate.train.loss import MicroBatch


@dataclass
class Sample:
    """One agent step as a training sample."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_log_probs: list[float]
    advantage: float                  # the step's scalar advantage (w_rl * A_rl under OPD)
    reward: float
    teacher_prompt_ids: list[int] | None = None   # OPD's teacher context: the prompt with the hint
    token_advantages: list[float] | None = None   # per-token advantages, once the teacher has scored
    episode: int = -1                 # the trajectory it comes from in its batch (-1: unknown, never packed)
    mask: list[int] | None = None     # per response token, 1 where it trains (None: every token)

    @property
    def num_tokens(self) -> int:
        """Response tokens that train."""
        return len(self.response_ids) if self.mask is None else sum(self.mask)


@dataclass
class Batch:
    """The samples of one training step and what building them counted."""

    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)
    step_log: list[dict] = field(default_factory=list)
    weight_opd: float = 0.0           # w_opd of the samples with a teacher context

    @property
    def num_tokens(self) -> int:
        """Response tokens in the batch (the token-mean denominator)."""
        return sum(s.num_tokens for s in self.samples)


def _roles(role: str | Sequence[str]) -> tuple[str, ...]:
    return (role,) if isinstance(role, str) else tuple(role)


def trainable(step: Step, role: str | Sequence[str]) -> bool:
    """Whether a step can train the policy of ``role`` (one role, or the roles a shared policy
    plays): its exact token ids and log-probs are known."""
    return (step.role in _roles(role) and step.ids_from_server and bool(step.response_ids)
            and len(step.logprobs) == len(step.response_ids))


def step_table(trajectories: Sequence[Trajectory], role: str | Sequence[str]
               ) -> tuple[StepRows, list[tuple[Trajectory, Step]]]:
    """Rows for the advantage code and the matching (trajectory, step) pairs (trainable steps
    of ``role`` only; with several roles, buckets are per role too)."""
    roles = _roles(role)
    group, index, outcome, votes, state, episode, steps = [], [], [], [], [], [], []
    for n, traj in enumerate(trajectories):
        if traj.status == "aborted":
            continue
        o = float(traj.outcome or 0.0)
        for step, before in zip(traj.steps, states_before(traj)):
            if trainable(step, role):
                group.append(traj.group_id)
                index.append(step.index)
                outcome.append(o)
                votes.append(np.nan if step.vote_mean is None else step.vote_mean)
                state.append(before)
                episode.append(n)
                steps.append((traj, step))
    rows = StepRows(group=np.array(group, dtype=object).astype(str), step=np.array(index, dtype=np.int64),
                    outcome=np.array(outcome), vote_mean=np.array(votes, dtype=np.float64),
                    state=np.array(state, dtype=np.int64), episode=np.array(episode, dtype=np.int64),
                    role=np.array([roles.index(s.role) for _, s in steps], dtype=np.int64) if len(roles) > 1 else None)
    return rows, steps


def build_batch(trajectories: Sequence[Trajectory], adv: AdvantageConfig, *, weight: float,
                role: str | Sequence[str], opd: OPDConfig | None = None, seed: int = 0) -> Batch:
    """Samples with advantages for ``role`` and the rollout metrics of the batch (``seed``
    draws the permutation of ``adv.shuffle_votes``)."""
    rows, steps = step_table(trajectories, role)
    if adv.shuffle_votes:   # the control: the same votes, on the wrong steps
        rows.vote_mean = np.random.default_rng(seed).permutation(rows.vote_mean)
    result = compute_advantages(rows, adv.key, c=weight, eps=adv.eps, drop_constant=adv.drop_constant)
    w_rl = rl_weight(opd)
    distil = opd is not None and opd.mode != "rl"
    hinted = [distil and bool(s.teacher_prompt_ids) for _, s in steps]
    samples = []
    for (_, s), a, r, train, hint, n in zip(steps, result.advantages, result.rewards,
                                            trained_rows(result.keep, hinted, w_rl), hinted, rows.episode):
        if train:
            samples.append(Sample(list(s.prompt_ids), list(s.response_ids), list(s.logprobs),
                                  w_rl * float(a), float(r), teacher_prompt_ids=s.teacher_prompt_ids if hint else None,
                                  episode=int(n)))
    step_log = [{"group_id": t.group_id, "task_id": t.task_id, "sample": t.sample, "step": s.index,
                 "role": s.role, "reward": float(r), "advantage": float(a), "kept": bool(k),
                 **({"hint": s.hint} if s.hint else {})}
                for (t, s), a, r, k in zip(steps, result.advantages, result.rewards, result.keep)]
    summary = result.summary()
    metrics = rollout_metrics(trajectories)
    metrics.update({
        "batch/samples": len(samples),
        **{f"batch/{k}": summary[k] for k in ("dropped_samples", "dropped_buckets", "buckets", "singleton_buckets")},
        "batch/untrainable_steps": sum(len(t.steps) for t in trajectories if t.status != "aborted") - len(rows),
        "batch/response_tokens": sum(len(s.response_ids) for s in samples),
        "reward/mean": summary["reward_mean"],
        "advantage/mean": summary["advantage_mean"],
        "advantage/std": summary["advantage_std"],
    })
    if distil:
        metrics["opd/hinted_samples"] = sum(s.teacher_prompt_ids is not None for s in samples)
    return Batch(samples, metrics, step_log, weight_opd=opd.weight_opd if distil else 0.0)


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Outcome, judge and episode statistics of a batch of trajectories."""
    done = [t for t in trajectories if t.status != "aborted"]
    steps = [s for t in done for s in t.steps]
    judged = [s for s in steps if s.votes]
    agreement = [max(s.votes.count(v) for v in set(s.votes)) / len(s.votes) for s in judged]
    lengths = [len(t.steps) for t in done]
    means = [s.vote_mean for s in judged if s.vote_mean is not None]
    return {
        "episodes": len(trajectories), "aborted": len(trajectories) - len(done),
        "outcome/mean": float(np.mean([t.outcome or 0.0 for t in done])) if done else 0.0,
        "outcome/success": float(np.mean([(t.outcome or 0.0) > 0 for t in done])) if done else 0.0,
        "judge/score_mean": float(np.mean([s.score for s in judged])) if judged else 0.0,
        **({"judge/vote_mean": float(np.mean(means))} if means else {}),  # missing: no valid vote
        "judge/vote_agreement": float(np.mean(agreement)) if agreement else 0.0,
        "judge/errors": sum(s.judge_error is not None for s in steps),
        "judge/valid_action_rate": float(np.mean([bool(s.next_state.get("valid")) for s in steps]))
        if steps else 0.0,
        "episode/length_mean": float(np.mean(lengths)) if lengths else 0.0,
        "episode/length_max": max(lengths, default=0),
        "episode/truncated": sum(t.status == "truncated" for t in done),
    }


def pack(samples: Sequence[Sample]) -> list[Sample]:
    """The samples with each episode's prefix-consistent steps in one row (see the module's
    docstring); a step that is not a prefix of its episode's longest sequence stays its own row.
    Call it after the teacher has scored (a packed row has no teacher context)."""
    by_episode: dict[int, list[Sample]] = {}
    out: list[Sample] = []
    for s in samples:
        if s.episode < 0 or s.mask is not None:
            out.append(s)
        else:
            by_episode.setdefault(s.episode, []).append(s)
    for steps in by_episode.values():
        full = max(steps, key=lambda s: len(s.prompt_ids) + len(s.response_ids))
        seq = full.prompt_ids + full.response_ids
        inside = [s for s in steps if seq[:len(s.prompt_ids) + len(s.response_ids)] == s.prompt_ids + s.response_ids]
        out += [s for s in steps if s not in inside]
        if len(inside) == 1:
            out.append(full)
            continue
        start = min(len(s.prompt_ids) for s in inside)
        width = len(seq) - start
        old, adv, mask = [0.0] * width, [0.0] * width, [0] * width
        for s in inside:
            a = s.token_advantages if s.token_advantages is not None else [s.advantage] * len(s.response_ids)
            at = len(s.prompt_ids) - start
            old[at:at + len(s.response_ids)] = s.old_log_probs
            adv[at:at + len(s.response_ids)] = a
            mask[at:at + len(s.response_ids)] = [1] * len(s.response_ids)
        out.append(Sample(seq[:start], seq[start:], old, 0.0, full.reward, token_advantages=adv,
                          episode=full.episode, mask=mask))
    return out


def collate(samples: Sequence[Sample], pad_id: int) -> MicroBatch:
    """Right-padded tensors of ``samples`` (prompt + response per row)."""
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    width, resp = max(lengths), max(len(s.response_ids) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response_ids = torch.full((n, resp), pad_id, dtype=torch.long)
    response_mask = torch.zeros((n, resp), dtype=torch.long)
    old = torch.zeros((n, resp))
    advantages = torch.zeros((n, resp))
    start = torch.zeros(n, dtype=torch.long)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, : p + r] = torch.tensor(s.prompt_ids + s.response_ids)
        attention[i, : p + r] = 1
        response_ids[i, :r] = torch.tensor(s.response_ids)
        response_mask[i, :r] = 1 if s.mask is None else torch.tensor(s.mask)
        old[i, :r] = torch.tensor(s.old_log_probs)
        advantages[i, :r] = torch.tensor(s.token_advantages) if s.token_advantages is not None else s.advantage
        start[i] = p
    return MicroBatch(input_ids, attention, start, response_ids, response_mask, old, advantages)


def micro_batches(samples: Sequence[Sample], size: int, pad_id: int) -> list[MicroBatch]:
    """``samples`` in micro-batches of ``size``, similar lengths together (less padding)."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids))
    return [collate([samples[i] for i in order[k:k + size]], pad_id) for k in range(0, len(order), size)]
