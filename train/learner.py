"""The learner: a trainable copy of the policy model, its frozen reference, and AdamW.

Rollouts generate with the serving model inside :class:`~agents.hf_policy.HFPolicy`;
the learner trains its own copy, so a training step never touches weights a
generation is reading. :meth:`Learner.publish` then copies the new weights
into the serving model under the policy's generate lock (between two
generations). One :meth:`Learner.step` is ``train.updates_per_step`` optimizer
updates (default one, over the whole batch), each accumulated over micro-batches. Under
On-Policy Distillation it first scores each hinted sample's response in its teacher
context (one forward pass of the teacher per hinted step, :meth:`Learner.score_teacher`).
With ``train.pack`` it then trains each episode's steps as one row (:func:`train.batch.pack`).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from tqdm.auto import tqdm

from nextstate.train.advantage import token_advantages
from nextstate.train.batch import Batch, Sample, collate, micro_batches, pack
from nextstate.train.config import Config
from nextstate.train.loss import actor_config, actor_loss, token_log_probs

log = logging.getLogger(__name__)


class Learner:
    """Trains a copy of ``policy.model`` with veRL's PPO loss (see :mod:`train.loss`)."""

    def __init__(self, policy: Any, cfg: Config, reference: Any = None):
        self.policy, self.cfg = policy, cfg
        self.model = copy.deepcopy(policy.model).train()
        self.model.config.use_cache = False
        self.ref = None
        if cfg.train.kl_coef > 0:   # the KL anchor: ``reference``, else the policy as it is now
            self.ref = (reference if reference is not None else copy.deepcopy(policy.model))
            self.ref.eval().requires_grad_(False)
        self.teacher = None   # OPD's teacher: the frozen reference, or the model being trained
        if cfg.opd.mode != "rl":
            if cfg.opd.teacher == "policy":
                self.teacher = self.model
            else:
                self.teacher = self.ref if self.ref is not None else \
                    copy.deepcopy(policy.model).eval().requires_grad_(False)
        t = cfg.train
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=tuple(t.betas),
                                           weight_decay=t.weight_decay)
        self.actor = actor_config(t, cfg.rollout.samples_per_task)
        self.temperature = cfg.rollout.temperature or 1.0
        pad = policy.tokenizer.pad_token_id
        self.pad_id = 0 if pad is None else pad
        self.device = next(self.model.parameters()).device

    def step(self, batch: Batch, progress: bool = True) -> dict[str, float]:
        """``train.updates_per_step`` optimizer updates on ``batch``, each on an equal share of its
        samples (one mini-batch, in order; fewer updates when there are fewer samples); returns loss, KL, clip fraction, entropy, grad norm
        (means over the updates).

        A non-finite gradient norm skips that update and counts in ``train/skipped_nonfinite``."""
        if not batch.samples:
            return {"train/skipped": 1.0}
        opd = self.score_teacher(batch)
        samples = pack(batch.samples) if self.cfg.train.pack else batch.samples
        n = len(samples)
        updates = min(self.cfg.train.updates_per_step, n)
        cuts = [k * n // updates for k in range(updates + 1)]   # shares differ by at most one sample
        outs = [self._update(samples[a:b], progress) for a, b in zip(cuts, cuts[1:])]
        out = {k: sum(o[k] for o in outs) / len(outs) for k in outs[0]}
        out["train/skipped_nonfinite"] = sum(o["train/skipped_nonfinite"] for o in outs)
        out["train/updates"] = float(len(outs))
        out["train/rows"] = float(n)
        out.update(opd)
        return out

    def _update(self, samples: list, progress: bool) -> dict[str, float]:
        """One optimizer update on ``samples``, accumulated over micro-batches."""
        mbs = micro_batches(samples, self.cfg.train.micro_batch_size, self.pad_id)
        total_tokens, n = sum(s.num_tokens for s in samples), len(samples)
        sums: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for mb in tqdm(mbs, desc="training", leave=False, disable=not progress):
            mb = mb.to(self.device)
            weight = float(mb.response_mask.sum()) / total_tokens
            ref_lp = None
            if self.ref is not None:
                with torch.no_grad():
                    ref_lp, _ = token_log_probs(self.ref, mb, self.temperature)
            log_prob, entropy = token_log_probs(self.model, mb, self.temperature, with_entropy=True,
                                                entropy_grad=self.actor.entropy_coeff != 0)
            loss, metrics = actor_loss(self.actor, log_prob, mb, ref_log_prob=ref_lp, entropy=entropy,
                                       batch_num_tokens=total_tokens, global_batch_size=n)
            loss.backward()
            for k, v in metrics.items():   # token-weighted means; pg_loss is already a share of the total
                sums[k] = sums.get(k, 0.0) + (v if k == "pg_loss" else v * weight)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        finite = bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
        else:
            log.warning("non-finite gradient norm (%s): update skipped", float(grad_norm))
        out = {f"train/{k}": v for k, v in sums.items()}
        out["train/skipped_nonfinite"] = 0.0 if finite else 1.0
        out["train/grad_norm"] = float(grad_norm)
        out["train/lr"] = self.optimizer.param_groups[0]["lr"]
        return out

    def score_teacher(self, batch: Batch) -> dict[str, float]:
        """Per-token advantages of the samples with a teacher context: the teacher's log-probs
        of their response there (no gradient), through :func:`train.advantage.token_advantages`."""
        hinted = [s for s in batch.samples if s.teacher_prompt_ids is not None]
        if not hinted or self.teacher is None:
            return {}
        gaps = []
        size = self.cfg.train.micro_batch_size
        with torch.no_grad():
            for k in range(0, len(hinted), size):
                chunk = hinted[k:k + size]
                mb = collate([Sample(s.teacher_prompt_ids or [], s.response_ids, s.old_log_probs, 0.0, 0.0)
                              for s in chunk], self.pad_id).to(self.device)
                teacher_lp, _ = token_log_probs(self.teacher, mb, self.temperature)
                for i, s in enumerate(chunk):
                    lp = teacher_lp[i, :len(s.response_ids)].tolist()
                    s.token_advantages = token_advantages(lp, s.old_log_probs, s.advantage, batch.weight_opd).tolist()
                    gaps += [t - o for t, o in zip(lp, s.old_log_probs)]
        return {"opd/teacher_gap_mean": float(sum(gaps) / len(gaps)), "opd/scored_samples": float(len(hinted))}

    def publish(self) -> None:
        """Copy the trained weights into the serving model, between two generations (and bump
        the policy's weights ``version``)."""
        with self.policy.lock, torch.no_grad():
            for dst, src in zip(self.policy.model.parameters(), self.model.parameters()):
                dst.copy_(src)
            self.policy.version = getattr(self.policy, "version", 0) + 1

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the optimizer state of a checkpoint (``state["optimizer"]``)."""
        self.optimizer.load_state_dict(state["optimizer"])
