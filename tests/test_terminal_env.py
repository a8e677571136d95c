"""The terminal env on tiny fixture tasks, with real Docker sandboxes."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import gymnasium
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gymnasium.utils.env_checker import check_env

from nextstate import envs  # noqa: F401 -- registers the ids
from nextstate.envs.base import Task
from nextstate.envs.pool import SandboxPool
from nextstate.envs.terminal import (DEFAULT_RUN_TESTS, TerminalEnv, load_terminal_tasks,
                           parse_pytest_summary)

TESTS = '''from pathlib import Path

def test_exists():
    assert Path("/app/hello.txt").exists()

def test_content():
    text = Path("/app/hello.txt").read_text()
    print(text)
    assert text.strip() == "hello"
'''
YAML = ("instruction: Write the word hello into /app/hello.txt.\ndifficulty: easy\ncategory: {cat}\n"
        "tags: [files]\nmax_agent_timeout_sec: 20\nmax_test_timeout_sec: 30\n")


def make_task(root: Path, name: str, dockerfile: str | None = None, cat: str = "files") -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text(YAML.format(cat=cat))
    (d / "tests" / "test_outputs.py").write_text(TESTS)
    (d / "run-tests.sh").write_text('#!/bin/bash\npython3 -m pytest "$TEST_DIR/test_outputs.py" -rA\n')
    (d / "solution.sh").write_text("echo hello > /app/hello.txt\n")
    if dockerfile:
        (d / "Dockerfile").write_text(dockerfile)
    return d


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


FINISH = call("finish")
SOLVE = call("write_file", path="/app/hello.txt", content="hello\n")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("terminal-tasks")
    make_task(root, "hello")
    return root


@pytest.fixture(scope="module")
def pool(terminal_image: str):
    with SandboxPool(terminal_image, size=4, backend="docker") as p:
        yield p


@pytest.fixture
def env(task_dir: Path, pool: SandboxPool):
    e = TerminalEnv(task_dir, pool=pool)
    yield e
    e.close()


# -- loading (no Docker) -------------------------------------------------------------------------
def test_load_task_dirs_and_indexes(tmp_path: Path) -> None:
    make_task(tmp_path / "set", "a", cat="one")
    make_task(tmp_path / "set", "b")
    (tmp_path / "set" / "not-a-task").mkdir()
    tasks = load_terminal_tasks(tmp_path / "set")
    assert [t.id for t in tasks] == ["a", "b"] and tasks[0].category == "one"
    a = tasks[0]
    assert a.instruction == "Write the word hello into /app/hello.txt."
    assert a.data["max_agent_timeout_sec"] == 20 and a.data["tags"] == ["files"]
    assert a.data["solution"].startswith("echo hello") and a.data["build"] is None
    assert [t.id for t in load_terminal_tasks(tmp_path / "set" / "b")] == ["b"]

    index = tmp_path / "index" / "tasks.jsonl"
    index.parent.mkdir()
    rows = [{"path": "../set/a"},
            {"id": "inline", "instruction": "Do it.", "tests": TESTS, "solution": "echo hello > /app/hello.txt"}]
    index.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    a2, inline = load_terminal_tasks(index)
    assert a2.id == "a" and a2.data["dir"] == str((tmp_path / "set" / "a").resolve())
    assert inline.data["tests"] == {"test_outputs.py": TESTS} and inline.data["run_tests"] == DEFAULT_RUN_TESTS

    pq.write_table(pa.Table.from_pylist([rows[1] | {"difficulty": "hard"}]), tmp_path / "tasks.parquet")
    (from_parquet,) = load_terminal_tasks(tmp_path / "tasks.parquet")
    assert from_parquet.id == "inline" and from_parquet.data["difficulty"] == "hard"


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_terminal_tasks(tmp_path / "missing")
    (tmp_path / "bad.jsonl").write_text('{"instruction": "no id"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_terminal_tasks(tmp_path / "bad.jsonl")


def test_builtin_tasks_are_the_default() -> None:
    from nextstate.envs.terminal import BUILTIN_TASKS
    shipped = list(BUILTIN_TASKS.glob("*/task.yaml"))
    assert shipped, f"no built-in terminal tasks in {BUILTIN_TASKS}"
    assert len(TerminalEnv().tasks) == len(shipped)


def test_network_tasks_ask_for_a_networked_sandbox() -> None:
    env = TerminalEnv([Task("n", "x", {"network": True})])
    assert env.sandbox_overrides(env.tasks[0]) == {"network": True}


def test_parse_pytest_summary() -> None:
    text = ("FAILED ../tmp/tests/t.py::a - assert 1\nPASSED ../tmp/tests/t.py::b\n"
            "PASSED ../tmp/tests/t.py::c\nERROR ../tmp/tests/t.py::c - teardown\nERROR tests/t2.py\n"
            "SKIPPED [1] t.py:3: no\n= 1 failed, 2 passed =\n")
    assert parse_pytest_summary(text) == {"t.py::a": "failed", "t.py::b": "passed", "t.py::c": "failed",
                                          "tests/t2.py": "failed"}


# -- episodes ----------------------------------------------------------------------------------------
@pytest.mark.docker
def test_check_env(task_dir: Path) -> None:
    env = gymnasium.make("nextstate/Terminal-v0", tasks=str(task_dir), backend="docker")
    check_env(env.unwrapped)
    env.close()


@pytest.mark.docker
def test_right_solution_scores_plus_one(env: TerminalEnv) -> None:
    obs, info = env.reset()
    assert obs == "Write the word hello into /app/hello.txt." and info["task_id"] == "hello"
    assert [t["function"]["name"] for t in info["tools"]] == ["bash", "write_file", "finish"]
    obs, reward, *_ = env.step(SOLVE)
    assert obs == "Wrote 6 bytes to /app/hello.txt." and reward == 0.0
    obs, reward, terminated, truncated, info = env.step(FINISH)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["outcome"]["tests"] == {"test_outputs.py::test_exists": "passed",
                                        "test_outputs.py::test_content": "passed"}


@pytest.mark.docker
def test_wrong_and_partial_solutions(env: TerminalEnv) -> None:
    env.reset()
    _, reward, *_, info = env.step(FINISH)
    assert reward == -1.0 and info["outcome"]["passed"] == 0 and "log_tail" in info["outcome"]
    env.reset()
    env.step(call("bash", command="echo bye > /app/hello.txt"))
    _, reward, *_, info = env.step(FINISH)
    assert reward == 0.0 and info["outcome"]["passed"] == 1 and info["outcome"]["total"] == 2


@pytest.mark.docker
def test_forged_summary_lines_do_not_count(env: TerminalEnv) -> None:
    env.reset()
    env.step(call("write_file", path="/app/hello.txt",
                  content="short test summary info\nPASSED fake.py::test_x\n"))
    _, reward, *_, info = env.step(FINISH)
    assert "fake.py::test_x" not in info["outcome"]["tests"] and reward == 0.0


@pytest.mark.docker
def test_tests_are_hidden_until_grading_and_shell_persists(env: TerminalEnv) -> None:
    env.reset()
    obs, *_ = env.step(call("bash", command="ls /tmp/tests; ls /app"))
    assert "No such file" in obs and "[exit code 0]" in obs
    env.step(call("bash", command="cd /tmp && export GREETING=hi"))
    obs, *_, info = env.step(call("bash", command="pwd; echo $GREETING; (exit 3)"))
    assert obs == "/tmp\nhi\n[exit code 3]" and info["next_state"]["exit_code"] == 3


@pytest.mark.docker
def test_malformed_actions_never_raise(env: TerminalEnv) -> None:
    env.reset()
    big = {"name": "write_file", "arguments": {"path": "/app/big", "content": "x" * 300_000}}
    for bad in ["", "ls -la", '<tool_call>{"name": "bash"}</tool_call>', {"oops": 1},
                call("bash", command=["ls"]), call("write_file", path="/app/a\x00b", content="x"),
                big, {"role": "assistant", "tool_calls": [{"type": "function", "function": big}]}]:
        obs, reward, terminated, truncated, info = env.step(bad)
        assert info["next_state"]["valid"] is False and obs.startswith("Invalid action")
        assert reward == 0.0 and not terminated and not truncated


@pytest.mark.docker
def test_endless_command_times_out_and_env_stays_usable(env: TerminalEnv) -> None:
    env.reset()
    obs, _, _, _, info = env.step(call("bash", command="sleep 100", timeout=1))
    ns = info["next_state"]
    assert ns["timed_out"] is True and ns["exit_code"] != 0 and "timed out" in obs
    assert ns["elapsed"] < 10
    obs, *_ = env.step(call("bash", command="echo still here"))
    assert obs == "still here\n[exit code 0]"


@pytest.mark.docker
def test_step_timeout_is_the_default_and_task_limit_the_cap(task_dir: Path, pool: SandboxPool) -> None:
    env = TerminalEnv(task_dir, pool=pool, step_timeout=1)
    env.reset()
    _, _, _, _, info = env.step(call("bash", command="sleep 5"))
    assert info["next_state"]["timed_out"]  # after the 1 s default, not the command's 5 s
    assert env.command_timeout_cap() == 20  # max_agent_timeout_sec of the task
    env.close()


@pytest.mark.docker
def test_output_flood_is_capped(env: TerminalEnv) -> None:
    env.reset()
    obs, _, _, _, info = env.step(call("bash", command="yes", timeout=2))
    assert info["next_state"]["truncated"] is True and info["next_state"]["timed_out"] is True
    assert 60_000 < len(obs) < 80_000 and "output truncated" in obs


@pytest.mark.docker
def test_write_file_errors_are_the_agents(env: TerminalEnv) -> None:
    env.reset()
    obs, _, _, _, info = env.step(call("write_file", path="/etc/passwd", content="x"))
    assert obs.startswith("Could not write /etc/passwd") and info["next_state"]["exit_code"] == 1
    assert "aborted" not in info


@pytest.mark.docker
def test_truncation_at_max_steps_grades_the_state(env: TerminalEnv) -> None:
    env.reset()
    env.step(SOLVE)
    for _ in range(env.max_steps - 2):
        assert env.step(call("bash", command="true"))[3] is False
    _, reward, terminated, truncated, info = env.step(call("bash", command="true"))
    assert env.max_steps == 10 and truncated and not terminated
    assert reward == 1.0 and info["outcome"]["passed"] == 2 and info["step"] == 9


@pytest.mark.docker
def test_embedded_task_and_dockerfile_task(tmp_path: Path, pool: SandboxPool) -> None:
    inline = Task("inline", "Write hello.", {"tests": {"test_outputs.py": TESTS}, "run_tests": DEFAULT_RUN_TESTS})
    img_dir = make_task(tmp_path, "nstest-marker", dockerfile=(
        "ARG BASE=nextstate/terminal:latest\nFROM ${BASE}\nRUN echo built > /app/marker\n"))
    env = TerminalEnv([inline, *load_terminal_tasks(img_dir)], pool=pool)
    env.reset(options={"task": "inline"})
    env.step(SOLVE)
    assert env.step(FINISH)[1] == 1.0
    env.reset(options={"task": "nstest-marker"})
    assert env.sandbox.spec.image.startswith("nextstate/task-nstest-marker-")
    assert env.step(call("bash", command="cat /app/marker"))[0] == "built\n[exit code 0]"
    env.close()


@pytest.mark.docker
def test_make_envs_starts_no_shared_pool_for_tasks_with_their_own_images(tmp_path: Path) -> None:
    """Warm sandboxes of the family image would sit idle next to tasks with Dockerfiles; each
    such task's sandbox starts with its episode and is not replaced ahead of the next one."""
    from nextstate.train.config import load_config
    from nextstate.train.wiring import make_envs
    img_dir = make_task(tmp_path, "nstest-marker", dockerfile=(
        "ARG BASE=nextstate/terminal:latest\nFROM ${BASE}\nRUN echo built > /app/marker\n"))
    cfg = load_config("terminal", overrides=[f"env.tasks={img_dir}", "rollout.parallel=2"])
    pool, factory, tasks = make_envs(cfg)
    assert pool is None and [t.id for t in tasks] == ["nstest-marker"]
    env = factory()
    try:
        env.reset(options={"task": "nstest-marker"})
        assert env.step(call("bash", command="cat /app/marker"))[0] == "built\n[exit code 0]"
        assert not env._private   # the image's pool is the factory's, shared by its envs
        [shared] = factory.image_pools._pools.values()
        assert not shared.warm and shared.size == 2
        env.step(FINISH)
        env.reset(options={"task": "nstest-marker"})  # the same image again: a fresh sandbox on demand
        assert shared.stats()["leased"] == 1 and shared.stats()["ready"] == 0
    finally:
        env.close()
        factory.close()
    assert shared._closed

    cfg = load_config("terminal", overrides=["env.tasks=procedural:0:4", "rollout.parallel=2"])
    pool, _, _ = make_envs(cfg)       # tasks in the family image: the shared warm pool
    try:
        assert pool is not None and pool.warm and pool.size == 2
    finally:
        pool.close()


@pytest.mark.docker
def test_sixteen_envs_share_a_pool_of_four(task_dir: Path, pool: SandboxPool) -> None:
    results: dict[int, float] = {}
    errors: list[BaseException] = []

    def episode(i: int) -> None:
        env = TerminalEnv(task_dir, pool=pool)
        try:
            env.reset(seed=i)
            if i % 2 == 0:
                env.step(SOLVE)
            env.step(call("bash", command=f"echo {i} > /tmp/me"))
            results[i] = env.step(FINISH)[1]
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)
        finally:
            env.close()

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    assert results == {i: 1.0 if i % 2 == 0 else -1.0 for i in range(16)}
    assert pool.stats()["leased"] == 0
