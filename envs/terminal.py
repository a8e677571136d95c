"""Terminal tasks: a shell in a sandbox, graded by the task's hidden pytest tests.

Tasks use the terminal-bench task-directory format: a directory per task with
``task.yaml`` (``instruction``, ``difficulty``, ``category``, ``tags``,
``max_agent_timeout_sec``, ``max_test_timeout_sec``, optional ``network``),
an optional ``Dockerfile`` (``ARG BASE=nextstate/terminal:latest`` /
``FROM ${BASE}``; built on first use), ``run-tests.sh``, ``tests/`` and
``solution.sh``. The tests enter the sandbox only at grading time.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

import yaml

from envs import procedural
from envs.actions import ToolCall, tool_schema
from envs.base import NextStateEnv, Outcome, Task, ToolResult, read_rows
from envs.sandbox import Sandbox, SandboxError

BUILTIN_TASKS = Path(__file__).parent / "tasks" / "terminal"
TEST_DIR = "/tmp/tests"
TEST_LOG = "/tmp/test-output.log"
DEFAULT_TEST_TIMEOUT = 60.0
DEFAULT_RUN_TESTS = '#!/bin/bash\npython3 -m pytest "$TEST_DIR" -rA\n'
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR) +(\S+)", re.M)
_TEST_DIR_PREFIX = re.compile(r"^(\.\./)*/?" + re.escape(TEST_DIR.lstrip("/") + "/"))
_YAML_FIELDS = ("difficulty", "tags", "max_agent_timeout_sec", "max_test_timeout_sec", "network")
_build_lock = threading.Lock()
_built: dict[str, str] = {}


# -- loading -----------------------------------------------------------------------------
def load_terminal_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Tasks from a task directory, a directory of them, or a JSONL/parquet index.

    Index rows either point to a task directory (``path``, relative to the
    index file) or embed the task: ``id``, ``instruction``, ``tests``
    (``{file name: text}``, or the text of ``test_outputs.py``), and
    optionally ``run_tests``, ``solution`` and the ``task.yaml`` fields.
    """
    path = Path(path)
    if path.is_file():
        return [_task_from_row(row, path.parent, f"{path}:{i + 1}")
                for i, row in enumerate(read_rows(path))]
    if (path / "task.yaml").is_file():
        return [_task_from_dir(path)]
    if not path.is_dir():
        raise FileNotFoundError(f"no terminal tasks at {path}")
    return [_task_from_dir(d) for d in sorted(path.iterdir()) if (d / "task.yaml").is_file()]


def _task_from_dir(d: Path) -> Task:
    meta = yaml.safe_load((d / "task.yaml").read_text()) or {}
    instruction = meta.get("instruction") or next(
        (x.get("description") for x in meta.get("descriptions") or []), None)
    if not instruction:
        raise ValueError(f"{d / 'task.yaml'} has no instruction")
    run_tests = d / "run-tests.sh"
    solution = d / "solution.sh"
    data = {k: meta[k] for k in _YAML_FIELDS if k in meta}
    data.update(dir=str(d.resolve()), dockerfile=(d / "Dockerfile").is_file(), tests={},
                run_tests=run_tests.read_text() if run_tests.is_file() else DEFAULT_RUN_TESTS,
                solution=solution.read_text() if solution.is_file() else None)
    return Task(d.name, instruction.strip(), data, str(meta.get("category", "")))


def _task_from_row(row: dict[str, Any], base: Path, where: str) -> Task:
    ref = row.get("path") or row.get("task_dir")
    if ref:
        task = _task_from_dir((base / ref).resolve())
        task.id = str(row.get("id") or task.id)
        return task
    task_id, instruction = row.get("id") or row.get("task_id"), row.get("instruction")
    if not task_id or not instruction:
        raise ValueError(f"{where}: a row needs `path`, or `id` and `instruction`")
    tests = row.get("tests") or {}
    if isinstance(tests, str):
        tests = {"test_outputs.py": tests}
    data = {k: row[k] for k in _YAML_FIELDS if row.get(k) is not None}
    data.update(dir=None, dockerfile=False, tests=dict(tests),
                run_tests=row.get("run_tests") or DEFAULT_RUN_TESTS, solution=row.get("solution"))
    return Task(str(task_id), str(instruction).strip(), data, str(row.get("category") or ""))


def task_image(task: Task) -> str | None:
    """The image of a task with its own Dockerfile (built once per process), else None."""
    if not task.data.get("dockerfile"):
        return None
    import containers
    with _build_lock:
        if task.data["dir"] not in _built:
            slug = re.sub(r"[^a-z0-9_.-]+", "-", task.id.lower()).strip("-.") or "task"
            _built[task.data["dir"]] = containers.build_image(task.data["dir"], f"nextstate/task-{slug}:latest")
        return _built[task.data["dir"]]


# -- grading -------------------------------------------------------------------------------
def parse_pytest_summary(text: str) -> dict[str, str]:
    """``{test id: "passed" | "failed"}`` from pytest's ``-rA`` short summary lines."""
    tests: dict[str, str] = {}
    for status, name in _SUMMARY_LINE.findall(text):
        name = _TEST_DIR_PREFIX.sub("", name)  # pytest names files relative to the workdir
        if status == "PASSED":
            tests.setdefault(name, "passed")
        else:  # FAILED, or ERROR (also a passed test whose teardown failed)
            tests[name] = "failed"
    return tests


def grade_terminal_task(sandbox: Sandbox, task: Task) -> Outcome:
    """Install the task's tests at ``TEST_DIR``, run ``run-tests.sh``, score ``2 * passed/total - 1``."""
    data = task.data
    try:
        sandbox.run(f"rm -rf {TEST_DIR} {TEST_LOG}", timeout=30)
        if data.get("dir") and (Path(data["dir"]) / "tests").is_dir():
            sandbox.copy_in(Path(data["dir"]) / "tests", TEST_DIR)
        for name, text in data.get("tests", {}).items():
            sandbox.write_file(f"{TEST_DIR}/{name}", text)
        sandbox.write_file(f"{TEST_DIR}/run-tests.sh", data.get("run_tests") or DEFAULT_RUN_TESTS, 0o755)
    except SandboxError as e:
        if not sandbox.is_alive():
            raise
        return Outcome(-1.0, {"reason": f"could not install the tests: {e}", "tests": {}})
    timeout = float(data.get("max_test_timeout_sec") or DEFAULT_TEST_TIMEOUT)
    run = sandbox.run(f"(cd {sandbox.spec.workdir} && TEST_DIR={TEST_DIR} bash --noprofile --norc "
                      f"{TEST_DIR}/run-tests.sh) >{TEST_LOG} 2>&1", timeout=timeout)
    # Only the last summary section counts: output the agent's code printed comes before it.
    summary = sandbox.run(f"tac {TEST_LOG} | sed '/short test summary info/q' | tac", timeout=30)
    tests = parse_pytest_summary(summary.stdout)
    passed = sum(v == "passed" for v in tests.values())
    details: dict[str, Any] = {"tests": tests, "passed": passed, "total": len(tests),
                               "exit_code": run.exit_code, "timed_out": run.timed_out}
    if passed < len(tests) or not tests:
        details["log_tail"] = sandbox.run(f"tail -c 3000 {TEST_LOG}", timeout=30).stdout
    if not tests:
        why = "the tests timed out" if run.timed_out else f"run-tests.sh exited with {run.exit_code}"
        details["reason"] = f"no pytest results found ({why})"
        return Outcome(-1.0, details)
    return Outcome(2.0 * passed / len(tests) - 1.0, details)


# -- the environment -------------------------------------------------------------------------
class TerminalEnv(NextStateEnv):
    """A persistent shell in a sandbox; ``finish`` (or the step limit) runs the hidden tests."""

    family = "terminal"
    default_max_steps = 10
    tools = [
        tool_schema("bash", "Run a command in a persistent bash shell (the working directory and "
                    "variables persist). Returns its output and exit code.",
                    {"command": ("string", "The command line to run."),
                     "timeout": ("number", "Seconds before the command is killed (optional).")},
                    required=["command"]),
        tool_schema("write_file", "Create or overwrite a text file (parent directories are created).",
                    {"path": ("string", "File path, absolute or relative to the current directory."),
                     "content": ("string", "The complete new content of the file.")}),
        tool_schema("finish", "Call this when the task is complete; the result is then checked."),
    ]

    def load_tasks(self, source: Any) -> list[Task]:
        if procedural.is_procedural(source):
            return procedural.load(source)
        if source is None or isinstance(source, (str, os.PathLike)):
            return load_terminal_tasks(BUILTIN_TASKS if source is None else source)
        return super().load_tasks(source)

    def sandbox_overrides(self, task: Task) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        image = task_image(task)
        if image:
            overrides["image"] = image
        if task.data.get("network"):
            overrides["network"] = True
        return overrides

    def start_episode(self, task: Task) -> None:
        """Run the task's ``setup`` command, if it has one (procedural tasks do)."""
        if task.data.get("setup"):
            r = self.sandbox.run(task.data["setup"], timeout=30)
            if r.exit_code != 0:
                raise SandboxError(f"setup of task {task.id} failed: {r.output[-500:]}")

    def command_timeout_cap(self) -> float:
        assert self.task is not None
        return float(self.task.data.get("max_agent_timeout_sec") or self.step_timeout)

    def call_tool(self, call: ToolCall) -> ToolResult:
        args = call.arguments
        if call.name == "bash":
            return self.command_result(self.run(args["command"], args.get("timeout")))
        if call.name == "write_file":
            try:
                self.sandbox.write_file(args["path"], args["content"])
            except SandboxError as e:
                if not self.sandbox.is_alive():
                    raise
                return ToolResult(f"Could not write {args['path']}: {e}", exit_code=1)
            return ToolResult(f"Wrote {len(args['content'].encode())} bytes to {args['path']}.", 0)
        return ToolResult("Finished: the result will now be checked.", done=True)

    def compute_outcome(self) -> Outcome:
        assert self.task is not None
        return grade_terminal_task(self.sandbox, self.task)

    def oracle_actions(self, task: Task, kind: str) -> list[dict[str, Any]]:
        """gold: write ``solution.sh``, run it in the workdir, finish; noop: finish at once."""
        finish = {"name": "finish", "arguments": {}}
        if kind == "noop":
            return [finish]
        if task.data.get("oracle"):
            return list(task.data["oracle"])
        if not task.data.get("solution"):
            raise ValueError(f"task {task.id} has no solution.sh")
        timeout = float(task.data.get("max_agent_timeout_sec") or 600)
        run = "bash /tmp/solution.sh; rc=$?; rm -f /tmp/solution.sh; (exit $rc)"
        return [{"name": "write_file", "arguments": {"path": "/tmp/solution.sh", "content": task.data["solution"]}},
                {"name": "bash", "arguments": {"command": run, "timeout": timeout}}, finish]
