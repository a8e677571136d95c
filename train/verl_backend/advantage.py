"""Step advantages on a veRL ``DataProto``, with the shared :func:`train.advantage.compute_advantages`.

veRL 0.9.1's advantage estimators see only the prompt ``uid``, not the step
index or the judge's votes, so the ``nextstate`` trainer mode calls this
instead. The per-step facts travel from the agent loop in ``extra_fields``,
which veRL lays out as ``non_tensor_batch`` columns (the ``FIELD_*`` names
below); the task group is veRL's own ``uid`` (the n rollouts of one prompt).

Rows that are veRL padding (``is_padding``), that carry no response token,
or that come from an aborted episode get advantage 0 and an all-zero
response mask; so do the members of constant buckets when those are
dropped. A zero response mask removes a row from veRL's token-mean loss (and
from its token count), which is how a row is dropped from a batch whose size
veRL has already fixed.

On-Policy Distillation: the agent loop puts each hinted step's teacher context
(``FIELD_TEACHER_PROMPT``, its prompt ids with the hint) in ``extra_fields``; the
trainer mode has the teacher score the step's response there and hands
:func:`step_advantages` a :class:`TeacherScores`, whose rows get the local backend's
per-token advantage (:func:`train.advantage.token_advantages`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from verl.protocol import DataProto

from nextstate.train.advantage import StepRows, compute_advantages, token_advantages, trained_rows

FIELD_STEP = "nextstate_step"
FIELD_OUTCOME = "nextstate_outcome"
FIELD_VOTE_MEAN = "nextstate_vote_mean"
FIELD_STATE = "nextstate_state"
FIELD_EPISODE = "nextstate_episode"
FIELD_ABORTED = "nextstate_aborted"
FIELD_SCORE = "nextstate_judge_score"       # the judge's majority vote (None: the step was not judged)
FIELD_HINT = "nextstate_hint"                # the step's selected hint (None: no hint)
FIELD_TEACHER_PROMPT = "nextstate_teacher_prompt_ids"   # its teacher context's token ids (None: no hint)
FIELD_ROLE = "nextstate_role"              # the agent that took the step
FIELD_VALID = "nextstate_valid"            # whether the env took the step's action as valid
FIELDS = (FIELD_STEP, FIELD_OUTCOME, FIELD_VOTE_MEAN, FIELD_STATE, FIELD_EPISODE, FIELD_ABORTED, FIELD_SCORE,
          FIELD_HINT, FIELD_ROLE, FIELD_VALID)


@dataclass
class TeacherScores:
    """OPD's inputs for a batch: which rows were scored in a teacher context, and per response
    token (``[n, T]``, like the response mask) log pi_teacher there and log pi_old."""

    hinted: np.ndarray
    log_probs: torch.Tensor
    old_log_probs: torch.Tensor
    weight_opd: float


def _column(nt: dict[str, np.ndarray], name: str, n: int, default: Any) -> np.ndarray:
    values = nt.get(name)
    if values is None:
        return np.full(n, default, dtype=object)
    return np.array([default if v is None else v for v in values], dtype=object)


def step_advantages(data: DataProto, *, key: str = "step_index", weight: float = 1.0, eps: float = 1e-6,
                    drop_constant: bool = True, weight_rl: float = 1.0,
                    teacher: TeacherScores | None = None) -> tuple[DataProto, dict[str, float]]:
    """Set ``advantages``, ``returns`` and ``response_mask`` of ``data``; returns metrics.

    Needs ``batch["response_mask"]`` and ``non_tensor_batch["uid"]`` plus the
    ``FIELD_*`` columns (``is_padding`` optional). Buckets never mix roles (``FIELD_ROLE``): a
    policy shared by several agents compares a reader's step only with readers' steps. Under
    OPD, ``weight_rl`` is ``w_rl`` (:func:`train.advantage.rl_weight`) and ``teacher`` the
    teacher's scores: a row trains when it is kept and ``w_rl != 0``, or when it is hinted
    (:func:`train.advantage.trained_rows`).
    """
    nt = data.non_tensor_batch
    mask = data.batch["response_mask"]
    n = mask.shape[0]
    padding = _column(nt, "is_padding", n, False).astype(bool)
    aborted = _column(nt, FIELD_ABORTED, n, False).astype(bool)
    valid = ~padding & ~aborted & (mask.sum(-1) > 0).cpu().numpy()
    roles = _column(nt, FIELD_ROLE, n, "")[valid].astype(str)
    rows = StepRows(group=_column(nt, "uid", n, "")[valid].astype(str),
                    step=_column(nt, FIELD_STEP, n, 0)[valid].astype(np.int64),
                    outcome=_column(nt, FIELD_OUTCOME, n, 0.0)[valid].astype(np.float64),
                    vote_mean=_column(nt, FIELD_VOTE_MEAN, n, np.nan)[valid].astype(np.float64),
                    state=_column(nt, FIELD_STATE, n, 0)[valid].astype(np.int64),
                    episode=_column(nt, FIELD_EPISODE, n, "")[valid].astype(str),
                    role=np.unique(roles, return_inverse=True)[1].astype(np.int64) if len(set(roles)) > 1 else None)
    result = compute_advantages(rows, key, c=weight, eps=eps, drop_constant=drop_constant)
    adv = np.zeros(n)
    keep = np.zeros(n, dtype=bool)
    adv[valid], keep[valid] = result.advantages, result.keep
    hinted = valid & (teacher.hinted if teacher is not None else np.zeros(n, dtype=bool))
    train = valid & trained_rows(keep, hinted, weight_rl)
    new_mask = mask * torch.as_tensor(train, device=mask.device)[:, None].to(mask.dtype)
    a_rl = weight_rl * adv
    tokens = np.repeat(a_rl[:, None], mask.shape[1], axis=1)
    opd_metrics = {}
    if teacher is not None:
        teacher_lp, old_lp = teacher.log_probs.cpu().numpy(), teacher.old_log_probs.cpu().numpy()
        tokens[hinted] = token_advantages(teacher_lp[hinted], old_lp[hinted], a_rl[hinted, None], teacher.weight_opd)
        on = mask.bool().cpu().numpy() & hinted[:, None]
        gaps = (teacher_lp - old_lp)[on]
        opd_metrics = {"opd/hinted_samples": int(hinted.sum()), "opd/scored_samples": int(hinted.sum()),
                       **({"opd/teacher_gap_mean": float(gaps.mean())} if len(gaps) else {})}
    advantages = torch.as_tensor(tokens, dtype=torch.float32, device=mask.device) * new_mask
    data.batch["advantages"] = advantages
    data.batch["returns"] = advantages.clone()
    data.batch["response_mask"] = new_mask
    episodes = _column(nt, FIELD_EPISODE, n, "")
    lengths: dict[str, int] = {}
    outcomes: dict[str, float] = {}
    for episode, outcome in zip(episodes[valid].tolist(), rows.outcome.tolist()):
        lengths[episode] = lengths.get(episode, 0) + 1
        outcomes[episode] = outcome
    votes = rows.vote_mean[~np.isnan(rows.vote_mean)]
    scores = [float(v) for v in _column(nt, FIELD_SCORE, n, None)[valid] if v is not None]
    metrics = {
        "nextstate/samples": int(train.sum()),
        **{f"nextstate/{k}": v for k, v in result.summary().items()},
        "nextstate/aborted_episodes": len(set(episodes[aborted & ~padding].tolist())),
        "nextstate/step_outcome_mean": float(rows.outcome.mean()) if len(rows) else 0.0,
        "nextstate/episodes": len(outcomes),
        "nextstate/outcome_mean": float(np.mean(list(outcomes.values()))) if outcomes else 0.0,
        "nextstate/outcome_success": float(np.mean([o > 0 for o in outcomes.values()])) if outcomes else 0.0,
        "nextstate/episode_length_mean": float(np.mean(list(lengths.values()))) if lengths else 0.0,
        "nextstate/vote_mean": float(votes.mean()) if len(votes) else 0.0,
        "nextstate/judge_score_mean": float(np.mean(scores)) if scores else 0.0,
        **opd_metrics,
        "nextstate/valid_action_rate": float(_column(nt, FIELD_VALID, n, False)[~padding & ~aborted].astype(bool).mean())
        if (~padding & ~aborted).any() else 0.0,
    }
    return data, metrics
