"""``python -m train --backend verl``: the composed config is one veRL's own classes accept."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from nextstate.train.config import ConfigError, config_from_dict, load_config
from nextstate.train.verl_backend.launch import compose

REPO = Path(__file__).resolve().parents[1]


def test_dry_run_prints_a_config_verl_accepts(tmp_path):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import FSDPActorConfig, RolloutConfig

    out = subprocess.run([sys.executable, "-m", "train", "--backend", "verl", "--dry-run", "--env", "terminal",
                          "--output", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    config = OmegaConf.create(out.stdout)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert isinstance(actor, FSDPActorConfig) and isinstance(rollout, RolloutConfig)
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert actor.use_kl_loss and actor.kl_loss_coef == 0.01 and actor.kl_loss_type == "low_var_kl"
    assert actor.entropy_coeff == 0 and actor.loss_agg_mode == "token-mean"
    assert actor.optim.lr == 1e-6 and actor.optim.weight_decay == 0.1 and list(actor.optim.betas) == [0.9, 0.98]
    assert actor.optim.lr_scheduler_type == "constant"
    assert rollout.n == 8 and rollout.response_length == 8192 and rollout.temperature == 1.0
    assert rollout.prompt_length + rollout.response_length == 16384
    assert config.data.train_batch_size == 16
    assert config.trainer.v1.trainer_mode == "nextstate" and rollout.agent.default_agent_loop == "nextstate"
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert config_from_dict(OmegaConf.to_container(config.nextstate)).env.max_steps == 10


def test_verl_device_gpu_without_a_gpu_is_a_config_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    from nextstate.train.__main__ import main
    assert main(["--backend", "verl", "--env", "toolcall", "--output", str(tmp_path), "verl.device=gpu"]) == 2


def test_without_an_accelerator_the_cpu_platform_and_hf_rollout_are_composed(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    cpu = compose(load_config("toolcall", cpu_demo=True, overrides=[f"run.output={tmp_path}"]), n_tasks=4)
    assert cpu.actor_rollout_ref.rollout.name == "hf" and cpu.trainer.device == "cpu"
    assert cpu.trainer.n_gpus_per_node == 1 and cpu.ray_kwargs.ray_init.num_gpus == 1
    assert cpu.actor_rollout_ref.actor.strategy == "fsdp2"
    assert cpu.actor_rollout_ref.model.path == str(tmp_path.resolve() / "model")   # "tiny", written at launch
    assert cpu.ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM == "cpu"
    gpu = compose(load_config("toolcall", overrides=[f"run.output={tmp_path}", "verl.device=gpu"]), n_tasks=4)
    assert gpu.actor_rollout_ref.rollout.name == "vllm" and gpu.trainer.n_gpus_per_node == 8
    assert "VERL_PLATFORM" not in gpu.ray_kwargs.ray_init.runtime_env.env_vars


def test_several_policies_compose_one_device_slot_each_and_refuse_the_gpu_rollouts(tmp_path, capsys):
    """Two policies on the CPU device: two of Ray's device slots, the first policy's model in
    veRL's actor section. On a GPU device (vLLM/SGLang) several policies stop with one line."""
    from nextstate.train.__main__ import main
    from nextstate.train.verl_backend.launch import policy_models

    agents = [f"run.output={tmp_path}", "agents.reader=tiny", "agents.writer=/models/writer", "verl.device=cpu"]
    cfg = load_config("relay", overrides=agents)
    assert policy_models(cfg) == {"reader": str(tmp_path.resolve() / "model"), "writer": "/models/writer"}
    untied = load_config("relay", overrides=[*agents[:2], "agents.writer=tiny-untied", "verl.device=cpu"])
    assert policy_models(untied) == {"reader": str(tmp_path.resolve() / "model"),
                                     "writer": str(tmp_path.resolve() / "tiny-untied")}   # each preset its own folder
    config = compose(cfg, n_tasks=4)
    assert config.ray_kwargs.ray_init.num_gpus == 2 and config.trainer.n_gpus_per_node == 1
    assert config.actor_rollout_ref.model.path == str(tmp_path.resolve() / "model")
    shared = compose(load_config("relay", overrides=[f"run.output={tmp_path}", "verl.device=cpu",
                                                     "agents.reader+writer=tiny"]), n_tasks=4)
    assert shared.ray_kwargs.ray_init.num_gpus == 1
    with pytest.raises(ConfigError, match="cpu device only"):
        compose(load_config("relay", overrides=[*agents[:3], "verl.device=gpu"]), n_tasks=4)
    # a role the env does not have, or an agent without a policy: one line, exit 2
    capsys.readouterr()
    for argv, message in [(["--agents", "reader=tiny,critic=tiny"], "has no agent 'critic'"),
                          (["--agents", "reader=tiny"], "no policy plays 'writer'")]:
        assert main(["--backend", "verl", "--env", "relay", "--dry-run", "--output", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_cpu_platform_is_registered_and_chosen_only_by_name(monkeypatch):
    from verl.plugin.platform import PlatformRegistry
    from verl.plugin.platform.platform_manager import _detect_platform_name
    from verl.workers.engine.base import EngineRegistry

    import nextstate.train.verl_backend.plugin  # noqa: F401
    from nextstate.train.verl_backend.cpu import PlatformCPU

    assert PlatformRegistry.get("cpu") is PlatformCPU
    assert not PlatformCPU().is_platform_available(use_smi_check=True)   # never detected
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert _detect_platform_name() != "cpu"
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert _detect_platform_name() == "cpu"
    platform = PlatformCPU()
    assert platform.communication_backend_name() == "gloo" and platform.device_name == "cpu"
    assert EngineRegistry._engines["language_model"]["fsdp2"]["cpu"].__name__ == "CPUFSDPEngineWithLMHead"


def test_auto_device_joining_a_ray_cluster_is_gpu(tmp_path, monkeypatch):
    from nextstate.train.verl_backend.cpu import accelerator_present
    from nextstate.train.verl_backend.launch import on_cpu

    cfg = load_config("toolcall", overrides=[f"run.output={tmp_path}"])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert on_cpu(cfg) == (not accelerator_present())
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")   # a cluster's head: its workers decide the device
    assert not on_cpu(cfg)
    cfg.verl.device = "cpu"
    assert on_cpu(cfg)


def verl_test_file(relative: str) -> Path:
    """A test file of veRL's own suite, as the veRL 0.9.1 wheel installs it (``tests/...``)."""
    from importlib.metadata import distribution

    dist = distribution("verl")
    match = [f for f in dist.files or [] if str(f) == relative]
    if not match:
        pytest.skip(f"the installed veRL has no {relative}")
    return Path(dist.locate_file(match[0]))


@pytest.mark.slow
def test_verls_own_platform_tests_pass_with_the_plugin_installed(tmp_path):
    """veRL's ``tests/plugin/test_platform_abstraction.py``, unmodified, with the nextstate plugin
    loaded through its ``verl.plugins`` entry point (as on any host where nextstate is installed)."""
    path = verl_test_file("tests/plugin/test_platform_abstraction.py")
    env = {**os.environ, "PYTHONPATH": str(REPO), "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    for name in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES"):
        env.pop(name, None)
    code = ("import sys, pytest, verl\n"
            "from verl.plugin.platform import PlatformRegistry\n"
            "print('registered', PlatformRegistry.registered_names(), flush=True)\n"
            f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--rootdir', {str(tmp_path)!r}, {str(path)!r}]))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=900)
    assert "'cpu'" in out.stdout.split("\n", 1)[0], out.stdout[-2000:] + out.stderr[-2000:]   # the plugin is loaded
    assert out.returncode == 0, out.stdout[-3000:]
    assert " passed" in out.stdout and "failed" not in out.stdout


def test_compose_reports_bad_hydra_overrides_as_config_errors(tmp_path):
    cfg = load_config("terminal", overrides=["verl.overrides=[actor_rollout_ref.actor.no_such_key=1]",
                                             f"run.output={tmp_path}"])
    with pytest.raises(ConfigError, match="veRL config"):
        compose(cfg, n_tasks=4)


def test_task_data_is_what_verls_dataset_reads(tmp_path):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from nextstate.agents.tiny import load_tokenizer
    from nextstate.train.wiring import load_tasks
    from nextstate.train.verl_backend.launch import data_path, write_task_data

    cfg = load_config("toolcall", overrides=[f"run.output={tmp_path}", "verl.n_gpus_per_node=1"])
    tasks = load_tasks(cfg)
    path = write_task_data(tasks, data_path(cfg), "toolcall")
    config = compose(cfg, n_tasks=len(tasks))
    assert config.data.train_files == str(path)
    data = RLHFDataset(data_files=str(path), tokenizer=load_tokenizer(), config=config.data)
    assert len(data) == len(tasks)
    row = data[1]
    assert row["extra_info"]["task_id"] == tasks[1].id and row["index"] == 1
    assert row["agent_name"] == "nextstate"
    assert row["raw_prompt"] == [{"role": "user", "content": tasks[1].instruction}]


@pytest.fixture
def restored_environ():
    """The launcher exports its run's variables (``VERL_PLATFORM``, the run id) into ``os.environ``."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _launch_fails_in_one_line(tmp_path, capsys) -> str:
    from nextstate.train.__main__ import main

    assert main(["--backend", "verl", "--env", "toolcall", "--model", "tiny", "--output", str(tmp_path),
                 "verl.device=cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()        # veRL's validate_config says it passed, then:
    assert err[-1].startswith("error: ") and not (tmp_path / "model").exists()   # before writing or starting anything
    return err[-1]


def test_launch_stops_when_the_plugin_did_not_register_its_agent_loop(tmp_path, capsys, monkeypatch,
                                                                      restored_environ):
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    import nextstate.train.verl_backend.plugin  # noqa: F401
    monkeypatch.delitem(_agent_loop_registry, "nextstate")      # as when veRL swallowed a plugin error
    err = _launch_fails_in_one_line(tmp_path, capsys)
    assert err.startswith("error: the nextstate plugin did not register agent loop 'nextstate'"), err


def test_launch_stops_when_the_plugin_fails_to_import(tmp_path, capsys, monkeypatch, restored_environ):
    from nextstate.train.verl_backend import launch
    monkeypatch.setattr(launch, "PLUGIN_MODULE", "nextstate.train.verl_backend.no_such_plugin")   # an import that fails
    err = _launch_fails_in_one_line(tmp_path, capsys)
    assert err.startswith("error: the nextstate plugin for veRL (nextstate.train.verl_backend.no_such_plugin) failed to load: "
                          "ModuleNotFoundError"), err


def test_a_run_with_an_sft_section_trains_from_its_warm_start(tmp_path):
    cfg = load_config("terminal", cpu_demo=True, overrides=[f"run.output={tmp_path}", "sft.steps=4",
                                                            "sft.tasks=procedural:0:8", "verl.device=cpu"])
    config = compose(cfg, n_tasks=4)
    assert config.actor_rollout_ref.model.path == str(tmp_path.resolve() / "warm_start")   # the local run's too


@pytest.mark.parametrize("every, steps, test_freq", [(5, 20, 5), (0, 7, 7)])
def test_the_eval_section_is_veRLs_validation_schedule_and_the_seed_its_seeds(tmp_path, every, steps, test_freq):
    cfg = load_config("terminal", cpu_demo=True, overrides=[f"run.output={tmp_path}", f"run.steps={steps}",
                                                            f"eval.every={every}", "run.seed=3"])
    config = compose(cfg, n_tasks=4)
    # held-out evaluation before the first step, every eval.every steps and after the last
    assert config.trainer.val_before_train is True and config.trainer.test_freq == test_freq
    assert config.data.seed == 3 and config.actor_rollout_ref.rollout.seed == 3
    cfg.eval.tasks = None
    config = compose(cfg, n_tasks=4)
    assert config.trainer.val_before_train is False and config.trainer.test_freq == -1


def test_opd_with_the_reference_as_teacher_gets_veRLs_reference_worker_even_without_kl(tmp_path):
    from verl.trainer.ppo.utils import need_reference_policy

    def composed(*over):
        cfg = load_config("terminal", cpu_demo=True, overrides=[f"run.output={tmp_path}", "train.kl_coef=0", *over])
        return compose(cfg, n_tasks=4)

    teacher = composed("opd.mode=combine", "opd.teacher=reference")
    assert need_reference_policy(teacher) and teacher.actor_rollout_ref.actor.kl_loss_coef == 0
    assert not need_reference_policy(composed())                                   # rl, no KL: none
    assert not need_reference_policy(composed("opd.mode=opd", "opd.teacher=policy"))   # the actor scores
    assert teacher.nextstate.opd.mode == "combine"        # the agent loop and trainer mode read it here
