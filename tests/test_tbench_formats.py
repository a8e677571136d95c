"""Real terminal-bench and Harbor task layouts, as written: the fixture tasks in
tests/fixtures/terminal_tasks carry the traps of the public task sets (a compose-built
image on a ``FROM ghcr.io/laude-institute/t-bench/...`` base, ``solution.yaml`` typed into
tmux, a ``run-tests.sh``/``test.sh`` that downloads uv, Harbor's reward files)."""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest

from nextstate.containers.build import base_images, build_image, resolve_from
from nextstate.envs.__main__ import main
from nextstate.envs.base import play
from nextstate.containers.protocol import SandboxConfigError
from nextstate.envs.terminal import (BUILTIN_TASKS, TerminalEnv, harbor_outcome, load_terminal_tasks,
                           parse_pytest_summary)
from nextstate.envs.validate import validate

FIXTURES = Path(__file__).parent / "fixtures" / "terminal_tasks"


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# -- loading (no Docker) ------------------------------------------------------------------------
def test_both_formats_load_as_written() -> None:
    tasks = {t.id: t for t in load_terminal_tasks(FIXTURES)}
    assert set(tasks) == {"tb-compose-uv", "tb-solution-yaml", "tb-harness-scripts", "harbor-reward-txt",
                          "harbor-compose-json", "harbor-uv-fallback", "harbor-schema-1-1"}
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


def test_each_format_gives_the_network_its_harness_gives(tmp_path: Path) -> None:
    """terminal-bench's images and Harbor's ``public`` (its default) tasks have the network; a task that says
    no, and nextstate's own tasks, have none; ``network=False`` (``env.network=none``) takes it from all."""
    tasks = {t.id: t for t in load_terminal_tasks(FIXTURES)}
    assert tasks["tb-compose-uv"].data["network"] is True and tasks["harbor-uv-fallback"].data["network"] is True
    assert tasks["harbor-reward-txt"].data["network"] is False   # allow_internet = false
    own = TerminalEnv()
    assert not any(t.data.get("network") for t in own.tasks) and "network" not in own.sandbox_overrides(own.tasks[0])
    own.close()
    d = tmp_path / "tb-offline"
    shutil.copytree(FIXTURES / "tb-compose-uv", d)
    (d / "task.yaml").write_text((d / "task.yaml").read_text() + "network: false\n")
    assert load_terminal_tasks(d)[0].data["network"] is False
    h = tmp_path / "harbor"
    shutil.copytree(FIXTURES / "harbor-uv-fallback", h)
    toml = (h / "task.toml").read_text()
    for mode, network in (("public", True), ("allowlist", True), ("no-network", False)):
        (h / "task.toml").write_text(f'{toml}\n[environment]\nnetwork_mode = "{mode}"\n')
        assert load_terminal_tasks(h)[0].data["network"] is network, mode
    (h / "task.toml").write_text(f'{toml}\n[environment]\nnetwork_mode = "some"\n')
    with pytest.raises(ValueError, match="network_mode 'some' is not public, allowlist or no-network"):
        load_terminal_tasks(h)
    env = TerminalEnv(FIXTURES, backend="local")
    off = TerminalEnv(FIXTURES, backend="local", network=False)
    try:
        assert env.sandbox_overrides(tasks["tb-compose-uv"])["network"] is True
        assert "network" not in off.sandbox_overrides(tasks["tb-compose-uv"])
    finally:
        env.close()
        off.close()


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


def test_harbor_schema_1_x_is_read(tmp_path: Path) -> None:
    [task] = load_terminal_tasks(FIXTURES / "harbor-schema-1-1")
    data = task.data
    assert (data["harbor_name"], data["tags"], task.category) == ("nextstate/harbor-schema-1-1",
                                                                  ["harbor", "fixture"], "fixture")
    assert (data["user"], data["verifier_user"], data["verifier_env"]) == ("root", "agent", {"EXPECTED_LINES": "3"})
    assert (data["cpus"], data["memory"], data["network"], data["max_test_timeout_sec"]) == (1.0, "1024m", False, 60.0)
    d = tmp_path / "later"
    shutil.copytree(FIXTURES / "harbor-schema-1-1", d)
    toml = (d / "task.toml").read_text()
    (d / "task.toml").write_text(toml.replace('schema_version = "1.1"', 'schema_version = "2.0"'))
    with pytest.raises(ValueError, match="schema_version '2.0' is not read here"):
        load_terminal_tasks(d)
    (d / "task.toml").write_text(toml.replace("[agent]", '[agent]\nuser = "agent"')
                                 + 'gpus = 1\ndocker_image = "example/prebuilt:1"\n')
    [task] = load_terminal_tasks(d)
    assert (task.data["user"], task.data["image_ref"], task.data["build"]) == ("agent", "example/prebuilt:1", None)
    env = TerminalEnv(d, backend="local")
    try:
        assert env.skip_reason(task) == "the task asks for 1 GPU(s); terminal sandboxes have none"
    finally:
        env.close()


def test_a_harbor_compose_file_needs_a_main_service(tmp_path: Path) -> None:
    d = tmp_path / "no-main"
    shutil.copytree(FIXTURES / "harbor-compose-json", d)
    compose = d / "environment" / "docker-compose.yaml"
    compose.write_text(compose.read_text().replace("  main:", "  app:"))
    broken: list[tuple[str, str]] = []
    assert load_terminal_tasks(tmp_path, broken) == []
    [(name, why)] = broken
    assert name == "no-main" and "has no 'main' service" in why and "(it has app)" in why and "\n" not in why
    compose.write_text(compose.read_text().replace("  app:", "  main:") + "  db:\n    image: postgres:16\n")
    [task] = load_terminal_tasks(d)
    env = TerminalEnv(d, backend="local")
    try:
        assert "services besides 'main' (db)" in env.skip_reason(task)
    finally:
        env.close()


def test_harness_scripts_are_supplied_unless_the_task_has_its_own(tmp_path: Path) -> None:
    from nextstate.envs.terminal.env import _harness_files

    [task] = load_terminal_tasks(FIXTURES / "tb-harness-scripts")
    assert set(_harness_files(task)) == {"setup-uv-pytest.sh", "run-uv-pytest.sh", ".nextstate-uv/uv"}
    own = tmp_path / "own"
    shutil.copytree(FIXTURES / "tb-harness-scripts", own)
    (own / "tests" / "setup-uv-pytest.sh").write_text("pip3 install pytest\n")
    [task] = load_terminal_tasks(own)
    assert set(_harness_files(task)) == {"run-uv-pytest.sh", ".nextstate-uv/uv"}
    [plain] = load_terminal_tasks(FIXTURES / "tb-compose-uv")
    assert _harness_files(plain) == {}


def test_the_offline_uv_keeps_what_is_installed_and_says_what_it_cannot_get(tmp_path: Path) -> None:
    """The harness's ``uv`` on this machine's python3 (pip kept off the network)."""
    import subprocess
    import sys

    from nextstate.envs.terminal.formats import HARNESS_DIR

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PIP_NO_INDEX": "1", "HOME": str(tmp_path)}

    def uv(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(HARNESS_DIR / "uv"), *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=120)

    kept = uv("add", "pytest==0.0.1", "--dev")
    assert kept.returncode == 0 and "pytest==0.0.1: keeps the installed pytest" in kept.stderr
    missing = uv("add", "nextstate-no-such-package-0")
    assert missing.returncode == 1 and "could not install nextstate-no-such-package-0" in missing.stderr
    ran = uv("run", "--with", "pytest", "python", "-c", "print(6 * 7)")
    assert (ran.returncode, ran.stdout) == (0, "42\n")
    assert uv("init").returncode == 0 and uv("frobnicate").returncode == 2


def test_harbor_reward_mapping_and_test_names() -> None:
    assert [harbor_outcome(r) for r in (1.0, 0.0, 0.5, 3.0, -2.0)] == [1.0, -1.0, 0.0, 1.0, -1.0]
    summary = "PASSED ../tests/test_outputs.py::test_a\nFAILED /tests/test_outputs.py::test_b - x\n"
    assert parse_pytest_summary(summary) == {"test_outputs.py::test_a": "passed",
                                             "test_outputs.py::test_b": "failed"}


def test_base_image_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text, mapped = resolve_from("FROM --platform=linux/amd64 ghcr.io/laude-institute/t-bench/deveval:latest AS b\n"
                                "FROM ${BASE}\nFROM python:3.13-slim\n")
    assert text.splitlines() == ["FROM nextstate/tbench-deveval:latest AS b", "FROM ${BASE}", "FROM python:3.13-slim"]
    assert mapped == {"ghcr.io/laude-institute/t-bench/deveval:latest": "nextstate/tbench-deveval:latest"}
    assert resolve_from("FROM ghcr.io/laude-institute/t-bench/other:1\n")[0] == "FROM nextstate/tbench:latest\n"
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
        env.reset(options={"task": "harbor-schema-1-1"})
        obs, *_ = env.step(call("bash", command="ls -A /tests /solution 2>&1; seq 2 > /app/count.txt"))
        assert "test_outputs.py" not in obs and "solve.sh" not in obs  # the tests come after the agent
        _, reward, *_, info = env.step(call("finish"))
        assert info["outcome"]["harbor_reward"] == 0.6667 and reward == pytest.approx(0.3334)
        assert info["outcome"]["tests"] == {"test_outputs.py::test_the_verifier_runs_as_its_own_user": "passed"}
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


def test_training_config_sets_user_tmux_and_network() -> None:
    from nextstate.train.config import ConfigError, load_config
    from nextstate.train.wiring import env_kwargs
    assert env_kwargs(load_config("terminal")) == {}
    cfg = load_config("terminal", overrides=["env.user=root", "env.tmux=true", "env.network=none"])
    assert env_kwargs(cfg) == {"user": "root", "tmux": True, "network": False}
    with pytest.raises(ConfigError, match="env.network must be task or none"):
        load_config("terminal", overrides=["env.network=some"])


def _play(script: str, tmp_path: Path) -> "subprocess.CompletedProcess[str]":
    """Runs a tmux script on this machine with a tmux server of its own."""
    import subprocess

    env = {**__import__("os").environ, "TMUX_TMPDIR": str(tmp_path)}
    try:
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, capture_output=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux on this machine")
def test_a_blocking_solution_step_signals_on_its_own_line(tmp_path: Path) -> None:
    """terminal-bench types ``; tmux wait-for -S`` on the command's line: bash runs it and the wait ends."""
    from nextstate.envs.terminal.env import solution_keys_script

    out = tmp_path / "out"
    steps = [{"command": f"echo one > {out}", "block": True, "append_enter": True, "min_timeout_sec": 0.1,
              "max_timeout_sec": 60.0},
             {"command": f"echo two >> {out}", "block": False, "append_enter": True, "min_timeout_sec": 0.5,
              "max_timeout_sec": 60.0}]
    ran = _play(solution_keys_script(steps, 90), tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "syntax error" not in ran.stdout and out.read_text().split() == ["one", "two"]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux on this machine")
def test_a_solution_step_past_its_time_is_interrupted_and_stops_the_rest(tmp_path: Path) -> None:
    from nextstate.envs.terminal.env import solution_keys_script

    late = tmp_path / "late"
    steps = [{"command": "sleep 301; echo finished", "block": True, "append_enter": True, "min_timeout_sec": 0.1,
              "max_timeout_sec": 2.0},
             {"command": f"touch {late}", "block": False, "append_enter": True, "min_timeout_sec": 0.5,
              "max_timeout_sec": 60.0}]
    ran = _play(solution_keys_script(steps, 90) + "\nrc=$?; sleep 0.5; tmux capture-pane -p -t ns; exit $rc",
                tmp_path)
    assert ran.returncode == 124 and "step 1 did not finish in time" in ran.stderr
    assert "^C" in ran.stdout and "finished" not in ran.stdout.replace("echo finished", "")
    assert not late.exists()  # the next step was not typed


@pytest.mark.docker
def test_the_test_fallback_has_its_own_time_limit(tmp_path: Path, terminal_image: str) -> None:
    """A run-tests.sh that downloads, with no network: the fallback pytest gets its own limit, not the
    task's 2 s the script spent, and passes."""
    task_dir = tmp_path / "slow-tests"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "task.yaml").write_text("instruction: Nothing to do.\nmax_test_timeout_sec: 2\n")
    (task_dir / "run-tests.sh").write_text("pip install nothing-here-offline\nsleep 30\n")
    (task_dir / "tests" / "test_outputs.py").write_text("import time\n\ndef test_slow():\n    time.sleep(3)\n")
    env = TerminalEnv(task_dir, backend="docker")
    try:
        env.reset(options={"task": "slow-tests"})
        _, reward, done, _, info = env.step(call("finish"))
    finally:
        env.close()
    assert done and reward == 1.0, info["outcome"]
    assert "ran `python3 -m pytest $TEST_DIR/test_outputs.py -rA` instead" in info["outcome"]["tests_fallback"]


def test_harbor_build_timeout_storage_and_workdir_are_honoured(tmp_path: Path) -> None:
    d = tmp_path / "harbor-sized"
    (d / "tests").mkdir(parents=True)
    (d / "instruction.md").write_text("Do it.\n")
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (d / "task.toml").write_text('version = "1.0"\n[environment]\nbuild_timeout_sec = 900.0\nstorage_mb = 10240\n'
                                 'workdir = "/srv/work"\nmemory = "4G"\n')
    [task] = load_terminal_tasks(d)
    assert (task.data["build_timeout"], task.data["disk"], task.data["memory"]) == (900.0, "10240m", "4g")
    env = TerminalEnv(d, backend="local")
    try:
        overrides = env.sandbox_overrides(task)
    finally:
        env.close()
    assert (overrides["disk"], overrides["workdir"], overrides["memory"]) == ("10240m", "/srv/work", "4g")


def test_a_failed_build_says_why() -> None:
    from nextstate.containers.build import failure_reason

    assert failure_reason(["Step 3/4 : RUN apt-get install -y tmux asciinema",
                           "E: Unable to locate package asciinema",
                           "The command '/bin/sh -c apt-get install -y tmux asciinema' returned a non-zero code: 100"]
                          ) == "apt-get found no package asciinema"
    assert failure_reason(["ERROR: No matching distribution found for pytest==8.4.1"]) == \
        "pip found no package pytest==8.4.1"
    assert failure_reason(["WARNING: Retrying ... NewConnectionError('Failed to establish a new connection: "
                           "[Errno -3] Temporary failure in name resolution')",
                           "ERROR: No matching distribution found for six"]) == "the build had no network"
    assert failure_reason(["Err:1 http://deb.debian.org/debian bookworm InRelease",
                           "  Temporary failure resolving 'deb.debian.org'"]
                          ) == "the build could not reach deb.debian.org"
    assert failure_reason(["fatal: unable to access 'https://github.com/x/y/': Could not resolve host: github.com",
                           "The command '/bin/sh -c git clone https://github.com/x/y' returned a non-zero code: 128"]
                          ) == "the build could not reach github.com"
    assert failure_reason(["WARNING: Retrying (Retry(total=4)) after connection broken by 'NewConnectionError("
                           "...)': /simple/six/ host='pypi.org'"]) == "the build could not reach pypi.org"
    assert failure_reason(["curl: (7) Failed to connect to sh.rustup.rs port 443: Connection refused"]
                          ) == "the build could not reach sh.rustup.rs"
    assert failure_reason(["Failed to connect to socket /run/dbus/system_bus_socket: No such file or directory",
                           "The command '/bin/sh -c add-apt-repository x' returned a non-zero code: 1"]
                          ) == "`/bin/sh -c add-apt-repository x` exited with 1"   # a socket, not a host
    assert failure_reason(["COPY failed: file not found in build context or excluded by .dockerignore: stat "
                           "solution/: file does not exist"]) == \
        "the Dockerfile copies solution/, which its build context does not hold"
    assert failure_reason(['Exception in thread "main" java.net.UnknownHostException: services.gradle.org',
                           "\tat java.base/sun.nio.ch.NioSocketImpl.connect(NioSocketImpl.java:567)"]
                          ) == "the build could not reach services.gradle.org"   # Gradle's wrapper
    assert "TLS certificate" in failure_reason(["SSL: CERTIFICATE_VERIFY_FAILED"])
    assert failure_reason(["The command '/bin/sh -c make' returned a non-zero code: 2"]) == \
        "`/bin/sh -c make` exited with 2"


def test_builds_get_the_network_while_registries_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the image registry: the package registries decide; a user can still ask for none."""
    import nextstate.containers.build as build

    monkeypatch.setattr(build, "registries_answer", lambda: True)
    assert build.build_network() is None and build.build_network(allowed=False) == "none"
    monkeypatch.setenv("NEXTSTATE_BUILD_NETWORK", "none")
    assert build.build_network() == "none"
    monkeypatch.delenv("NEXTSTATE_BUILD_NETWORK")
    monkeypatch.setattr(build, "registries_answer", lambda: False)
    assert build.build_network() == "none"
    text = build.trusting_host_ca("FROM a AS one\nRUN x\nFROM one\nRUN pip install y\n", "ca.crt")
    assert text.count(f"COPY ca.crt {build.BUILD_CA}") == 2 and f"ARG PIP_CERT={build.BUILD_CA}" in text


@pytest.mark.docker
def test_a_task_build_installs_from_pypi_and_names_a_missing_package(terminal_image: str, tmp_path: Path,
                                                                      docker_client) -> None:
    """A Dockerfile's pip install works where PyPI answers, whatever the image registries do (the host's CA
    bundle trusted, not left in the image's environment); a missing package is named."""
    from nextstate.containers.build import registries_answer

    if not registries_answer():
        pytest.skip("no package registry answers here")
    (tmp_path / "Dockerfile").write_text("ARG BASE=nextstate/terminal:latest\nFROM ${BASE}\nUSER root\n"
                                         "RUN python3 -m pip download --no-deps -q -d /opt/got six\n")
    tag = f"nextstate-test/pip-{uuid.uuid4().hex[:8]}:latest"
    try:
        build_image(tmp_path, tag, client=docker_client)
        out = docker_client.containers.run(tag, ["sh", "-c", "ls /opt/got; env"], remove=True).decode()
        assert "six-" in out and "PIP_CERT" not in out
        (tmp_path / "Dockerfile").write_text("ARG BASE=nextstate/terminal:latest\nFROM ${BASE}\nUSER root\n"
                                             "RUN python3 -m pip install --break-system-packages nextstate-no-such-package-0\n")
        with pytest.raises(RuntimeError, match="failed: pip found no package nextstate-no-such-package-0"):
            build_image(tmp_path, tag, client=docker_client)
    finally:
        try:
            docker_client.images.remove(tag, force=True)
        except Exception:
            pass


@pytest.mark.docker
def test_a_host_a_cached_step_could_not_reach_is_still_named(terminal_image: str, tmp_path: Path,
                                                             docker_client) -> None:
    """``curl URL | sh`` succeeds when curl cannot reach its host, and the next step finds no command. On
    a second build the cache serves the first step, whose output named the host: built once more
    without the cache, the reason names it again."""
    (tmp_path / "Dockerfile").write_text(f"FROM {terminal_image}\nUSER root\n"
                                         f"RUN curl -sS https://nextstate-unreachable.invalid/x | sh  # {uuid.uuid4()}\n"
                                         "RUN nextstate-installed-tool --version\n")
    tag = f"nextstate-test/cached-{uuid.uuid4().hex[:8]}:latest"
    for _ in range(2):
        with pytest.raises(RuntimeError, match="failed: the build could not reach nextstate-unreachable.invalid"):
            build_image(tmp_path, tag, client=docker_client, network=True)


def test_a_host_the_tests_could_not_reach_is_named() -> None:
    from nextstate.envs.terminal.env import _unreachable_host

    retry = ("WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after "
             "connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at "
             "0x7f>: Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': "
             "/simple/numpy/\nERROR: No matching distribution found for numpy\n")
    assert _unreachable_host(retry) == "pypi.org"   # pip names the index's path only: its default index
    assert _unreachable_host("Looking in indexes: https://mirror.example/simple\n" + retry) == "mirror.example"
    assert _unreachable_host('Exception in thread "main" java.net.UnknownHostException: '
                             "mirrors.cloud.tencent.com\n") == "mirrors.cloud.tencent.com"
    assert _unreachable_host("curl: (7) Failed to connect to localhost port 8000: Connection refused") is None
    assert _unreachable_host("ERROR: No matching distribution found for nextstate-no-such-package") is None


def test_behind_a_filtering_proxy_an_http_error_from_a_host_it_does_not_let_through_is_unreachable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``NEXTSTATE_REACHABLE_HOSTS``: the proxy answers for a host it blocks (a 404 of its own), so an error
    naming such a host's URL is the network's; one from a host it lets through, or loopback, is the task's."""
    from nextstate.envs.terminal.env import _unreachable_host
    judge = ("E   requests.exceptions.HTTPError: 404 Client Error: Not Found for url: "
             "http://38.80.122.117:8081/health\n")
    mirror = "E   requests.exceptions.HTTPError: 404 Client Error: Not Found for url: https://pypi.org/simple/x/\n"
    server = "E   requests.exceptions.HTTPError: 500 Server Error for url: http://127.0.0.1:8000/api\n"
    assert _unreachable_host(judge) is None   # not filtered: a real server's 404 is the task's
    monkeypatch.setenv("NEXTSTATE_REACHABLE_HOSTS", "pypi.org, *.pythonhosted.org deb.debian.org")
    assert _unreachable_host(judge) == "38.80.122.117"
    assert _unreachable_host(mirror) is None and _unreachable_host(server) is None
    assert _unreachable_host("see http://38.80.122.117:8081 for the API\n") is None   # not an error line


def test_infrastructure_failures_are_told_apart_from_the_tasks() -> None:
    from nextstate.envs.validate import Check, infrastructure, summary

    assert infrastructure("RuntimeError: docker build of /t failed: the build could not reach github.com") == \
        "unreachable host github.com"
    assert infrastructure("ValueError: base image python:3.12-slim is not here and cannot be pulled offline: map "
                          "it") == "missing base python:3.12-slim"
    assert infrastructure("SandboxError: sandbox ab12 (docker) stopped answering: gone") == "sandbox died"
    assert infrastructure("the reference solution scored -1.00: no pytest results found: the test runner could "
                          "not start (exit 127: pytest: command not found)") == "test runner did not start"
    assert infrastructure("RuntimeError: building the SWE-bench base sweb.eval.x86_64.django__django-1:latest for "
                          "swebench/sweb.eval.x86_64.django_1776_django-1:latest: SpecError: the repository source "
                          "/m holds no git repository for django/django (looked for …)") == \
        "missing repository django/django"
    assert infrastructure("the reference solution scored -1.00: failed: test_outputs.py::test_a") is None
    assert infrastructure("doing nothing already scores +1") is None
    checks = [Check("a", True, "", 1.0), Check("b", False, "doing nothing already scores +1", 2.0),
              Check("c", False, "RuntimeError: the build could not reach github.com", 3.0),
              Check("d", False, "RuntimeError: the build could not reach github.com", 3.0)]
    assert checks[2].line() == ("FAIL c  (3.0 s) [infrastructure: unreachable host github.com]: "
                                "RuntimeError: the build could not reach github.com")
    assert checks[1].line() == "FAIL b  (2.0 s): doing nothing already scores +1"
    assert summary(checks) == "1 passed, 3 failed (1 the tasks' own; infrastructure: 2 unreachable host github.com)"
    assert summary(checks[:2]) == "1 passed, 1 failed"


@pytest.mark.docker
def test_validate_names_the_infrastructure_failures(terminal_image: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A build that needs a host, a base that is not here, a test runner that is not there: each said
    in its class, apart from a task whose own solution is wrong."""
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")

    def task(name: str, dockerfile: str | None = None, run_tests: str | None = None,
             solution: str = "echo ok > /app/out.txt") -> None:
        d = tmp_path / name
        (d / "tests").mkdir(parents=True)
        (d / "task.yaml").write_text("instruction: Write ok into /app/out.txt.\nmax_test_timeout_sec: 30\n")
        (d / "tests" / "test_outputs.py").write_text(
            "from pathlib import Path\n\ndef test_ok():\n    assert Path('/app/out.txt').read_text() == 'ok\\n'\n")
        (d / "solution.sh").write_text(solution + "\n")
        if dockerfile:
            (d / "Dockerfile").write_text(dockerfile)
        if run_tests:
            (d / "run-tests.sh").write_text(run_tests)

    task("needs-host", "ARG BASE=nextstate/terminal:latest\nFROM ${BASE}\n"
                       "RUN curl -fsS https://nextstate-unreachable.invalid/\n")
    task("no-base", "FROM example.invalid/nextstate-no-such-base:1\nWORKDIR /app\n")
    task("no-runner", run_tests="#!/bin/bash\nnextstate-no-such-runner \"$TEST_DIR\"\n")
    task("wrong", solution="echo no > /app/out.txt")
    for name, url in (("tests-need-host", "http://nextstate-tests.invalid/"), ("tests-need-server", "http://localhost:9/")):
        task(name)  # tests that fetch: from a host there is no route to, and from a server the agent did not start
        (tmp_path / name / "tests" / "test_outputs.py").write_text(
            f"import subprocess\n\ndef test_fetch():\n    subprocess.run(['curl', '-fsS', '{url}'], check=True)\n")
    task("script-needs-host", run_tests="#!/bin/bash\nset -e\n"   # its fallback (it says uv) runs pytest alone
         "git ls-remote https://nextstate-tests.invalid/x.git > /app/fetched\nsource $TEST_DIR/setup-uv-pytest.sh\n")
    (tmp_path / "script-needs-host" / "tests" / "test_outputs.py").write_text(
        "from pathlib import Path\n\ndef test_fetched():\n    assert Path('/app/fetched').stat().st_size\n")
    harbor = tmp_path / "harbor-tests-need-host"   # a Harbor task whose test.sh writes no reward without the host
    for path, text in (("task.toml", 'version = "1.0"\n[verifier]\ntimeout_sec = 30.0\n'),
                       ("instruction.md", "Do nothing.\n"), ("solution/solve.sh", "#!/bin/bash\ntrue\n"),
                       ("environment/Dockerfile", "FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\n"),
                       ("tests/test.sh", "#!/bin/bash\ngit ls-remote https://nextstate-tests.invalid/x.git && "
                                         "echo 1 > /logs/verifier/reward.txt\n")):
        (harbor / path).parent.mkdir(parents=True, exist_ok=True)
        (harbor / path).write_text(text)
    assert main(["validate", "terminal", "--tasks", str(tmp_path), "--parallel", "2", "--backend", "docker"]) == 1
    out = capsys.readouterr().out
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("FAIL ")}
    assert ("[infrastructure: unreachable host nextstate-tests.invalid]: the reference solution scored -1.00: "
            "the tests could not reach nextstate-tests.invalid (the tests wrote no /logs/verifier/reward.txt or "
            "reward.json)") in lines["harbor-tests-need-host"], lines["harbor-tests-need-host"]
    assert "[infrastructure: unreachable host nextstate-unreachable.invalid]" in lines["needs-host"]
    assert "[infrastructure: missing base example.invalid/nextstate-no-such-base:1]" in lines["no-base"]
    assert "[infrastructure: test runner did not start]" in lines["no-runner"]
    assert "exit 127" in lines["no-runner"] and "[infrastructure" not in lines["wrong"]
    assert ("[infrastructure: unreachable host nextstate-tests.invalid]: the reference solution scored -1.00: "
            "the tests could not reach nextstate-tests.invalid (failed: test_outputs.py::test_fetch)") in lines[
        "tests-need-host"]
    assert "[infrastructure" not in lines["tests-need-server"]  # localhost: the agent's server, not the network
    assert ("[infrastructure: unreachable host nextstate-tests.invalid]: the reference solution scored -1.00: "
            "the tests could not reach nextstate-tests.invalid (failed: test_outputs.py::test_fetched)") in lines[
        "script-needs-host"], lines["script-needs-host"]
    assert out.rstrip().endswith("0 passed, 8 failed (2 the tasks' own; infrastructure: 1 missing base "
                                 "example.invalid/nextstate-no-such-base:1, 1 test runner did not start, "
                                 "3 unreachable host nextstate-tests.invalid, "
                                 "1 unreachable host nextstate-unreachable.invalid)")


def test_public_bases_get_stand_ins_only_where_they_cannot_be_had(monkeypatch: pytest.MonkeyPatch) -> None:
    import docker

    from nextstate.containers.build import public_stand_ins

    class Engine:  # an engine that has only ubuntu:22.04
        class api:  # noqa: N801
            @staticmethod
            def inspect_image(ref: str) -> dict:
                if ref == "ubuntu:22.04":
                    return {"Id": "sha256:1"}
                raise docker.errors.ImageNotFound(ref)

    text = "FROM python:3.12-slim-bookworm AS b\nFROM ubuntu:22.04\nFROM ghcr.io/laude-institute/t-bench/x:1\n"
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    extra = public_stand_ins(Engine(), text)
    assert extra == [("python:3*-slim*", "tbench-python")]  # ubuntu:22.04 is here; t-bench/* is in the table
    assert resolve_from(text, extra)[0].splitlines()[0] == "FROM nextstate/tbench-python:latest AS b"
    three13 = "FROM python:3.13-slim-bookworm\nFROM debian:trixie-slim\nFROM python:3.12\n"
    assert public_stand_ins(Engine(), three13) == [("python:3.13*", "tbench-trixie"),
                                                   ("debian:trixie*", "tbench-trixie"), ("python:3*", "tbench-dev")]
    assert public_stand_ins(Engine(), "FROM python:3.9-slim\nFROM debian:bullseye\n") == [
        ("python:3.9*", "tbench-bullseye"), ("debian:bullseye*", "tbench-bullseye")]
    assert public_stand_ins(Engine(), "FROM buildpack-deps:jammy\nFROM buildpack-deps:trixie-curl\n") == [
        ("buildpack-deps:*", "tbench-dev"), ("buildpack-deps:trixie*", "tbench-trixie")]
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "0")
    assert public_stand_ins(Engine(), text) == []  # online: the original is pulled


def test_a_stand_in_says_what_it_differs_in() -> None:
    from nextstate.containers.build import stand_in_note

    assert stand_in_note("python:3.12-slim", "nextstate/tbench-python:latest") == (
        "python:3.12-slim stands in as nextstate/tbench-python:latest: Debian bookworm, whose python3 is 3.11, not 3.12")
    assert stand_in_note("docker.io/library/python:3.13", "nextstate/tbench-trixie:latest") is None  # trixie's 3.13
    assert "not Ubuntu" in stand_in_note("ubuntu:24.04", "nextstate/tbench:latest")
    assert stand_in_note("debian:bookworm-slim", "nextstate/tbench:latest") is None
    assert "not Ubuntu" in stand_in_note("buildpack-deps:jammy", "nextstate/tbench-dev:latest")
    assert "not Ubuntu" in stand_in_note("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250620", "nextstate/tbench:latest")
    assert stand_in_note("buildpack-deps:bookworm-scm", "nextstate/tbench-dev:latest") is None
    assert stand_in_note("python:3.12", "registry.example/own:1") is None   # a user's own image: not ours to describe


def _run_built(docker_client, tmp_path: Path, dockerfile: str, command: list[str], **run: object) -> str:
    """Builds ``dockerfile`` offline under a private tag, runs ``command`` in it (``run``: more
    arguments of ``containers.run``), removes the image."""
    (tmp_path / "Dockerfile").write_text(dockerfile)
    tag = f"nextstate-test/standin-{uuid.uuid4().hex[:8]}:latest"
    try:
        build_image(tmp_path, tag, client=docker_client)
        return docker_client.containers.run(tag, command, remove=True, **run).decode()
    finally:
        try:
            docker_client.images.remove(tag, force=True)
        except Exception:
            pass


@pytest.mark.docker
def test_pip_installs_system_wide_on_the_python_stand_in(terminal_image: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    """``FROM python:3.12-slim`` offline: the stand-in, where pip is not refused by PEP 668."""
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    log = _run_built(docker_client, tmp_path, "FROM python:3.12-slim\nWORKDIR /srv\n"
                     "RUN pip install --no-index nextstate-no-such-package-0 > /tmp/pip.log 2>&1; cat /tmp/pip.log\n",
                     ["sh", "-c", "cat /tmp/pip.log; command -v python"])
    assert "externally-managed" not in log and "No matching distribution" in log, log
    assert log.endswith("\n/usr/local/bin/python\n"), log   # where the official images have it


@pytest.mark.docker
def test_the_ubuntu_stand_in_has_no_python_command_as_the_original(terminal_image: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    docker_client) -> None:
    """terminal-bench's ubuntu-24-04 base offline: no ``python`` until the task makes one, the way
    thousands of public tasks do (a /usr/bin/python already there failed their builds)."""
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    out = _run_built(docker_client, tmp_path, "FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\n"
                     "RUN ! command -v python && ln -s /usr/bin/python3 /usr/bin/python\n",
                     ["python", "--version"])
    assert out.startswith("Python 3."), out


HELLO_C = ("RUN printf '#include <stdio.h>\\nint main(void){puts(\"compiled\");return 0;}\\n' > /tmp/hi.c"
           " && gcc -o /usr/local/bin/hi /tmp/hi.c\n")


@pytest.mark.docker
def test_buildpack_deps_stands_in_and_an_ubuntu_ppa_is_skipped(terminal_image: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    """``FROM buildpack-deps:jammy`` offline (the base of terminal-bench's aider-polyglot tasks): the
    C-toolchain stand-in, whose add-apt-repository skips a Launchpad PPA (deadsnakes) so the task's
    apt-get goes on with Debian's packages; another repository needs the real one."""
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    out = _run_built(docker_client, tmp_path, "FROM buildpack-deps:jammy\n" + HELLO_C +
                     "RUN add-apt-repository -y ppa:deadsnakes/ppa 2> /tmp/ppa.log\n",
                     ["sh", "-c", "hi; cat /tmp/ppa.log; add-apt-repository 'deb http://x.invalid/ y main'; echo rc=$?"])
    assert out.startswith("compiled\n") and "not adding ppa:deadsnakes/ppa" in out and out.endswith("rc=127\n"), out


@pytest.mark.docker
@pytest.mark.slow
def test_the_full_python_stand_in_compiles_c(terminal_image: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    """``FROM python:3.12`` (not -slim) offline: the stand-in has the C toolchain the original carries."""
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    out = _run_built(docker_client, tmp_path, "FROM python:3.12\n" + HELLO_C + "RUN make --version > /dev/null\n",
                     ["hi"])
    assert out.strip() == "compiled"


@pytest.mark.docker
@pytest.mark.slow
def test_the_python_3_13_stand_in_is_trixie_with_python_3_13(terminal_image: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    """``FROM python:3.13-slim`` offline: the stand-in built on Debian trixie, whose python3 is 3.13,
    where pip installs system-wide and C compiles."""
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    out = _run_built(docker_client, tmp_path, "FROM python:3.13-slim\n" + HELLO_C +
                     "RUN pip install --no-index nextstate-no-such-package-0 > /tmp/pip.log 2>&1; true\n",
                     ["sh", "-c", "python3 --version; hi; . /etc/os-release; echo $VERSION_CODENAME; cat /tmp/pip.log"])
    assert out.startswith("Python 3.13.") and "\ncompiled\ntrixie\n" in out, out
    assert "externally-managed" not in out and "No matching distribution" in out, out



@pytest.mark.docker
@pytest.mark.slow
def test_the_python_3_9_stand_in_is_bullseye_with_python_3_9(terminal_image: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    """``FROM python:3.9-slim`` offline: the stand-in built on Debian bullseye, whose python3 is 3.9,
    where pip installs and C compiles."""
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    out = _run_built(docker_client, tmp_path, "FROM python:3.9-slim\n" + HELLO_C +
                     "RUN pip install --no-index nextstate-no-such-package-0 > /tmp/pip.log 2>&1; true\n",
                     ["sh", "-c", "python3 --version; hi; . /etc/os-release; echo $VERSION_CODENAME; cat /tmp/pip.log"])
    assert out.startswith("Python 3.9.") and "\ncompiled\nbullseye\n" in out, out
    assert "No matching distribution" in out, out


@pytest.mark.docker
@pytest.mark.slow
def test_the_deveval_stand_in_has_devevals_pytest_plugins_and_a_jdk(terminal_image: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    docker_client) -> None:
    """terminal-bench's DevEval base offline: the pytest plugins its run-tests.sh scripts call
    (``--cov``, ``--json-report``: a wheel from the registry, baked in at build time) and a JDK."""
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    out = _run_built(docker_client, tmp_path, "FROM ghcr.io/laude-institute/t-bench/deveval:latest\n"
                     "RUN printf 'def test_one():\\n    assert 1\\n' > /app/test_one.py\n",
                     ["sh", "-c", "pytest -q --cov=. --cov-report=json:/tmp/cov.json --json-report "
                                  "--json-report-file=/tmp/r.json test_one.py > /dev/null; echo rc=$?; "
                                  "python3 -c \"import json; print(json.load(open('/tmp/r.json'))['summary'])\"; "
                                  "test -s /tmp/cov.json && echo cov; javac -version 2>&1"])
    assert out.startswith("rc=0\n{") and "'passed': 1" in out and "\ncov\njavac 17." in out, out


def test_a_known_images_wheels_must_be_pinned(tmp_path: Path) -> None:
    from nextstate.containers.build import Progress, with_wheels

    (tmp_path / "wheels.txt").write_text("# a comment\npytest-metadata==3.1.1\npytest-json-report\n")
    with pytest.raises(RuntimeError, match=r"pin each wheel as name==version \(pytest-json-report\)"):
        with with_wheels(tmp_path, Progress("test")):
            pass
    (tmp_path / "wheels.txt").unlink()
    with with_wheels(tmp_path, Progress("test")) as context:
        assert context == tmp_path   # no wheels.txt: the directory itself


APT_LISTS = Path("/var/lib/apt/lists")


@pytest.mark.docker
@pytest.mark.skipif(not any(APT_LISTS.glob("*bookworm*_Packages*")),
                    reason="needs this machine's package lists of Debian bookworm, the stand-in's release")
def test_the_ubuntu_stand_in_takes_ubuntu_package_names(terminal_image: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    """``FROM ubuntu:24.04`` offline: the stand-in's apt-get rewrites the Ubuntu names Debian lacks
    (a table, and Ubuntu 24.04's ``t64`` suffix by rule) and leaves the rest. Simulated (``-s``)
    against this machine's package lists, mounted read-only, so nothing is downloaded. An OpenJDK
    of another version leaves the asked-for JDK directory (a task's JAVA_HOME) a link to the one
    installed: here to a directory made in its place, as the simulation installs nothing."""
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")
    names = "chromium-browser libasound2t64 postgresql-client-16 jq"
    unknown = "'Unable to locate package|has no installation candidate'"
    jvm = "/usr/lib/jvm/java-{}-openjdk-$(dpkg --print-architecture)"
    out = _run_built(docker_client, tmp_path, "FROM ubuntu:24.04\n",
                     ["sh", "-c", f"apt-get -s install -y {names} 2>&1; echo rc=$?; "
                                  f"/usr/bin/apt-get -s install -y {names} 2>&1 | grep -cE {unknown}; "
                                  f"mkdir -p {jvm.format(17)} && apt-get -s install -y openjdk-21-jdk-headless "
                                  f"2>&1 > /dev/null && readlink {jvm.format(21)}"],
                     network_mode="none", volumes={str(APT_LISTS): {"bind": str(APT_LISTS), "mode": "ro"}})
    for ubuntu, debian in [("chromium-browser", "chromium"), ("libasound2t64", "libasound2"),
                           ("postgresql-client-16", "postgresql-client"),
                           ("openjdk-21-jdk-headless", "openjdk-17-jdk-headless")]:
        assert f"installing Debian's {debian} for Ubuntu's {ubuntu}" in out, out
    assert "Ubuntu's jq" not in out and "Inst chromium " in out and "rc=0" in out, out
    # Debian's own apt-get knows none of the three; then the JDK's link, said, and where it points
    assert re.search(r"\n3\n(.*\n)*?nextstate stand-in: /usr/lib/jvm/java-21-openjdk-\w+ is a link to Debian's "
                     r"/usr/lib/jvm/java-17-openjdk-\w+\n/usr/lib/jvm/java-17-openjdk-\w+$", out.rstrip()), out
