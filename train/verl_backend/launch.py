"""``python -m train --backend verl``: veRL's Hydra config from ours, the task data, the Ray launch.

The config is veRL's own ``ppo_trainer`` composed with Hydra and overridden
from :class:`train.config.Config` (FSDP actor and reference, vLLM or SGLang
rollout, n samples per task, lengths, clip 0.2/0.28, KL loss 0.01
``low_var_kl``, constant lr, AdamW betas and weight decay), the V1 trainer
in the ``nextstate`` mode, the ``nextstate`` agent loop as the default, and
our whole config under a ``nextstate`` key for the agent loop and trainer.
``verl.overrides`` adds raw Hydra overrides last. It is checked with veRL's
own ``validate_config`` and its config dataclasses before anything starts.

Without an accelerator (``verl.device=auto`` on a CPU-only host that starts
its own Ray cluster, or ``verl.device=cpu``) the run asks for the ``cpu``
platform (``VERL_PLATFORM=cpu`` in every process; never detected) and the ``hf``
rollout of the plugin (:mod:`~train.verl_backend.cpu`,
:mod:`~train.verl_backend.hf_rollout`): one trainer process, float32 FSDP
without torch.compile, gradient checkpointing or padding removal, one
agent-loop and one reward worker, and a small local Ray cluster
(:func:`cpu_overrides`). The GPU settings are untouched.

The task data veRL reads is one parquet file of rows
``{data_source, prompt, agent_name, extra_info: {index, task_id}}``; the
agent loop looks the task up by id.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

from nextstate.agents.presets import PRESETS
from nextstate.train.config import Config, ConfigError, policy_roles
from nextstate.train.wiring import load_tasks
from nextstate.train.verl_backend import RUN_ENV
from nextstate.train.verl_backend.nodes import clean_cluster, clean_node

PLUGIN_MODULE = "nextstate.train.verl_backend.plugin"
CPU_RAY_LOGICAL_CPUS = 16                     # Ray's logical CPU count: placement only, not cores
CPU_RAY_OBJECT_STORE = 512 * 1024 * 1024
STOP_GRACE = 30.0                             # seconds the run's processes get to exit after ray.shutdown()


def on_cpu(cfg: Config) -> bool:
    """Whether the run asks for the CPU platform: ``verl.device=cpu``, or ``auto`` on a host with no
    accelerator that starts its own Ray cluster (with ``RAY_ADDRESS`` set the run joins a cluster,
    which ``auto`` takes for a GPU one: its head node need not have a GPU itself)."""
    if cfg.verl.device != "auto":
        return cfg.verl.device == "cpu"
    from nextstate.train.verl_backend.cpu import accelerator_present
    return not accelerator_present() and not os.environ.get("RAY_ADDRESS")


def model_path(cfg: Config, name: str | None = None) -> str:
    """What veRL loads (and its reference model is) for the policy ``name`` of ``agents`` (default
    ``model.name``): the run's warm start when ``sft.steps > 0`` (made or reused before veRL
    starts, as on the local backend: ``warm_start/<name>`` per policy with ``agents``), for a
    preset its checkpoint directory (:func:`preset_dir`: one model for every policy that asks
    for it, as on the local backend), else the model name."""
    if cfg.sft.steps > 0:
        start = Path(cfg.run.output).resolve() / "warm_start"
        return str(start / name if cfg.agents and name else start)
    model = cfg.agents.get(name, cfg.model.name) if name else cfg.model.name
    return str(preset_dir(cfg, model)) if model in PRESETS else model


def preset_dir(cfg: Config, preset: str) -> Path:
    """Where veRL loads the preset ``preset`` (:data:`agents.presets.PRESETS`) from: its cached
    checkpoint (``smollm2``), else the folder the run writes it to (``tiny``: drawn from the run's seed)."""
    cached = PRESETS[preset].cached
    return cached() if cached else Path(cfg.run.output).resolve() / ("model" if preset == "tiny" else preset)


def policy_models(cfg: Config) -> dict[str, str]:
    """The trained policies of a run (:func:`~train.config.policy_roles`) and what each loads."""
    return {name: model_path(cfg, name if cfg.agents else None) for name in policy_roles(cfg)}


def cpu_overrides(cfg: Config) -> list[str]:
    """The veRL settings of a run on host CPUs (see the module docstring).

    One trainer process per policy, each holding one logical device slot (``ray.init(num_gpus=N)``
    for N policies, see :mod:`train.verl_backend.cpu`); the agent loop, reward and rollout
    workers need none.
    """
    fp32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    out = ["trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
           "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.dtype=fp32",
           "actor_rollout_ref.rollout.agent.num_workers=1", "reward.num_workers=1",
           "actor_rollout_ref.model.enable_gradient_checkpointing=false",
           "actor_rollout_ref.model.use_remove_padding=false",
           "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
           "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
           f"ray_kwargs.ray_init.num_cpus={CPU_RAY_LOGICAL_CPUS}",
           f"+ray_kwargs.ray_init.num_gpus={len(policy_roles(cfg))}",
           f"+ray_kwargs.ray_init.object_store_memory={CPU_RAY_OBJECT_STORE}",
           "+ray_kwargs.ray_init.include_dashboard=false"]
    for role in ("actor", "ref"):
        out += [f"actor_rollout_ref.{role}.strategy=fsdp2", f"actor_rollout_ref.{role}.fsdp_config.strategy=fsdp2",
                f"actor_rollout_ref.{role}.use_torch_compile=false",
                f"actor_rollout_ref.{role}.fsdp_config.use_torch_compile=false",
                f"actor_rollout_ref.{role}.fsdp_config.model_dtype=fp32",
                f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision={fp32}"]
    return out


def import_root() -> str:
    """The ``sys.path`` entries ``nextstate`` was imported from (site-packages, or a folder on
    ``PYTHONPATH``): Ray's workers get them on ``PYTHONPATH`` to import the plugin. An editable
    install adds none: its finder is loaded by a ``.pth`` file in every process of the interpreter."""
    import nextstate
    return os.pathsep.join(str(Path(p).parent) for p in nextstate.__path__ if Path(p).is_dir())


def data_path(cfg: Config) -> Path:
    """Where the run's task parquet goes."""
    return Path(cfg.run.output).resolve() / "data" / "tasks.parquet"


def write_task_data(tasks: list[Any], path: Path, family: str) -> Path:
    """The parquet file veRL's dataset reads: one row per task."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": f"nextstate/{family}", "agent_name": "nextstate",
             "prompt": [{"role": "user", "content": t.instruction}],
             "reward_model": {"style": "env", "ground_truth": ""},
             "extra_info": {"index": i, "task_id": t.id}} for i, t in enumerate(tasks)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)
    return path


def eval_overrides(cfg: Config) -> list[str]:
    """veRL's validation schedule for the ``eval`` section: before the first step, every
    ``eval.every`` steps and after the last (the ``nextstate`` mode runs the held-out
    evaluation there); off without ``eval.tasks``."""
    if not cfg.eval.tasks:
        return ["trainer.val_before_train=false", "trainer.test_freq=-1"]
    every = cfg.eval.every if cfg.eval.every > 0 else cfg.run.steps   # veRL validates after the last step too
    return ["trainer.val_before_train=true", f"trainer.test_freq={every}"]


def needs_reference(cfg: Config) -> bool:
    """Whether veRL makes its reference worker: for the KL loss (``train.kl_coef > 0``) or as
    OPD's teacher (``opd.teacher=reference``; with ``kl_coef`` 0 the KL term then weighs 0)."""
    return cfg.train.kl_coef > 0 or (cfg.opd.mode != "rl" and cfg.opd.teacher == "reference")


def hydra_overrides(cfg: Config, n_tasks: int, resume: bool) -> list[str]:
    """veRL config overrides that carry our settings."""
    r, t, v = cfg.rollout, cfg.train, cfg.verl
    out = Path(cfg.run.output).resolve()
    data = data_path(cfg)
    prompt_len = max(1, r.max_context_tokens - r.max_response_tokens)
    epochs = math.ceil(cfg.run.steps * r.tasks_per_step / max(1, n_tasks)) + 1
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
        f"data.train_files={data}", f"data.val_files={data}",
        f"data.train_batch_size={r.tasks_per_step}",
        f"data.max_prompt_length={prompt_len}", f"data.max_response_length={r.max_response_tokens}",
        "data.return_raw_chat=true", "data.filter_overlong_prompts=false", "data.dataloader_num_workers=0",
        f"data.seed={cfg.run.seed}", f"{rollout}.seed={cfg.run.seed}",
        f"actor_rollout_ref.model.path={next(iter(policy_models(cfg).values()))}",   # the first policy's
        f"{actor}.optim.lr={t.lr}", f"{actor}.optim.weight_decay={t.weight_decay}",
        f"{actor}.optim.betas=[{t.betas[0]},{t.betas[1]}]", f"{actor}.optim.lr_scheduler_type=constant",
        f"{actor}.optim.clip_grad={t.grad_clip}",
        f"{actor}.clip_ratio={t.clip_low}", f"{actor}.clip_ratio_low={t.clip_low}",
        f"{actor}.clip_ratio_high={t.clip_high}", f"{actor}.policy_loss.loss_mode=vanilla",
        f"{actor}.use_kl_loss={str(needs_reference(cfg)).lower()}", f"{actor}.kl_loss_coef={t.kl_coef}",
        f"{actor}.kl_loss_type={t.kl_type}", f"{actor}.entropy_coeff={t.entropy_coef}",
        f"{actor}.loss_agg_mode={t.loss_agg_mode}", f"{actor}.ppo_epochs=1",
        f"{actor}.ppo_mini_batch_size={r.tasks_per_step}",   # the trainer mode sets it per step (updates_per_step)
        f"{actor}.ppo_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        f"{actor}.fsdp_config.param_offload={str(v.param_offload).lower()}",
        f"{actor}.fsdp_config.optimizer_offload={str(v.param_offload).lower()}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        f"actor_rollout_ref.ref.fsdp_config.param_offload={str(v.param_offload).lower()}",
        f"{rollout}.name={v.rollout_engine}", f"{rollout}.mode=async", f"{rollout}.n={r.samples_per_task}",
        f"{rollout}.temperature={r.temperature}", f"{rollout}.top_p={r.top_p}",
        f"{rollout}.prompt_length={prompt_len}", f"{rollout}.response_length={r.max_response_tokens}",
        f"{rollout}.tensor_model_parallel_size={v.tensor_parallel_size}",
        f"{rollout}.gpu_memory_utilization={v.gpu_memory_utilization}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        f"{rollout}.calculate_log_probs=true",
        f"{rollout}.agent.default_agent_loop=nextstate", f"{rollout}.agent.num_workers={v.agent_workers}",
        "trainer.use_v1=true", "trainer.v1.trainer_mode=nextstate",
        f"trainer.total_training_steps={cfg.run.steps}", f"trainer.total_epochs={epochs}",
        f"trainer.save_freq={cfg.run.save_every}", f"trainer.max_actor_ckpt_to_keep={cfg.run.keep_checkpoints}",
        f"trainer.default_local_dir={out / 'checkpoints'}", f"trainer.resume_mode={'auto' if resume else 'disable'}",
        "trainer.logger=[console]", "trainer.project_name=nextstate",
        f"trainer.experiment_name={cfg.env.family}", *eval_overrides(cfg),
        f"trainer.nnodes={v.nnodes}", f"trainer.n_gpus_per_node={v.n_gpus_per_node}",
        *(cpu_overrides(cfg) if on_cpu(cfg) else []),
        *v.overrides,
    ]


def compose(cfg: Config, n_tasks: int, resume: bool = False) -> Any:
    """veRL's ``ppo_trainer`` config with our overrides and ``nextstate`` section, validated."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if len(policy_roles(cfg)) > 1 and not on_cpu(cfg):
        raise ConfigError("several policies (--agents) on --backend verl run on the cpu device only for now: veRL "
                          "0.9.1's vLLM/SGLang rollout finds its server by a name without the policy (see docs/verl.md)")
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            config = hydra_compose(config_name="ppo_trainer", overrides=hydra_overrides(cfg, n_tasks, resume))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"veRL config: {str(e).splitlines()[0]}") from None
    OmegaConf.set_struct(config, False)
    config.nextstate = {k: v for k, v in cfg.to_dict().items() if k != "verl"}
    config.nextstate.run.output = str(Path(cfg.run.output).resolve())
    env_vars = {"VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE, RUN_ENV: uuid.uuid4().hex[:12],
                "PYTHONPATH": os.pathsep.join(filter(None, [import_root(), os.environ.get("PYTHONPATH")]))}
    if on_cpu(cfg):
        env_vars["VERL_PLATFORM"] = "cpu"
    config.ray_kwargs.ray_init.runtime_env.env_vars = env_vars
    OmegaConf.set_struct(config, True)
    validate(config)
    return config


def validate(config: Any) -> None:
    """veRL's own checks: ``validate_config`` and its actor/rollout/algorithm dataclasses."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # "critic disabled": intended, GRPO-style
            validate_config(config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
        omega_conf_to_dataclass(config.actor_rollout_ref.actor)
        omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(config.algorithm)
    except (AssertionError, ValueError, TypeError) as e:
        raise ConfigError(f"veRL rejected the config: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def launch(cfg: Config, *, dry_run: bool = False, resume: bool = False) -> int:
    """Print the composed config (``dry_run``) or write the data and run veRL's trainer on Ray.

    Before veRL starts, dead runs' sandboxes are removed; the local Ray cluster this starts is
    shut down on the way out, the run's processes that outlive it are stopped and its
    agent-loop workers' sandboxes removed (by their run label). On a cluster (``RAY_ADDRESS``)
    both happen on every node (:mod:`~train.verl_backend.nodes`).
    """
    from omegaconf import OmegaConf

    tasks = load_tasks(cfg)
    config = compose(cfg, len(tasks), resume)
    if dry_run:
        print(OmegaConf.to_yaml(config), end="")
        return 0
    cpu = on_cpu(cfg)
    if not cpu:
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("verl.device=gpu but no GPU is visible; use verl.device=auto (cpu), "
                              "--backend local, or --dry-run")
    env_vars = dict(config.ray_kwargs.ray_init.runtime_env.env_vars)
    os.environ.update(env_vars)
    check_plugin(cpu)
    output = Path(cfg.run.output).resolve()
    if cfg.sft.steps > 0:
        from nextstate.train.sft import warm_starts
        warm_starts(cfg, output / "warm_start")
    else:
        for preset in PRESETS.keys() & {cfg.model.name, *cfg.agents.values()}:
            if not (preset_dir(cfg, preset) / "config.json").is_file():
                PRESETS[preset].save(preset_dir(cfg, preset), cfg.run.seed)
    write_task_data(tasks, data_path(cfg), cfg.env.family)
    import ray
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    where = "this host's CPUs (hf rollout)" if cpu else f"{cfg.verl.nnodes}x{cfg.verl.n_gpus_per_node} GPUs"
    models = ",".join(f"{k}={v}" for k, v in cfg.agents.items()) or cfg.model.name
    print(f"nextstate train: env={cfg.env.family} model={models} backend=verl on {where}, "
          f"steps={cfg.run.steps} tasks x samples={cfg.rollout.tasks_per_step}x{cfg.rollout.samples_per_task} "
          f"output={output}", file=sys.stderr)
    started_ray = not ray.is_initialized()
    clean_up(None, started_ray)
    try:
        run_ppo(config, task_runner_class=TaskRunnerV1)
    finally:
        if started_ray and ray.is_initialized():
            ray.shutdown()
        clean_up(env_vars[RUN_ENV], started_ray)
    print(f"done: metrics {output / 'metrics.jsonl'}, rollouts {output / 'rollouts*.jsonl'}, "
          f"plot {output / 'curves.png'}, checkpoints {output / 'checkpoints'}", file=sys.stderr)
    return 0


def clean_up(run_id: str | None, started_ray: bool) -> None:
    """:func:`~train.verl_backend.nodes.clean_node` (dead runs' sandboxes before the run, the
    run's processes and sandboxes after it) on every node of the cluster at ``RAY_ADDRESS``,
    else on this host. The run's processes are left alone when the caller owns the Ray session
    (``started_ray`` false)."""
    grace = STOP_GRACE if started_ray else None
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        clean_node(run_id, grace)
        return
    path = os.pathsep.join(filter(None, [import_root(), os.environ.get("PYTHONPATH")]))
    try:
        done = clean_cluster(run_id, address=address, grace=grace, env_vars={"PYTHONPATH": path})
    except Exception as e:  # noqa: BLE001 - the cluster is gone: nothing of the run can be left on it
        print(f"nextstate: clean-up on the Ray cluster at {address} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return
    for node, result in done.items():
        if result["error"] and run_id is not None:
            print(f"nextstate: node {node[:8]} ({result['engine']}): sandboxes not removed: {result['error']}",
                  file=sys.stderr)


def unregistered(cpu: bool) -> list[str]:
    """What the plugin should have registered in veRL's registries and did not."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    wanted = {"agent loop 'nextstate'": lambda: "nextstate" in _agent_loop_registry,
              "trainer mode 'nextstate'": _trainer_registered}
    if cpu:
        wanted.update({"platform 'cpu'": lambda: PlatformRegistry.get("cpu") is not None,
                       "rollout 'hf'": lambda: ("hf", "async") in _ROLLOUT_REGISTRY})
    return [name for name, present in wanted.items() if not present()]


def _trainer_registered() -> bool:
    try:
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    except ImportError:       # veRL without its TransferQueue trainer stack
        return False
    return "nextstate" in TRAINER_REGISTRY


def check_plugin(cpu: bool) -> None:
    """Load the plugin and check that veRL's registries hold what it registers.

    veRL loads ``verl.plugins`` entry points at ``import verl`` and logs a failure at
    debug level only, so a broken plugin would run stock veRL without a word; this
    raises a one-line :class:`ConfigError` (exit 2) instead.
    """
    try:
        importlib.import_module(PLUGIN_MODULE)
    except Exception as e:  # noqa: BLE001 - any import failure is reported, in one line
        raise ConfigError(f"the nextstate plugin for veRL ({PLUGIN_MODULE}) failed to load: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    missing = unregistered(cpu)
    if missing:
        raise ConfigError(f"the nextstate plugin did not register {', '.join(missing)} with veRL "
                          "(the verl backend needs veRL's agent-loop and TransferQueue stack: install the gpu extra)")
