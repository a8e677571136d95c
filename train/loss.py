"""The actor loss, computed with veRL's own functions.

The PPO clipped surrogate is veRL's registered policy loss ``vanilla``
(``core_algos.get_policy_loss_fn``), the KL term ``core_algos.kl_penalty``
(``low_var_kl`` by default) aggregated with ``core_algos.agg_loss``; log-probs
and entropies come from ``verl.utils.torch_functional``. This module only
lays the tensors out the way those functions expect (padded ``[batch,
response]``) and sets veRL's ``global_batch_info`` so that token-mean over a
whole step stays exact under gradient accumulation: every micro-batch
divides by the step's total token count and the gradients add up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits, masked_mean
from verl.workers.config import ActorConfig

from nextstate.train.config import TrainConfig


def actor_config(train: TrainConfig, rollout_n: int) -> ActorConfig:
    """veRL's ``ActorConfig`` for our loss settings (its ``__post_init__`` validates them)."""
    return ActorConfig(
        strategy="local", rollout_n=rollout_n, ppo_micro_batch_size_per_gpu=train.micro_batch_size,
        clip_ratio=train.clip_low, clip_ratio_low=train.clip_low, clip_ratio_high=train.clip_high,
        loss_agg_mode=train.loss_agg_mode, entropy_coeff=train.entropy_coef,
        use_kl_loss=train.kl_coef > 0, kl_loss_coef=train.kl_coef, kl_loss_type=train.kl_type)


@dataclass
class MicroBatch:
    """Right-padded samples: ``input_ids = prompt + response`` per row.

    ``response_start[i]`` is where row i's response begins; response tensors
    are ``[batch, max_response]`` with ``response_mask`` marking real tokens.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_start: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    old_log_probs: torch.Tensor
    advantages: torch.Tensor

    def to(self, device: torch.device | str) -> "MicroBatch":
        """The same batch on ``device``."""
        return MicroBatch(**{k: v.to(device) for k, v in vars(self).items()})


def response_logits(model: Any, mb: MicroBatch, temperature: float) -> torch.Tensor:
    """Logits that predict each response token, ``[batch, max_response, vocab]``, scaled by 1/temperature."""
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits
    steps = torch.arange(mb.response_ids.shape[1], device=logits.device)
    pos = (mb.response_start[:, None] - 1 + steps[None, :]).clamp(max=logits.shape[1] - 1)
    picked = torch.gather(logits, 1, pos[..., None].expand(-1, -1, logits.shape[-1]))
    return picked.float() / temperature


def token_log_probs(model: Any, mb: MicroBatch, temperature: float, with_entropy: bool = False,
                    entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of the responses, and entropies when asked (differentiable
    only with ``entropy_grad``: an entropy bonus needs it, a metric does not)."""
    logits = response_logits(model, mb, temperature)
    log_probs = logprobs_from_logits(logits, mb.response_ids)
    entropy = None
    if with_entropy:
        entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return log_probs, entropy


def actor_loss(config: ActorConfig, log_prob: torch.Tensor, mb: MicroBatch, *, ref_log_prob: torch.Tensor | None,
               entropy: torch.Tensor | None, batch_num_tokens: int,
               global_batch_size: int) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss (+ KL loss, - entropy bonus) of one micro-batch, scaled to the whole step.

    ``batch_num_tokens`` / ``global_batch_size`` are the step's totals, so the
    sum of the micro-batch losses is the step's token-mean loss.
    """
    config.global_batch_info.update(dp_size=1, batch_num_tokens=batch_num_tokens,
                                    global_batch_size=global_batch_size,
                                    loss_scale_factor=config.loss_scale_factor)
    mask = mb.response_mask.bool()
    policy_loss_fn = get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))
    pg_loss, pg_metrics = policy_loss_fn(
        old_log_prob=mb.old_log_probs, log_prob=log_prob, advantages=mb.advantages, response_mask=mask,
        loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=None)
    loss = pg_loss
    metrics = {"pg_loss": pg_loss.item(), "clip_frac": pg_metrics["actor/pg_clipfrac"],
               "ppo_kl": pg_metrics["actor/ppo_kl"], "clip_frac_lower": pg_metrics["actor/pg_clipfrac_lower"]}
    if entropy is not None:
        entropy_loss = agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=config.loss_agg_mode,
                                **config.global_batch_info)
        loss = loss - config.entropy_coeff * entropy_loss
        metrics["entropy"] = masked_mean(entropy.detach(), mask).item()
    if config.use_kl_loss and ref_log_prob is not None:
        kld = kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=config.loss_agg_mode,
                           **config.global_batch_info)
        loss = loss + config.kl_loss_coef * kl_loss
        metrics["kl"] = masked_mean(kld.detach(), mask).item()
    return loss, metrics
