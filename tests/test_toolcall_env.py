"""The tool-call env: math rows, answer checking, and Python that runs in the sandbox."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from pathlib import Path

import gymnasium
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gymnasium.utils.env_checker import check_env

from nextstate import envs  # noqa: F401 -- registers the ids
from nextstate.envs.base import Task
from nextstate.envs.pool import SandboxPool
from nextstate.envs.toolcall import BUILTIN_TASKS, ToolCallEnv, answers_match, load_math_tasks, math_task

TASKS = [Task("half", "What is 1/2 as a decimal?", {"answer": "0.5"}),
         Task("thousand", "What is 10^3?", {"answer": "1000"})]


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# -- answers (no Docker) ---------------------------------------------------------------------------
@pytest.mark.parametrize("answer, reference, equal", [
    ("\\frac{1}{2}", "0.5", True),
    ("0.5", "\\frac{1}{2}", True),
    ("1,000", "1000", True),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{3}", "3", True),
    ("The answer is $\\boxed{204}$.", "204", True),
    ("x^2+1", "1+x^2", True),
    ("4", "3", False),
    ("\\boxed{}", "3", False),
    ("", "3", False),
])
def test_answers_match(answer: str, reference: str, equal: bool) -> None:
    assert answers_match(answer, reference) is equal


def test_answers_match_off_the_main_thread_and_on_pathological_input() -> None:
    got: list[bool] = []
    worker = threading.Thread(target=lambda: got.extend(
        [answers_match("\\frac{1}{2}", "0.5"), answers_match("\\boxed{9^{9^{9^{9}}}}", "5")]))
    worker.start()
    worker.join(60)
    assert got == [True, False]


# -- rows (no Docker) --------------------------------------------------------------------------------
def test_dapo_and_aime_rows(tmp_path: Path) -> None:
    dapo = {"data_source": "math_dapo", "prompt": [{"role": "user", "content": "Compute 2+2."}],
            "reward_model": {"ground_truth": "4", "style": "rule"}, "extra_info": {"index": "abc"}}
    aime = {"ID": "2024-I-1", "Problem": "Find x.", "Answer": 204}
    simple = {"prompt": "What is 3?", "answer": "3"}
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in (dapo, aime, simple)) + "\n")
    pq.write_table(pa.Table.from_pylist([dapo | {"extra_info": {"index": "pq"}}]), tmp_path / "b.parquet")
    tasks = load_math_tasks(tmp_path)
    assert [(t.id, t.instruction, t.data["answer"]) for t in tasks] == [
        ("abc", "Compute 2+2.", "4"), ("2024-I-1", "Find x.", "204"), ("a-2", "What is 3?", "3"),
        ("pq", "Compute 2+2.", "4")]
    assert tasks[0].category == "math_dapo"
    assert [t.id for t in load_math_tasks(tmp_path / "b.parquet")] == ["pq"]
    with pytest.raises(ValueError, match="row 7"):
        math_task({"prompt": "no answer"}, "x", "row 7")


def test_builtin_problems_load() -> None:
    assert list(BUILTIN_TASKS.glob("*.jsonl")), f"no built-in math problems in {BUILTIN_TASKS}"
    assert ToolCallEnv().tasks


def test_answer_forms_parse_without_a_sandbox() -> None:
    env = ToolCallEnv(TASKS)
    assert env.parse(call("finish", answer="\\boxed{2}")).name == "answer"
    assert env.parse("So the result is \\boxed{2}.").arguments == {"answer": "So the result is \\boxed{2}."}
    assert env.parse({"role": "assistant", "content": "\\boxed{7}"}).name == "answer"
    assert env.parse(call("answer", answer=7)).arguments == {"answer": 7}
    with pytest.raises(Exception, match="No tool call"):
        env.parse("I am not sure yet.")


# -- episodes ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool(terminal_image: str):
    with SandboxPool(terminal_image, size=2, backend="docker") as p:
        yield p


@pytest.mark.docker
def test_check_env() -> None:
    env = gymnasium.make("nextstate/ToolCall-v0", tasks=TASKS, backend="docker")
    check_env(env.unwrapped)
    env.close()


@pytest.mark.docker
def test_python_runs_in_the_sandbox_not_here(pool: SandboxPool) -> None:
    env = ToolCallEnv(TASKS, pool=pool)
    obs, info = env.reset(options={"task": "half"})
    assert obs.startswith("What is 1/2 as a decimal?") and "\\boxed{}" in obs
    assert pool.stats()["leased"] == 0  # no sandbox until the first python call
    marker = Path(f"/tmp/written-by-the-model-{uuid.uuid4().hex}")
    code = (f"import socket, pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
            "print(socket.gethostname(), 6 * 7)")
    obs, reward, terminated, _, info = env.step(call("python", code=code))
    host, answer = obs.splitlines()[0].split()
    assert answer == "42" and host != socket.gethostname()
    assert not marker.exists() and env.sandbox.read_file(str(marker)) == b"x"
    assert info["next_state"]["exit_code"] == 0 and pool.stats()["leased"] == 1
    obs, *_ = env.step(call("python", code="raise SystemExit(3)"))
    assert obs.endswith("[exit code 3]")
    obs, _, _, _, info = env.step(call("python", code="while True: pass", timeout=1))
    assert info["next_state"]["timed_out"] and "timed out" in obs
    _, reward, terminated, _, info = env.step(call("answer", answer="\\frac{1}{2}"))
    assert reward == 1.0 and terminated and info["outcome"]["correct"] is True
    assert pool.stats()["leased"] == 0
    env.close()


@pytest.mark.docker
def test_right_wrong_and_missing_answers(pool: SandboxPool) -> None:
    env = ToolCallEnv(TASKS, pool=pool, max_steps=2)
    env.reset(options={"task": "thousand"})
    assert env.step("After computing, the answer is \\boxed{1,000}.")[1] == 1.0
    env.reset(options={"task": "thousand"})
    _, reward, _, _, info = env.step(call("finish", answer="999"))
    assert reward == -1.0 and info["outcome"] == {"reward": -1.0, "answer": "999", "reference": "1000",
                                                   "correct": False}
    env.reset(options={"task": "half"})
    env.step("hmm")
    _, reward, terminated, truncated, info = env.step("still thinking")
    assert truncated and not terminated and reward == -1.0
    assert info["outcome"]["reason"] == "no answer was given"
    env.close()
