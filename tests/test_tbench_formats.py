"""Real terminal-bench and Harbor task layouts, as written: the fixture tasks in
tests/fixtures/terminal_tasks carry the traps of the public task sets (a compose-built
image on a ``FROM ghcr.io/laude-institute/t-bench/...`` base, ``solution.yaml`` typed into
tmux, a ``run-tests.sh``/``test.sh`` that downloads uv, Harbor's reward files)."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest

from containers.build import base_images, build_image, resolve_from
from envs.__main__ import main
from envs.base import play
from containers.sandbox import SandboxConfigError
from envs.terminal import (BUILTIN_TASKS, TerminalEnv, harbor_outcome, load_terminal_tasks,
                           parse_pytest_summary)
from envs.validate import validate

FIXTURES = Path(__file__).parent / "fixtures" / "terminal_tasks"


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# -- loading (no Docker) ------------------------------------------------------------------------
def test_both_formats_load_as_written() -> None:
    tasks = {t.id: t for t in load_terminal_tasks(FIXTURES)}
    assert set(tasks) == {"tb-compose-uv", "tb-solution-yaml", "harbor-reward-txt",
                          "harbor-compose-json", "harbor-uv-fallback"}
    tb = tasks["tb-compose-uv"].data
    assert tb["format"] == "terminal-bench" and tb["user"] == "root"
    assert tb["build"] == {"context": str(FIXTURES / "tb-compose-uv" / "env"), "dockerfile": "Dockerfile"}
    assert tb["env"] == {"TEST_DIR": "/tests", "FIXTURE_MARKER": "from-compose"}
    keys = tasks["tb-solution-yaml"].data["solution_keys"]
    assert [k["command"] for k in keys][:3] == ["cd /app && vim note.txt", "iHello from vim", "Escape"]
    assert keys[1]["append_enter"] is False and keys[-1]["block"] is True
    harbor = tasks["harbor-reward-txt"]
    assert harbor.instruction.startswith("Write the words") and harbor.data["format"] == "harbor"
    assert (harbor.data["max_agent_timeout_sec"], harbor.data["max_test_timeout_sec"]) == (90.0, 45.0)
    assert harbor.data["network"] is False and harbor.data["memory"] == "1024m"
    compose = tasks["harbor-compose-json"].data
    assert compose["build"]["context"] == str(FIXTURES / "harbor-compose-json" / "environment")
    assert compose["env"] == {"FIXTURE_SERVICE": "main"}


def test_builtin_tasks_keep_the_agent_user() -> None:
    env = TerminalEnv()
    assert all("user" not in t.data for t in env.tasks)
    assert "user" not in env.sandbox_overrides(env.tasks[0])
    assert TerminalEnv(user="root").sandbox_overrides(env.tasks[0])["user"] == "root"
    env.close()


def test_tmux_tool_is_optional() -> None:
    names = lambda env: [t["function"]["name"] for t in env.tools]  # noqa: E731
    assert "tmux" not in names(TerminalEnv())
    assert names(TerminalEnv(tmux=True)) == ["bash", "write_file", "tmux", "finish"]


def test_broken_tasks_are_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "no-instruction").mkdir()
    (tmp_path / "no-instruction" / "task.yaml").write_text("difficulty: easy\n")
    (tmp_path / "bad-toml").mkdir()
    (tmp_path / "bad-toml" / "task.toml").write_text("[agent\n")
    (tmp_path / "no-md").mkdir()
    (tmp_path / "no-md" / "task.toml").write_text("[agent]\ntimeout_sec = 5\n")
    broken: list[tuple[str, str]] = []
    assert load_terminal_tasks(tmp_path, broken) == []
    assert [name for name, _ in broken] == ["bad-toml", "no-instruction", "no-md"]
    assert main(["validate", "terminal", "--tasks", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("0 passed, 3 failed") and "Traceback" not in out + err
    assert "FAIL no-md: could not load: ValueError:" in out and "no instruction.md" in out
    assert main(["validate", "terminal", "--tasks", str(tmp_path / "nowhere")]) == 1
    assert "error: no terminal tasks at" in capsys.readouterr().err


def test_harbor_reward_mapping_and_test_names() -> None:
    assert [harbor_outcome(r) for r in (1.0, 0.0, 0.5, 3.0, -2.0)] == [1.0, -1.0, 0.0, 1.0, -1.0]
    summary = "PASSED ../tests/test_outputs.py::test_a\nFAILED /tests/test_outputs.py::test_b - x\n"
    assert parse_pytest_summary(summary) == {"test_outputs.py::test_a": "passed",
                                             "test_outputs.py::test_b": "failed"}


def test_base_image_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text, mapped = resolve_from("FROM --platform=linux/amd64 ghcr.io/laude-institute/t-bench/deveval:latest AS b\n"
                                "FROM ${BASE}\nFROM python:3.13-slim\n")
    assert text.splitlines() == ["FROM nextstate/tbench:latest AS b", "FROM ${BASE}", "FROM python:3.13-slim"]
    assert mapped == {"ghcr.io/laude-institute/t-bench/deveval:latest": "nextstate/tbench:latest"}
    extra = tmp_path / "mine.yaml"
    extra.write_text('"python:3.13*": terminal\n"ghcr.io/laude-institute/t-bench/deveval:*": my/dev:1\n')
    monkeypatch.setenv("NEXTSTATE_BASE_IMAGES", str(extra))
    assert base_images()[0] == ("python:3.13*", "terminal")
    text, _ = resolve_from("FROM ghcr.io/laude-institute/t-bench/deveval:x\nFROM python:3.13-slim AS s\n")
    assert text == "FROM my/dev:1\nFROM nextstate/terminal:latest AS s\n"
    extra.write_text("- not a mapping\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        base_images()


# -- with Docker ------------------------------------------------------------------------------
@pytest.mark.docker
def test_fixture_tasks_pass_the_oracle_check(terminal_image: str, tmp_path: Path) -> None:
    shutil.copytree(FIXTURES, tmp_path / "tasks")
    (tmp_path / "tasks" / "broken").mkdir()
    (tmp_path / "tasks" / "broken" / "task.yaml").write_text("instruction: [unclosed\n")
    (tmp_path / "tasks" / "unbuildable").mkdir()
    (tmp_path / "tasks" / "unbuildable" / "task.yaml").write_text("instruction: x\n")
    (tmp_path / "tasks" / "unbuildable" / "Dockerfile").write_text("FROM nextstate/terminal:latest\nRUN exit 3\n")
    checks = {c.task_id: c for c in validate("terminal", tmp_path / "tasks", parallel=2, backend="docker",
                                             progress=False)}
    assert {k: c.reason for k, c in checks.items() if not c.ok} == {
        "broken": checks["broken"].reason, "unbuildable": checks["unbuildable"].reason}
    assert checks["broken"].reason.startswith("could not load: ")
    assert "docker build" in checks["unbuildable"].reason and "\n" not in checks["unbuildable"].reason


@pytest.mark.docker
def test_offline_fallback_is_said_and_tests_run_as_root(terminal_image: str) -> None:
    env = TerminalEnv(FIXTURES, backend="docker")
    try:
        env.reset(options={"task": "tb-compose-uv"})
        assert env.sandbox.spec.user == "root" and env.sandbox.spec.image.startswith("nextstate/task-")
        reward, info = play(env, env.oracle_actions(env.task, "gold"))
        assert reward == 1.0, info["outcome"]
        assert "run-tests.sh downloads" in info["outcome"]["tests_fallback"]
        assert set(info["outcome"]["tests"]) == {"test_outputs.py::test_sum",
                                                 "test_outputs.py::test_runs_as_root_in_the_compose_image"}
        env.reset(options={"task": "harbor-compose-json"})
        env.step(call("bash", command="echo a > /app/a.txt"))
        _, reward, *_, info = env.step(call("finish"))
        assert info["outcome"]["rewards"] == {"reward": 0.5, "files": 1.0} and reward == 0.0
    finally:
        env.close()


@pytest.mark.docker
def test_missing_user_fails_the_lease_at_once(terminal_image: str) -> None:
    env = TerminalEnv(FIXTURES, backend="docker", user="nobody-here")
    start = time.monotonic()
    try:
        with pytest.raises(SandboxConfigError, match="has no user 'nobody-here'"):
            env.reset(options={"task": "harbor-uv-fallback"})
    finally:
        env.close()
    assert time.monotonic() - start < 120  # not the 600 s lease timeout


@pytest.mark.docker
def test_tmux_tool_types_and_shows_the_screen(terminal_image: str) -> None:
    env = TerminalEnv(FIXTURES, backend="docker", tmux=True)
    try:
        env.reset(options={"task": "tb-solution-yaml"})
        obs, *_ = env.step(call("tmux", keys=["echo $((6 * 7))", "Enter"], wait=0.5))
        assert "42" in obs.splitlines()[-2:][0] or "42" in obs
        obs, *_ = env.step(call("tmux", keys="sleep 2; echo slept", block=True))
        assert obs.rstrip().splitlines()[-2] == "slept"
        env.step(call("tmux", keys=["vim /app/x.txt", "Enter"], wait=1))
        env.step(call("tmux", keys=["iabc", "Escape", ":wq", "Enter"], wait=1))
        obs, *_ = env.step(call("bash", command="cat /app/x.txt"))
        assert obs.startswith("abc")
    finally:
        env.close()


@pytest.mark.docker
def test_task_image_cache_follows_the_resolved_base(terminal_image: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    (tmp_path / "Dockerfile").write_text("FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620\n"
                                         "RUN ls /sys/class/net > /tmp/interfaces\n")
    tag = f"nextstate-test/tb-{uuid.uuid4().hex[:8]}:latest"
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    try:
        build_image(tmp_path, tag, client=docker_client)
        first = docker_client.images.get(tag)
        out = docker_client.containers.run(tag, ["sh", "-c", "id -u; cat /tmp/interfaces"], remove=True)
        assert out.split() == [b"0", b"lo"]  # the t-bench stand-in runs as root; offline: no network
        build_image(tmp_path, tag, client=docker_client)
        assert docker_client.images.get(tag).id == first.id  # cached
        table = tmp_path / "bases.yaml"
        table.write_text('"ghcr.io/laude-institute/t-bench/python-3-13:*": terminal\n')
        monkeypatch.setenv("NEXTSTATE_BASE_IMAGES", str(table))
        build_image(tmp_path, tag, client=docker_client)
        assert docker_client.images.get(tag).id != first.id  # another base: rebuilt
    finally:
        for ref in (tag,):
            try:
                docker_client.images.remove(ref, force=True)
            except Exception:
                pass


def test_training_config_sets_user_and_tmux() -> None:
    from train.config import load_config
    from train.rollout import env_kwargs
    assert env_kwargs(load_config("terminal")) == {}
    cfg = load_config("terminal", overrides=["env.user=root", "env.tmux=true"])
    assert env_kwargs(cfg) == {"user": "root", "tmux": True}
