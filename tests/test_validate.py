"""The oracle check: on fixtures that must fail, and on every shipped task."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nextstate.envs.__main__ import main
from nextstate.envs.terminal import BUILTIN_TASKS as TERMINAL_TASKS
from nextstate.envs.toolcall import BUILTIN_TASKS as MATH_TASKS
from nextstate.envs.validate import validate, validator

TESTS = 'from pathlib import Path\n\ndef test_file():\n    assert Path("/app/out.txt").read_text() == "ok\\n"\n'


def make_task(root: Path, name: str, solution: str | None, precondition: str = "") -> None:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text("instruction: Write ok into /app/out.txt.\nmax_test_timeout_sec: 30\n")
    (d / "tests" / "test_outputs.py").write_text(TESTS)
    if solution is not None:
        (d / "solution.sh").write_text(solution)
    if precondition:  # the Dockerfile already solves the task
        (d / "Dockerfile").write_text(f"ARG BASE=nextstate/terminal:latest\nFROM ${{BASE}}\nRUN {precondition}\n")


def test_unknown_family_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no validator for 'nope'.*terminal"):
        validator("nope")


def test_math_cli_reports_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"id": "ok", "problem": "1/2?", "answer": "\\frac{1}{2}"},
            {"id": "bad", "problem": "?", "answer": "\\boxed{}"}]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["validate", "toolcall", "--tasks", str(path), "--parallel", "2"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^FAIL bad  \(\d+\.\d s\): the reference solution scored -1.00", out, re.M)
    assert re.search(r"^ok   ok  \(\d+\.\d s\)$", out, re.M) and "'correct': False" in out  # a line per task
    assert out.rstrip().endswith("1 passed, 1 failed")


@pytest.mark.docker
def test_terminal_fixtures(tmp_path: Path, terminal_image: str) -> None:
    make_task(tmp_path, "good", "echo ok > /app/out.txt\n")
    make_task(tmp_path, "wrong-solution", "echo no > /app/out.txt\n")
    make_task(tmp_path, "no-solution", None)
    make_task(tmp_path, "nstest-already-solved", "true\n", precondition="echo ok > /app/out.txt")
    checks = {c.task_id: c for c in validate("terminal", tmp_path, parallel=2, backend="docker",
                                             progress=False)}
    assert checks["good"].ok and checks["good"].reason == ""
    assert "the reference solution scored -1.00" in checks["wrong-solution"].reason
    assert "test_outputs.py::test_file" in checks["wrong-solution"].reason
    assert checks["no-solution"].reason == "task no-solution has no solution.sh or solution.yaml"
    assert checks["nstest-already-solved"].reason == "doing nothing already scores +1"


def test_every_shipped_math_problem() -> None:
    checks = validate("toolcall", parallel=4, progress=False)
    assert [f"{c.task_id}: {c.reason}" for c in checks if not c.ok] == []


@pytest.mark.docker
def test_every_shipped_terminal_task(terminal_image: str) -> None:
    checks = validate("terminal", parallel=4, backend="docker", progress=False)
    assert len(checks) == len(list(TERMINAL_TASKS.glob("*/task.yaml")))
    assert [f"{c.task_id}: {c.reason}" for c in checks if not c.ok] == []
