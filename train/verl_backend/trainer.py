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

On-Policy Distillation happens in the same hook (:meth:`NextStateTrainer._score_teacher`):
veRL 0.9.1's registered advantage estimators see token rewards, the mask and the
prompt ``uid``, not the step rows or a second forward pass, and this hook already
replaces their call. For the hinted samples (``FIELD_TEACHER_PROMPT`` in ``extra_fields``)
it copies each sample's TransferQueue entry into a partition of its own with the teacher
context as the prompt (``teacher prompt ids + response ids``), has the frozen reference
worker score it (``compute_ref_log_prob``; ``opd.teacher=policy``: the actor's
``compute_log_prob``, the weights that are about to be updated), reads back the response
tokens' log-probs only and clears the copies; :func:`~train.verl_backend.advantage.step_advantages`
then sets ``A_t = w_opd * (log pi_teacher - log pi_old) + w_rl * A_rl``, with veRL's
``old_log_probs`` as ``log pi_old``.

The mode also writes the local backend's ``metrics.jsonl`` and ``curves.png``
(:func:`local_metrics`) and ``advantages.jsonl`` (:func:`advantage_rows`: the
advantages each actor update reads) to the run's output folder, runs the run's
held-out evaluation in place of veRL's validation (:mod:`~train.verl_backend.heldout`),
and on the ``cpu`` platform starts its workers as :class:`CPUActorRolloutRefWorker`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf, read_write
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.single_controller.ray import ResourcePoolManager
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
from verl.utils.debug import marked_timer
from verl.utils.device import get_device_name
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.trainer.ppo.padding_utils import build_padding_position_ids
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.utils.padding import response_from_nested, response_to_nested

from nextstate.train.advantage import rl_weight, step_rewards
from nextstate.train.checkpoint import resume_line
from nextstate.train.config import config_from_dict, policy_roles
from nextstate.train.verl_backend import RUN_ENV
from nextstate.train.verl_backend.advantage import (FIELD_EPISODE, FIELD_HINT, FIELD_OUTCOME, FIELD_ROLE, FIELD_STEP,
                                          FIELD_TEACHER_PROMPT, FIELD_VOTE_MEAN, FIELDS, TeacherScores,
                                          step_advantages)
from nextstate.train.verl_backend.heldout import HeldOut
from nextstate.train.verl_backend.launch import policy_models
from nextstate.train.verl_backend.policies import PolicyClients, TrainedPolicy, add_policy, pool_name

MODE = "nextstate"
ADVANTAGE_LOG = "advantages.jsonl"
TEACHER_PARTITION = "nextstate_teacher"      # the teacher contexts' copies, for the time of one forward pass
TEACHER_LOG_PROBS = "nextstate_teacher_log_probs"   # kept beside the advantages for advantages.jsonl

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
    "timing_s/step": "time/step_s", "nextstate/valid_action_rate": "valid_action_rate",
}
# the episodes' metrics: the team's with several policies, once per step (the rest is per policy)
TEAM = ("nextstate/episodes", "nextstate/aborted_episodes", "nextstate/outcome_mean", "nextstate/outcome_success",
        "nextstate/episode_length_mean", "nextstate/vote_mean", "nextstate/judge_score_mean")


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
            "drop_constant": bool(ns.advantage.drop_constant), "weight_rl": rl_weight(ns.opd)}


def teacher_entries(source: TensorDict, teacher_prompts: list[list[int]]) -> list[dict[str, Any]]:
    """Copies of TransferQueue samples (``source``, as fetched) with each one's teacher context as
    its prompt: ``prompts``, ``input_ids`` (teacher prompt + the same response ids),
    ``attention_mask`` and ``position_ids`` rebuilt, as veRL builds its padding samples
    (``verl.trainer.ppo.padding_utils``); the response, its masks and the rest are unchanged."""
    entries = []
    for i, prompt in enumerate(teacher_prompts):
        sample = source[i]
        entry = {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                 for k, v in ((k, sample[k]) for k in sample.keys())}
        prompts = torch.tensor(prompt, dtype=torch.int64)
        input_ids = torch.cat([prompts, entry["responses"].to(torch.int64)])
        attention_mask = torch.ones_like(input_ids)
        entry.update(prompts=prompts, input_ids=input_ids, attention_mask=attention_mask,
                     position_ids=build_padding_position_ids(entry.get("position_ids"), attention_mask))
        entry.pop("routed_experts", None)    # the rollout's expert routing, recorded for the plain prompt
        entries.append(entry)
    return entries


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
                   weight: float, policy: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``advantages.jsonl`` for one update, in the local backend's format, one per sample.

    Like the local trainer's (``kind``, ``train_step``, ``group_id``, ``sample``, ``step``,
    ``role`` (the step's, else ``role``), ``reward`` = ``R_t``, ``advantage``, ``kept``, ``hint``,
    and ``policy`` when given: the trained policy whose update read the row), plus veRL's view of
    the sample: ``advantage`` is the value on its first trained token, ``uniform`` whether every
    trained token carries it, ``tokens`` how many are trained, ``padding`` whether veRL padded
    the batch with it, and the agent loop's ``FIELD_*`` values. A sample the OPD teacher scored
    also lists, per trained token, ``token_advantages`` and the ``teacher_log_probs``,
    ``old_log_probs`` and (with a reference model) ``ref_log_probs`` they came from.
    """
    rows = []
    for i, (adv, mask, extra) in enumerate(zip(fetched["advantages"].unbind(), fetched["response_mask"].unbind(),
                                               fetched["extra_fields"])):
        trained = adv[mask.bool()]
        scored = {}
        if (extra or {}).get(FIELD_TEACHER_PROMPT) and TEACHER_LOG_PROBS in fetched.keys() and len(trained):
            scored = {"token_advantages": trained.tolist()}
            for name, field in (("teacher_log_probs", TEACHER_LOG_PROBS), ("old_log_probs", "old_log_probs"),
                                ("ref_log_probs", "ref_log_prob")):
                if field in fetched.keys():
                    scored[name] = fetched[field][i][mask.bool()].tolist()
        extra = {name: (extra or {}).get(name) for name in FIELDS}
        vote = extra[FIELD_VOTE_MEAN]
        extra[FIELD_VOTE_MEAN] = None if vote is None or vote != vote else float(vote)
        outcome = float(extra[FIELD_OUTCOME] or 0.0)
        reward = step_rewards(np.array([outcome]), np.array([np.nan if extra[FIELD_VOTE_MEAN] is None
                                                              else extra[FIELD_VOTE_MEAN]]), weight)[0]
        episode = str(extra[FIELD_EPISODE] or "")
        rows.append({"kind": "advantage", "train_step": train_step, "group_id": str(fetched["uid"][i]),
                     "sample": int(episode.rsplit("/", 1)[-1]) if "/" in episode else 0,
                     "step": extra[FIELD_STEP], "role": extra[FIELD_ROLE] or role, "reward": float(reward),
                     "advantage": float(trained[0]) if len(trained) else 0.0, "kept": bool(len(trained)),
                     "uniform": bool((trained == trained[0]).all()) if len(trained) else True,
                     "tokens": int(mask.sum()), "padding": bool(tags[i].get("is_padding", False)),
                     **({"hint": extra[FIELD_HINT]} if extra[FIELD_HINT] else {}),
                     **({"policy": policy} if policy else {}), **extra, **scored})
    return rows


@register_trainer(MODE)
class NextStateTrainer(PPOTrainerSync):
    """veRL's sync PPO trainer; advantages from the step rows (see module docstring).

    With several policies (``agents`` names more than one, :func:`~train.config.policy_roles`),
    veRL's own actor worker group, rollout servers and weight sync serve the first policy and
    :func:`~train.verl_backend.policies.add_policy` adds the same parts for each further one, on
    its own resource pool (``trainer.n_gpus_per_node x trainer.nnodes`` devices per policy). A
    step rolls out once for the team (the agent loop sends each role's generations to its
    policy's servers), then splits the batch by the role of each sample and runs veRL's
    pipeline -- old log-probs, reference, advantages, actor update -- on each policy's part with
    that policy's worker group. Each policy keeps its own optimizer and reference in its workers,
    its checkpoint in ``checkpoints/global_step_N/<policy>/`` and its metrics under ``<policy>/``.
    """

    def __init__(self, config: Any):
        settings = config_from_dict(OmegaConf.to_container(config.nextstate, resolve=True))
        self.policy_roles = policy_roles(settings)
        self.policy_models = policy_models(settings)
        self.several = len(self.policy_roles) > 1
        self.policies: list[TrainedPolicy] = []
        self._policy: TrainedPolicy | None = None      # the policy whose part of the step is running
        self._setting_up = False
        super().__init__(config)

    @property
    def trainer_mode(self) -> str:
        """veRL branches on ``trainer_mode == "sync"``; this mode is synchronous."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        """The configured name (``nextstate``) only selects this class."""

    # -- several policies: set-up, one part of the step per policy, checkpoints ----------------
    def _init_resource_pool_mgr(self) -> None:
        """veRL's pools and roles, plus one pool per further policy (as big as veRL's
        ``global_pool``); on the ``cpu`` platform, :class:`CPUActorRolloutRefWorker` workers."""
        super()._init_resource_pool_mgr()
        if get_device_name() == "cpu":
            for role in list(self.role_worker_mapping):
                self.role_worker_mapping[role] = ray.remote(CPUActorRolloutRefWorker)
        if self.several:
            spec = dict(self.resource_pool_manager.resource_pool_spec)
            spec.update({pool_name(name): list(spec["global_pool"]) for name in list(self.policy_roles)[1:]})
            self.resource_pool_manager = ResourcePoolManager(resource_pool_spec=spec, mapping=self.mapping)

    def _setup(self) -> None:
        """veRL's set-up (the first policy), then the parts of every further policy, then resume."""
        if not self.several:
            return super()._setup()
        self._setting_up = True      # veRL's _setup resumes at its end: wait for every policy
        try:
            super()._setup()
        finally:
            self._setting_up = False
        (first, roles), *rest = self.policy_roles.items()
        self.policies = [TrainedPolicy(first, roles, self.actor_rollout_wg, getattr(self, "ref_policy_wg", None),
                                       self.llm_server_manager, self.checkpoint_manager)]
        role = next(r for r in (Role.ActorRolloutRef, Role.ActorRollout) if r in self.role_worker_mapping)
        for name, roles in rest:
            policy = add_policy(name, roles, self.policy_models[name], self.config, role,
                                self.role_worker_mapping[role],
                                self.resource_pool_manager.resource_pool_dict[pool_name(name)],
                                self.use_reference_policy)
            policy.weights.sleep_replicas()
            self.policies.append(policy)
        self._load_checkpoint()

    def get_llm_client(self) -> LLMServerClient:
        """veRL's client; with several policies a :class:`PolicyClients` with each one's client."""
        if not self.several:
            return super().get_llm_client()
        return self.llm_server_manager.get_client(PolicyClients,
                                                  by_policy={p.name: p.servers.get_client() for p in self.policies})

    @contextlib.contextmanager
    def _acting(self, policy: TrainedPolicy) -> Iterator[None]:
        """veRL's methods, run inside, use ``policy``'s worker group and weight sync."""
        saved = self.actor_rollout_wg, getattr(self, "ref_policy_wg", None), self.checkpoint_manager
        self.actor_rollout_wg, self.ref_policy_wg, self.checkpoint_manager = policy.actor_wg, policy.ref_wg, policy.weights
        self._policy = policy
        try:
            yield
        finally:
            self.actor_rollout_wg, self.ref_policy_wg, self.checkpoint_manager = saved
            self._policy = None

    def _each_policy(self) -> Iterator[None]:
        """Once per trained policy, acting as it (once, as itself, with one policy)."""
        if not self.policies:
            yield
            return
        for policy in self.policies:
            with self._acting(policy):
                yield

    def on_init_end(self) -> None:
        for _ in self._each_policy():
            super().on_init_end()

    def on_step_end(self) -> None:
        for _ in self._each_policy():
            super().on_step_end()

    def on_sample_end(self) -> None:
        for _ in self._each_policy():
            super().on_sample_end()

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        """veRL's step; with several policies, the team's rollout, then veRL's pipeline on each
        policy's part of the batch (the samples of its roles) with its worker group."""
        if not self.several:
            return super()._step_once(metrics, timing_raw, sample_batch_size)
        with marked_timer("gen", timing_raw, color="red"):     # as veRL's _step_once samples
            self.on_sample_begin()
            batch, off_policy_metrics = self.replay_buffer.sample(global_steps=self.global_steps,
                                                                  partition_id="train", batch_size=sample_batch_size)
            metrics.update(off_policy_metrics)
            batch.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
            self.on_sample_end()
        if self.reward_loop_manager.reward_loop_worker_handles is None:
            with marked_timer("reward", timing_raw, color="yellow"):
                batch = self._compute_reward_colocate(batch, metrics=metrics)
        fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                  select_fields=["uid", "response_mask", "extra_fields"])
        _, team = step_advantages(fields_to_dataproto(fetched, batch.tags), **advantage_settings(self.config))
        metrics.update({k: team[k] for k in TEAM})
        roles = [(e or {}).get(FIELD_ROLE) for e in fetched["extra_fields"]]
        keys, tags = [], []
        for policy in self.policies:
            mine = [key for key, role in zip(batch.keys, roles) if role in policy.roles]
            part = batch.select_keys(mine)
            own: dict[str, Any] = {"nextstate/samples": 0}
            if mine:
                with self._acting(policy), marked_timer(f"{policy.name}/train", timing_raw, color="blue"):
                    part = self._balance_batch(part, metrics=own)
                    part = self._compute_old_log_prob(part, metrics=own)
                    if self.use_reference_policy:
                        part = self._compute_ref_log_prob(part, metrics=own)
                    part = self._compute_advantage(part, metrics=own)
                    part = self._update_actor(part, metrics=own)
            metrics.update({f"{policy.name}/{k}": v for k, v in local_metrics(own).items() if k not in TEAM})
            metrics["nextstate/samples"] = metrics.get("nextstate/samples", 0) + own["nextstate/samples"]
            keys += part.keys
            tags += part.tags
        return KVBatchMeta(partition_id=batch.partition_id, keys=keys, tags=tags, extra_info=batch.extra_info)

    def _save_checkpoint(self) -> None:
        """veRL's checkpoint; with several policies each policy's actor (model, optimizer, HF
        export) in ``global_step_N/<policy>/``, then the data position and veRL's tracker file."""
        if not self.several:
            return super()._save_checkpoint()
        trainer = self.config.trainer
        folder = os.path.join(trainer.default_local_dir, f"global_step_{self.global_steps}")
        for policy in self.policies:
            policy.actor_wg.save_checkpoint(os.path.join(folder, policy.name), None, self.global_steps,
                                            max_ckpt_to_keep=trainer.get("max_actor_ckpt_to_keep", None))
        os.makedirs(folder, exist_ok=True)
        torch.save(self.train_dataloader.state_dict(), os.path.join(folder, "data.pt"))
        Path(trainer.default_local_dir, "latest_checkpointed_iteration.txt").write_text(str(self.global_steps))
        self.checkpoint_callback.on_save(trainer=self, global_step=self.global_steps, checkpoint_dir=folder,
                                         async_save=False)

    def _load_checkpoint(self) -> None:
        """veRL's resume (with several policies: each policy's actor from its folder, and the data
        position), then the line ``python -m train --resume`` prints (veRL logs it at INFO)."""
        if self._setting_up:
            self.global_steps = 0
            return
        trainer = self.config.trainer
        if not self.several:
            super()._load_checkpoint()
        else:
            self.global_steps = 0
            folder = find_latest_ckpt_path(trainer.default_local_dir) if trainer.resume_mode == "auto" else None
            if folder is not None:
                self.global_steps = int(folder.split("global_step_")[-1])
                for policy in self.policies:
                    policy.actor_wg.load_checkpoint(local_path=os.path.join(folder, policy.name),
                                                    del_local_after_load=trainer.del_local_ckpt_after_load)
                if os.path.exists(data := os.path.join(folder, "data.pt")):
                    self.train_dataloader.load_state_dict(torch.load(data, weights_only=False))
        if trainer.resume_mode != "disable":
            root = Path(trainer.default_local_dir)
            where = root / f"global_step_{self.global_steps}" if self.global_steps else root
            print(resume_line(self.global_steps or None, self.total_training_steps, where),
                  file=sys.stderr, flush=True)
        if self.global_steps:   # the starting point is evaluated at step 0 only, as on the local backend
            with read_write(self.config.trainer):
                self.config.trainer.val_before_train = False

    def _log_row(self, step: int, metrics: dict[str, Any]) -> None:
        """One row of ``<output>/metrics.jsonl`` (and the curves PNG), the log opened on first use."""
        if getattr(self, "_metrics_log", None) is None:
            from nextstate.train.metrics import MetricsLog
            resumed = self.config.trainer.resume_mode != "disable"
            self._metrics_log = MetricsLog(self.config.nextstate.run.output,
                                           resume_step=step - 1 if resumed else None,
                                           members=list(self.policy_roles) if self.several else None)
        self._metrics_log.log(step, metrics)

    # -- metrics, batch size, the actor update, advantages ---------------------------------
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
        ns = self.config.nextstate
        scored = [TEACHER_LOG_PROBS, "old_log_probs", *(["ref_log_prob"] if self.use_reference_policy else [])] \
            if ns.opd.mode != "rl" else []
        fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                  select_fields=["uid", "advantages", "response_mask", "extra_fields", *scored])
        rows = advantage_rows(fetched, batch.tags, self.global_steps, role=ns.train.role,
                              weight=float(ns.judge.weight), policy=self._policy.name if self._policy else None)
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

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        distil = self.config.nextstate.opd.mode != "rl"
        fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                  select_fields=["uid", "response_mask", "extra_fields",
                                                 *(["old_log_probs"] if distil else [])])
        data = fields_to_dataproto(fetched, batch.tags)
        teacher = self._score_teacher(batch, fetched) if distil else None
        data, adv_metrics = step_advantages(data, **advantage_settings(self.config), teacher=teacher)
        metrics.update(adv_metrics)
        nested_mask = fetched["response_mask"]
        out = {name: response_to_nested(data.batch[src], nested_mask)
               for name, src in (("advantages", "advantages"), ("returns", "returns"),
                                 ("response_mask", "response_mask"), ("loss_mask", "response_mask"))}
        if teacher is not None:
            out[TEACHER_LOG_PROBS] = response_to_nested(teacher.log_probs, nested_mask)
        # the returned meta lists every persisted field (the reference log-probs too): the actor
        # update reads the fields it names, so the old meta would train without advantages
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                               fields=TensorDict(out, batch_size=len(batch)))

    def _score_teacher(self, batch: KVBatchMeta, fetched: TensorDict) -> TeacherScores:
        """OPD's teacher log-probs of the hinted samples' responses in their teacher context
        (see module docstring); zeros on the other rows."""
        opd = self.config.nextstate.opd
        padded = fetched.select("old_log_probs", "response_mask").to_padded_tensor()
        old = padded["old_log_probs"].float()
        extras = list(fetched["extra_fields"])
        hinted = np.array([bool((e or {}).get(FIELD_TEACHER_PROMPT)) and not t.get("is_padding", False)
                           for e, t in zip(extras, batch.tags)], dtype=bool)
        teacher = torch.zeros_like(old)
        index = np.flatnonzero(hinted).tolist()
        if index:
            for row, lp in zip(index, self._teacher_log_probs(batch, index, [extras[i][FIELD_TEACHER_PROMPT]
                                                                                for i in index])):
                teacher[row, :len(lp)] = lp
        return TeacherScores(hinted=hinted, log_probs=teacher, old_log_probs=old, weight_opd=float(opd.weight_opd))

    def _teacher_log_probs(self, batch: KVBatchMeta, index: list[int], prompts: list[list[int]]) -> list[torch.Tensor]:
        """Per sample ``batch.keys[i]`` (``i`` in ``index``), the teacher's log-probs of its response
        after ``prompts[i]``: one forward pass on copies in :data:`TEACHER_PARTITION` (padded with
        repeats to a multiple of the worker group's data-parallel size), cleared afterwards."""
        extra: dict[str, Any] = {}
        if self.config.nextstate.opd.teacher == "policy":
            wg, mesh, method = self.actor_rollout_wg, "actor", "compute_log_prob"
        elif self.ref_in_actor:     # veRL's reference is then the actor without its LoRA adapter
            wg, mesh, method, extra = self.actor_rollout_wg, "actor", "compute_log_prob", {"no_lora_adapter": True}
        elif self.use_reference_policy:
            wg, mesh, method = self.ref_policy_wg, "ref", "compute_ref_log_prob"
        else:
            raise RuntimeError("opd.teacher=reference needs veRL's reference worker (the launcher enables it)")
        if mesh not in wg._dispatch_info:        # as veRL's _balance_batch reads the data-parallel size
            wg._dispatch_info[mesh] = wg._query_dispatch_info(mesh)
        dp = max(wg._dispatch_info[mesh]) + 1
        source = tq.kv_batch_get(keys=[batch.keys[i] for i in index], partition_id=batch.partition_id)
        entries = teacher_entries(source, prompts)
        order = [j % len(entries) for j in range(math.ceil(len(entries) / dp) * dp)]
        keys = [f"{batch.keys[index[j]]}.teacher{k}" for k, j in enumerate(order)]
        tags = [{**batch.tags[index[j]], "prompt_len": len(prompts[j]),
                 "seq_len": len(prompts[j]) + batch.tags[index[j]].get("response_len", 0)} for j in order]
        tq.kv_batch_put(keys=keys, partition_id=TEACHER_PARTITION, fields=list_of_dict_to_tensordict(
            [entries[j] for j in order]), tags=tags)
        try:
            info = {**batch.extra_info, "calculate_entropy": False, "compute_loss": False,
                    "temperature": self.config.actor_rollout_ref.rollout.temperature, **extra}
            getattr(wg, method)(KVBatchMeta(keys=keys, tags=tags, partition_id=TEACHER_PARTITION, extra_info=info))
            out = tq.kv_batch_get(keys=keys[:len(entries)], partition_id=TEACHER_PARTITION,
                                  select_fields=["log_probs", "response_mask"])
            return list(response_from_nested(out["log_probs"], out["response_mask"]).unbind())
        finally:
            tq.kv_clear(keys=keys, partition_id=TEACHER_PARTITION)
