"""``python -m envs export-harbor terminal``: nextstate's tasks as Harbor task directories.

The round trip: built-in tasks (one on the sandbox image, one with a Dockerfile of its own) and
procedural ones are exported, read back by nextstate's own Harbor reader, and validated in Docker
sandboxes (the reference solution scores +1, doing nothing does not). The slow test loads each
exported directory with Harbor's own ``Task`` model in a Python 3.12 venv (``harbor_python``).
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from nextstate.envs.__main__ import main
from nextstate.envs.terminal import TerminalEnv, load_terminal_tasks
from nextstate.envs.validate import validate

IDS = "greet-script,fix-python-stats"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("harbor") / "tasks"
    assert main(["export-harbor", "terminal", "--out", str(out), "--ids", IDS]) == 0
    assert main(["export-harbor", "terminal", "--out", str(out), "--tasks", "procedural:0:2"]) == 0
    return out


def test_the_layout_is_harbors_and_hides_tests_and_solution_from_the_build(exported):
    assert sorted(p.name for p in exported.iterdir()) == ["fix-python-stats", "greet-script", "proc-0", "proc-1"]
    for d in exported.iterdir():
        for f in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"):
            assert (d / f).is_file(), (d.name, f)
        meta = tomllib.loads((d / "task.toml").read_text())
        assert meta["task"]["name"] == f"nextstate/{d.name}" and meta["agent"]["user"] == "agent"
        assert "/logs/verifier/reward.txt" in (d / "tests" / "test.sh").read_text()
        leaked = {p.name for p in (d / "environment").rglob("*")} & {"tests", "solution.sh", "task.yaml", "run-tests.sh"}
        assert not leaked, (d.name, leaked)
    assert (exported / "fix-python-stats" / "environment" / "files").is_dir()          # its own build context
    assert "RUN printf" in (exported / "proc-0" / "environment" / "Dockerfile").read_text()   # the setup


def test_read_back_by_nextstates_harbor_reader_as_the_same_tasks(exported):
    native = {t.id: t for t in [*TerminalEnv.load_task_set(None)[0], *TerminalEnv.load_task_set("procedural:0:2")[0]]}
    back = load_terminal_tasks(exported)
    assert sorted(t.id for t in back) == ["fix-python-stats", "greet-script", "proc-0", "proc-1"]
    for t in back:
        same = native[t.id]
        assert t.data["format"] == "harbor" and t.instruction == same.instruction and t.category == same.category
        assert t.data["user"] == "agent" and t.data["harbor_name"] == f"nextstate/{t.id}"
        assert t.data["max_test_timeout_sec"] == (same.data.get("max_test_timeout_sec") or 60)


@pytest.mark.docker
def test_round_trip_validates_oracle_against_noop(exported, terminal_image):
    checks = validate("terminal", str(exported), parallel=2, progress=False)
    assert [(c.task_id, c.ok, c.reason) for c in checks] == [
        (name, True, "") for name in ["fix-python-stats", "greet-script", "proc-0", "proc-1"]]


def test_bad_requests_are_one_line(tmp_path, capsys):
    assert main(["export-harbor", "toolcall", "--out", str(tmp_path)]) == 1
    assert "terminal tasks only" in capsys.readouterr().err
    assert main(["export-harbor", "terminal", "--out", str(tmp_path), "--ids", "no-such-task"]) == 1
    assert capsys.readouterr().err.strip() == "error: no task no-such-task in the built-in set"


@pytest.mark.slow
def test_harbors_own_task_model_loads_every_directory(exported, harbor_python):
    script = """
import json, sys
from harbor.models.task.task import Task
out = {}
for d in sys.argv[1:]:
    t = Task(d)
    out[d] = [t.config.agent.user, t.config.verifier.timeout_sec, t.paths.solve_path.is_file(),
              t.paths.test_path.is_file(), t.instruction.strip()[:40]]
print(json.dumps(out))
"""
    dirs = sorted(str(d) for d in exported.iterdir())
    run = subprocess.run([str(harbor_python), "-c", script, *dirs], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = json.loads(run.stdout)
    assert sorted(loaded) == dirs
    for d, (user, timeout, solve, test, instruction) in loaded.items():
        meta = tomllib.loads((Path(d) / "task.toml").read_text())
        assert (user, timeout, solve, test) == ("agent", meta["verifier"]["timeout_sec"], True, True)
        assert (Path(d) / "instruction.md").read_text().startswith(instruction)


def _compose() -> bool:
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.docker
def test_harbors_own_harness_with_its_oracle_agrees_with_nextstates_verdict(exported, harbor_python, tmp_path,
                                                                           terminal_image):
    """``harbor run -a oracle -e docker`` (Harbor's harness, its docker environment through docker
    compose: .ci/setup installs the plugin) on exported tasks: the reward it writes is nextstate's
    verdict on the same directories (the round trip above)."""
    if not _compose():
        if __import__("os").environ.get("CI"):
            pytest.fail("no `docker compose` plugin: .ci/setup installs it")
        pytest.skip("no `docker compose` plugin here (Harbor's docker environment drives it)")
    harbor = Path(harbor_python).parent / "harbor"
    rewards = {}
    for name in ("greet-script", "proc-0"):
        run = subprocess.run([str(harbor), "run", "-p", str(exported / name), "-a", "oracle", "-e", "docker",
                              "-n", "1", "-o", str(tmp_path / "jobs"), "--job-name", name],
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        result = json.loads((tmp_path / "jobs" / name / "result.json").read_text())
        [evaluation] = result["stats"]["evals"].values()
        assert evaluation["n_errors"] == 0, evaluation
        rewards[name] = evaluation["metrics"][0]["mean"]
    checks = {c.task_id: c.ok for c in validate("terminal", str(exported), parallel=2, progress=False)}
    assert rewards == {"greet-script": 1.0, "proc-0": 1.0} and checks["greet-script"] and checks["proc-0"]
