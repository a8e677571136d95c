"""Several trained policies in one veRL trainer (``--agents reader=M1,writer=M2``), from veRL's own parts.

veRL 0.9.1's trainer holds one actor worker group, one set of rollout servers
and one weight sync. The ``nextstate`` trainer mode keeps veRL's for the first
policy and adds, for each further one, the same three parts built with veRL's
public classes (:func:`add_policy`), on the policy's own resource pool:

* an actor (+ reference) worker group of veRL's ``ActorRolloutRefWorker``
  (``RayClassWithInitArgs``, ``create_colocated_worker_cls``, ``RayWorkerGroup``),
  its model the policy's, its workers told the policy's name (``NEXTSTATE_POLICY``);
* rollout servers for that worker group (:class:`PolicyServerManager`: veRL's
  ``LLMServerManager`` whose replicas carry the policy's name, so the Ray actor
  names of two policies' servers differ);
* veRL's ``CheckpointEngineManager`` between the two.

:class:`PolicyClients` is the LLM client the agent loops get: veRL's client for
the first policy, with one client per policy in ``by_policy``; the
``nextstate`` agent loop sends each role's generations to its policy's servers.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, open_dict
from verl.checkpoint_engine import CheckpointEngineManager
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls
from verl.trainer.ppo.utils import Role
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.llm_server import LLMServerClient, LLMServerManager
from verl.workers.rollout.replica import get_rollout_replica_class

from nextstate.train.verl_backend import POLICY_ENV


def pool_name(policy: str) -> str:
    """The Ray resource pool of a second or later policy (the first uses veRL's ``global_pool``)."""
    return f"policy_{policy}_pool"


@dataclass
class TrainedPolicy:
    """One trained policy of a veRL run: the roles it plays and its veRL parts."""

    name: str
    roles: tuple[str, ...]
    actor_wg: Any                       # veRL's actor (+ reference) RayWorkerGroup
    ref_wg: Any                         # the same group when a reference is used, else None
    servers: LLMServerManager
    weights: CheckpointEngineManager    # actor -> rollout server weight sync


class PolicyServerManager(LLMServerManager):
    """veRL's ``LLMServerManager`` for one policy of several: its replicas get the policy's name
    as ``name_suffix`` (veRL's ``rollout_replica_class`` hook), so their server actors are named
    apart from the first policy's."""

    def __init__(self, config: DictConfig, worker_group: RayWorkerGroup | None = None,
                 rollout_resource_pool: Any = None, *, policy: str, **kwargs: Any):
        rollout = config.actor_rollout_ref.rollout
        self.rollout_replica_class = functools.partial(
            get_rollout_replica_class(rollout.name, disaggregation_enabled=rollout.disaggregation.enabled),
            name_suffix=policy)
        super().__init__(config, worker_group, rollout_resource_pool, **kwargs)


class PolicyClients(LLMServerClient):
    """veRL's LLM client (on the first policy's servers) plus ``by_policy``: each policy's client."""

    def __init__(self, config: DictConfig, load_balancer_handle: Any = None, *,
                 by_policy: dict[str, LLMServerClient], **kwargs: Any):
        super().__init__(config, load_balancer_handle, **kwargs)
        self.by_policy = by_policy


def policy_config(config: DictConfig, model: str) -> DictConfig:
    """A copy of the run's veRL config whose actor, reference and rollout load ``model``."""
    out = copy.deepcopy(config)
    with open_dict(out):
        out.actor_rollout_ref.model.path = model
    return out


def add_policy(name: str, roles: tuple[str, ...], model: str, config: DictConfig, worker_role: Role,
               worker_cls: Any, pool: Any, use_reference: bool) -> TrainedPolicy:
    """The actor/reference worker group (veRL role ``worker_role``, class ``worker_cls``), rollout
    servers and weight sync of policy ``name`` on ``pool``, the way veRL's ``PPOTrainer._setup``
    makes the first policy's (see module docstring)."""
    config = policy_config(config, model)
    role = str(worker_role)
    cls = RayClassWithInitArgs(cls=worker_cls, config=config.actor_rollout_ref,
                               distillation_config=config.get("distillation"), role=role)
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(class_dict={role: cls}),
                           device_name=config.trainer.device, worker_env={POLICY_ENV: name})
    actor = group.spawn(prefix_set=[role])[role]
    actor.init_model()
    servers = PolicyServerManager.create(config=config, worker_group=actor, rollout_resource_pool=pool, policy=name)
    sync = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
    sync.backend = "naive"      # as veRL's trainer sets it for its own actor
    weights = CheckpointEngineManager(config=sync, actor_wg=actor, replicas=servers.get_replicas())
    return TrainedPolicy(name, roles, actor, actor if use_reference else None, servers, weights)
