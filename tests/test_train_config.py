"""Config files, overrides, and the one-line errors of ``python -m train`` (exit code 2)."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nextstate.agents.testing import ScriptedOpenAIServer
from nextstate.train.__main__ import main
from nextstate.train.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


def test_paper_settings_per_environment():
    t = load_config("terminal")
    assert (t.rollout.tasks_per_step, t.rollout.samples_per_task, t.env.max_steps) == (16, 8, 10)
    assert (t.train.lr, t.train.weight_decay, t.train.betas) == (1e-6, 0.1, [0.9, 0.98])
    assert (t.rollout.temperature, t.rollout.max_response_tokens, t.rollout.max_context_tokens) == (1.0, 8192, 16384)
    assert (t.judge.votes, t.judge.temperature, t.judge.weight) == (1, 0.6, 1.0)
    assert (t.train.clip_low, t.train.clip_high, t.train.kl_coef, t.train.kl_type) == (0.2, 0.28, 0.01, "low_var_kl")
    s, g, c = load_config("swe"), load_config("gui"), load_config("toolcall")
    assert (s.rollout.tasks_per_step, s.rollout.samples_per_task, s.env.max_steps) == (8, 8, 20)
    assert (g.rollout.tasks_per_step, g.rollout.samples_per_task, g.env.max_steps, g.judge.votes) == (8, 8, 30, 3)
    assert (c.rollout.tasks_per_step, c.rollout.samples_per_task) == (32, 8)


def test_cpu_demo_section_and_typed_overrides():
    cfg = load_config("gui", cpu_demo=True, overrides=["train.lr=1e-5", "train.betas=[0.8,0.9]",
                                                       "advantage.drop_constant=true", "judge.url=null"])
    assert cfg.model.name == "tiny" and cfg.rollout.samples_per_task == 2 and cfg.judge.votes == 1
    assert cfg.train.lr == 1e-5 and cfg.train.betas == [0.8, 0.9] and cfg.advantage.drop_constant is True
    assert cfg.judge.url is None


@pytest.mark.parametrize("overrides, message", [
    (["train.lrr=1"], "unknown config key 'train.lrr'"),
    (["nope.x=1"], "unknown config key 'nope'"),
    (["train.lr=fast"], "cannot use 'fast' as float"),
    (["rollout.parallel=0"], "--parallel must be at least 1"),
    (["advantage.key=magic"], "advantage.key must be one of"),
    (["train"], "expected section.key=value"),
])
def test_bad_overrides_raise_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config("terminal", overrides=overrides)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv, message", [
    (["--env", "chess"], "unknown env 'chess'"),
    (["--parallel", "0"], "--parallel must be at least 1"),
    (["--model", "/no/such/model"], "model path '/no/such/model' does not exist"),
    (["train.nope=1"], "unknown config key 'train.nope'"),
    (["--backend", "spark"], "--backend must be local or verl"),
    (["--judge", "maybe"], "--judge must be policy, rules, none or an http"),
    (["--config", "/no/such.yaml"], "cannot read config file"),
])
def test_cli_errors_are_one_line_with_exit_code_2(argv, message, capsys):
    assert main(["--env", "terminal", *argv] if "--env" not in argv else argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_judge_url_that_does_not_answer_is_refused_at_startup(capsys):
    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["--env", "terminal", "--judge", url, "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert f"judge URL {url} does not answer" in err and err.count("\n") == 1


def test_judge_url_that_answers_passes_the_probe(tmp_path, capsys):
    with ScriptedOpenAIServer("\\boxed{1}") as server:
        assert main(["--env", "terminal", "--judge", server.url, "--model", "tiny", "--dry-run",
                     "--output", str(tmp_path)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["judge"] == {**printed["judge"], "mode": "url", "url": server.url}


def test_dry_run_prints_the_local_config(capsys):
    assert main(["--env", "swe", "--model", "tiny", "--dry-run", "--parallel", "3", "run.seed=7"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["env"]["family"] == "swe" and printed["rollout"]["parallel"] == 3
    assert printed["run"]["seed"] == 7 and printed["run"]["output"] == "runs/swe"


def test_the_module_exits_2_from_a_shell():
    out = subprocess.run([sys.executable, "-m", "train", "--env", "chess"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: unknown env 'chess'; choose one of terminal, toolcall, swe, gui, relay"]
