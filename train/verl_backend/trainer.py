"""The ``nextstate`` trainer mode: veRL's synchronous PPO trainer with step-level advantages.

Registered with ``verl.trainer.ppo.v1.register_trainer`` and selected by
``trainer.v1.trainer_mode=nextstate``. Everything is veRL's ``sync`` trainer
(the mode reports itself as ``sync`` to the code that branches on it) except
:meth:`NextStateTrainer._compute_advantage`: it reads the agent loop's
per-step fields from TransferQueue, runs
:func:`train.verl_backend.advantage.step_advantages` on a ``DataProto`` and
writes ``advantages``, ``returns`` and the (possibly zeroed) response and
loss masks back. The settings come from the ``nextstate`` section of the
config (see :mod:`train.verl_backend.launch`).

The mode also writes the local backend's ``metrics.jsonl`` and ``curves.png``
(:func:`local_metrics`) and ``advantages.jsonl`` (:func:`advantage_rows`: the
advantages each actor update reads) to the run's output folder, runs the run's
held-out evaluation in place of veRL's validation (:mod:`~train.verl_backend.heldout`),
and on the ``cpu`` platform starts its workers as :class:`CPUActorRolloutRefWorker`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import transfer_queue as tq
from omegaconf import OmegaConf, read_write
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.utils.device import get_device_name
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import response_to_nested

from train.advantage import step_rewards
from train.checkpoint import resume_line
from train.config import config_from_dict
from train.verl_backend import RUN_ENV
from train.verl_backend.advantage import (FIELD_EPISODE, FIELD_OUTCOME, FIELD_STEP, FIELD_VOTE_MEAN, FIELDS,
                                          step_advantages)
from train.verl_backend.heldout import HeldOut

MODE = "nextstate"
ADVANTAGE_LOG = "advantages.jsonl"

# veRL's metric names -> the local backend's (train/batch.py, train/learner.py), so metrics.jsonl
# and curves.png read the same on both backends; every veRL metric is kept as well
LOCAL_NAMES = {
    "nextstate/outcome_mean": "outcome/mean", "nextstate/outcome_success": "outcome/success",
    "nextstate/episodes": "episodes", "nextstate/aborted_episodes": "aborted",
    "nextstate/vote_mean": "judge/vote_mean", "nextstate/judge_score_mean": "judge/score_mean",
    "nextstate/episode_length_mean": "episode/length_mean",
    "nextstate/reward_mean": "reward/mean", "nextstate/advantage_mean": "advantage/mean",
    "nextstate/advantage_std": "advantage/std", "nextstate/samples": "batch/samples",
    "nextstate/dropped_samples": "batch/dropped_samples", "nextstate/dropped_buckets": "batch/dropped_buckets",
    "nextstate/buckets": "batch/buckets", "actor/pg_loss": "train/pg_loss", "actor/kl_loss": "train/kl",
    "actor/pg_clipfrac": "train/clip_frac", "actor/pg_clipfrac_lower": "train/clip_frac_lower",
    "actor/ppo_kl": "train/ppo_kl", "actor/entropy": "train/entropy", "actor/grad_norm": "train/grad_norm",
    "actor/lr": "train/lr", "timing_s/gen": "time/rollout_s", "timing_s/update_actor": "time/train_s",
    "timing_s/step": "time/step_s",
}


def local_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """veRL's step metrics plus the local backend's names for the same quantities."""
    out = dict(metrics)
    out.update({local: metrics[name] for name, local in LOCAL_NAMES.items() if name in metrics})
    wall = float(metrics.get("timing_s/step") or 0.0)
    if wall > 0:
        out["perf/samples_per_s"] = float(metrics.get("nextstate/samples", 0)) / wall
        out["perf/episodes_per_s"] = float(metrics.get("nextstate/episodes", 0)) / wall
    return out


def advantage_settings(config: Any) -> dict[str, Any]:
    """Keyword arguments of :func:`step_advantages` from the ``nextstate`` config section."""
    ns = config.nextstate
    return {"key": ns.advantage.key, "weight": float(ns.judge.weight), "eps": float(ns.advantage.eps),
            "drop_constant": bool(ns.advantage.drop_constant)}


def fields_to_dataproto(fetched: TensorDict, tags: list[dict]) -> DataProto:
    """A ``DataProto`` with the response mask, ``uid``, ``is_padding`` and the ``FIELD_*`` columns."""
    padded = fetched.select("response_mask").to_padded_tensor()
    extras = list(fetched["extra_fields"])
    n = len(extras)
    columns = {name: np.array([(e or {}).get(name) for e in extras], dtype=object) for name in FIELDS}
    columns["uid"] = np.array(list(fetched["uid"]), dtype=object)
    columns["is_padding"] = np.array([bool(t.get("is_padding", False)) for t in tags], dtype=object)
    return DataProto(batch=TensorDict({"response_mask": padded["response_mask"]}, batch_size=n),
                     non_tensor_batch=columns)


class CPUActorRolloutRefWorker(ActorRolloutRefWorker):
    """veRL's actor/rollout/reference worker, its process group made before veRL makes one.

    veRL's ``initialize_global_process_group_ray`` (``verl/utils/distributed.py``,
    line 89) asks torch for ``cpu:gloo,<device>:<backend>``, which on the ``cpu``
    platform is ``cpu:gloo,cpu:gloo`` and rejected by torch ("Duplicate device
    type cpu"); it skips the call when a default group exists, so this worker
    makes a plain gloo group first (rank, world size and rendezvous from the
    environment veRL's worker group sets).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend="gloo")
        super().__init__(*args, **kwargs)


def advantage_rows(fetched: TensorDict, tags: list[dict], train_step: int, *, role: str,
                   weight: float) -> list[dict[str, Any]]:
    """The rows of ``advantages.jsonl`` for one update, in the local backend's format, one per sample.

    Like the local trainer's (``kind``, ``train_step``, ``group_id``, ``sample``, ``step``,
    ``role``, ``reward`` = ``R_t``, ``advantage``, ``kept``), plus veRL's view of the sample:
    ``advantage`` is the value on its first trained token, ``uniform`` whether every trained
    token carries it, ``tokens`` how many are trained, ``padding`` whether veRL padded the batch
    with it, and the agent loop's ``FIELD_*`` values.
    """
    rows = []
    for i, (adv, mask, extra) in enumerate(zip(fetched["advantages"].unbind(), fetched["response_mask"].unbind(),
                                               fetched["extra_fields"])):
        trained = adv[mask.bool()]
        extra = {name: (extra or {}).get(name) for name in FIELDS}
        vote = extra[FIELD_VOTE_MEAN]
        extra[FIELD_VOTE_MEAN] = None if vote is None or vote != vote else float(vote)
        outcome = float(extra[FIELD_OUTCOME] or 0.0)
        reward = step_rewards(np.array([outcome]), np.array([np.nan if extra[FIELD_VOTE_MEAN] is None
                                                              else extra[FIELD_VOTE_MEAN]]), weight)[0]
        episode = str(extra[FIELD_EPISODE] or "")
        rows.append({"kind": "advantage", "train_step": train_step, "group_id": str(fetched["uid"][i]),
                     "sample": int(episode.rsplit("/", 1)[-1]) if "/" in episode else 0,
                     "step": extra[FIELD_STEP], "role": role, "reward": float(reward),
                     "advantage": float(trained[0]) if len(trained) else 0.0, "kept": bool(len(trained)),
                     "uniform": bool((trained == trained[0]).all()) if len(trained) else True,
                     "tokens": int(mask.sum()), "padding": bool(tags[i].get("is_padding", False)), **extra})
    return rows


@register_trainer(MODE)
class NextStateTrainer(PPOTrainerSync):
    """veRL's sync PPO trainer; advantages from the step rows (see module docstring)."""

    @property
    def trainer_mode(self) -> str:
        """veRL branches on ``trainer_mode == "sync"``; this mode is synchronous."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        """The configured name (``nextstate``) only selects this class."""

    def _load_checkpoint(self) -> None:
        """veRL's resume, then the line ``python -m train --resume`` prints (veRL logs it at INFO)."""
        super()._load_checkpoint()
        if self.config.trainer.resume_mode != "disable":
            root = Path(self.config.trainer.default_local_dir)
            where = root / f"global_step_{self.global_steps}" if self.global_steps else root
            print(resume_line(self.global_steps or None, self.total_training_steps, where),
                  file=sys.stderr, flush=True)
        if self.global_steps:   # the starting point is evaluated at step 0 only, as on the local backend
            with read_write(self.config.trainer):
                self.config.trainer.val_before_train = False

    def _log_row(self, step: int, metrics: dict[str, Any]) -> None:
        """One row of ``<output>/metrics.jsonl`` (and the curves PNG), the log opened on first use."""
        if getattr(self, "_metrics_log", None) is None:
            from train.metrics import MetricsLog
            resumed = self.config.trainer.resume_mode != "disable"
            self._metrics_log = MetricsLog(self.config.nextstate.run.output,
                                           resume_step=step - 1 if resumed else None)
        self._metrics_log.log(step, metrics)

    def _compute_metrics(self, batch: KVBatchMeta, metrics: dict, timing_raw: dict, global_steps: int,
                         epoch: int) -> None:
        """veRL's metrics, then one row of ``<output>/metrics.jsonl`` and the curves PNG."""
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        self._log_row(global_steps, local_metrics(metrics))

    def fit(self, agent_loop_manager: Any) -> None:
        """veRL's training loop; then the held-out evaluation's log is written out."""
        try:
            super().fit(agent_loop_manager)
        finally:
            if getattr(self, "_heldout", None) is not None:
                self._heldout.finish()

    def _validate(self) -> dict[str, float]:
        """The run's held-out evaluation (``eval`` section) in place of veRL's validation.

        veRL calls it before the first step (``trainer.val_before_train``), every
        ``trainer.test_freq`` steps and after the last, once the rollout servers hold the
        step's weights; the episodes run in this process through veRL's server client
        (:class:`~train.verl_backend.heldout.HeldOut`). Step 0's row is logged here; a later
        step's goes into that step's metrics row.
        """
        if getattr(self, "_heldout", None) is None:
            cfg = config_from_dict(OmegaConf.to_container(self.config.nextstate, resolve=True))
            self._heldout = HeldOut(cfg, run_id=os.environ.get(RUN_ENV))
        t0 = time.monotonic()
        metrics = self._heldout.run(self.global_steps, self.get_llm_client(), self.tokenizer,
                                    dict(self.config.data.get("apply_chat_template_kwargs") or {}))
        metrics["time/eval_s"] = time.monotonic() - t0
        if self.global_steps == 0:
            self._log_row(0, metrics)
        return metrics

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        """veRL pads the batch to a multiple of this: ``updates_per_step`` mini-batches, each a
        multiple of the data-parallel size and of ``rollout.n`` (see :meth:`_update_actor`)."""
        return int(self.config.nextstate.train.updates_per_step) * math.lcm(
            dp_size, int(self.config.actor_rollout_ref.rollout.n))

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """veRL's actor update, after logging the advantages it reads (``<output>/advantages.jsonl``).

        veRL splits a step into mini-batches of ``ppo_mini_batch_size * rollout.n`` samples, one
        optimizer update each; the agent loop gives one sample per *environment* step, so that
        count varies. For this update the mini-batch is set to a ``train.updates_per_step``-th
        of the (padded) batch: ``updates_per_step`` updates per training step, as on the local backend.
        """
        fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                  select_fields=["uid", "advantages", "response_mask", "extra_fields"])
        ns = self.config.nextstate
        rows = advantage_rows(fetched, batch.tags, self.global_steps, role=ns.train.role,
                              weight=float(ns.judge.weight))
        path = Path(self.config.nextstate.run.output) / ADVANTAGE_LOG
        if not getattr(self, "_advantage_log_started", False):   # a fresh run, or rows up to the checkpoint
            self._advantage_log_started = True
            resumed = self.config.trainer.resume_mode != "disable" and path.exists()
            kept = [line for line in path.read_text().splitlines()
                    if json.loads(line)["train_step"] < self.global_steps] if resumed else []
            path.write_text("".join(line + "\n" for line in kept))
        with path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        actor, n = self.config.actor_rollout_ref.actor, int(self.config.actor_rollout_ref.rollout.n)
        configured = actor.ppo_mini_batch_size
        with read_write(actor):
            actor.ppo_mini_batch_size = max(1, math.ceil(len(batch) / (int(ns.train.updates_per_step) * n)))
            try:
                return super()._update_actor(batch, metrics)
            finally:
                actor.ppo_mini_batch_size = configured

    def _init_resource_pool_mgr(self) -> None:
        """veRL's pools and roles; on the ``cpu`` platform, :class:`CPUActorRolloutRefWorker` workers."""
        super()._init_resource_pool_mgr()
        if get_device_name() == "cpu":
            for role in list(self.role_worker_mapping):
                self.role_worker_mapping[role] = ray.remote(CPUActorRolloutRefWorker)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                  select_fields=["uid", "response_mask", "extra_fields"])
        data = fields_to_dataproto(fetched, batch.tags)
        data, adv_metrics = step_advantages(data, **advantage_settings(self.config))
        metrics.update(adv_metrics)
        nested_mask = fetched["response_mask"]
        out = {name: response_to_nested(data.batch[src], nested_mask)
               for name, src in (("advantages", "advantages"), ("returns", "returns"),
                                 ("response_mask", "response_mask"), ("loss_mask", "response_mask"))}
        # the returned meta lists every persisted field (the reference log-probs too): the actor
        # update reads the fields it names, so the old meta would train without advantages
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                               fields=TensorDict(out, batch_size=len(batch)))
