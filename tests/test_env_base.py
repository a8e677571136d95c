"""The base contract, through a complete small env defined here (the one docs/adding-an-environment.md builds)."""

from __future__ import annotations

import json

import gymnasium
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env

from nextstate.envs import registry
from nextstate.envs.actions import tool_schema
from nextstate.envs.base import AnyText, NextStateEnv, Outcome, Task, ToolResult
from nextstate.envs.pool import SandboxPool

pytestmark = pytest.mark.docker


# ---- the guide's example (docs/adding-an-environment.md): a complete env in under 40 lines ----
class CountEnv(NextStateEnv):
    """How many files are in /app/box? Look with bash, then submit the number."""

    family = "count"
    default_max_steps = 4
    tools = [tool_schema("bash", "Run a shell command.", {"command": "string"}),
             tool_schema("submit", "Submit your count; ends the episode.", {"n": "integer"})]

    def load_tasks(self, source):
        return [Task(f"count-{n}", "How many files are in /app/box?", {"n": n}) for n in (1, 3, 5)]

    def start_episode(self, task):
        self.answer = None
        self.run(f"mkdir -p /app/box && cd /app/box && touch $(seq -f 'f%g' {task.data['n']})")
        return "Use the bash tool to look."

    def call_tool(self, call):
        if call.name == "bash":
            return self.command_result(self.run(call.arguments["command"]))
        self.answer = call.arguments["n"]
        return ToolResult("Submitted.", done=True)

    def compute_outcome(self):
        right = self.answer == self.task.data["n"]
        return Outcome(1.0 if right else -1.0, {"answer": self.answer})


registry.register("count", CountEnv, intro="You are an agent counting files in a Linux terminal.")
# --------------------------------------------------------------------------------------------

LS = '<tool_call>{"name": "bash", "arguments": {"command": "ls /app/box | wc -l"}}</tool_call>'


@pytest.fixture(scope="module")
def pool(terminal_image: str):
    with SandboxPool(terminal_image, size=2, backend="docker") as p:
        yield p


@pytest.fixture
def env(pool: SandboxPool):
    e = CountEnv(pool=pool)
    yield e
    e.close()


def test_subclass_runs_an_episode_through_gymnasium_make(terminal_image: str) -> None:
    env = gymnasium.make("nextstate/Count-v0", backend="docker")
    obs, info = env.reset(options={"task": "count-3"})
    assert obs.startswith("How many files") and obs.endswith("Use the bash tool to look.")
    assert info["task_id"] == "count-3" and [t["function"]["name"] for t in info["tools"]] == ["bash", "submit"]
    obs, reward, terminated, truncated, info = env.step(LS)
    assert obs == "3\n[exit code 0]" and reward == 0.0 and not terminated and not truncated
    assert info["next_state"]["action"] == {"name": "bash", "arguments": {"command": "ls /app/box | wc -l"}}
    obs, reward, terminated, truncated, info = env.step({"name": "submit", "arguments": {"n": 3}})
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["outcome"] == {"reward": 1.0, "answer": 3}
    env.close()


def test_check_env_passes(terminal_image: str) -> None:
    env = gymnasium.make("nextstate/Count-v0", backend="docker")
    check_env(env.unwrapped)
    env.close()


def test_wrong_answer_scores_minus_one_and_info_is_json(env: CountEnv) -> None:
    env.reset(options={"task": "count-5"})
    _, reward, terminated, _, info = env.step({"name": "submit", "arguments": {"n": 4}})
    assert reward == -1.0 and terminated
    json.dumps(info)
    assert set(info) == {"step", "task_id", "next_state", "outcome"}
    ns = info["next_state"]
    assert {"action", "valid", "error", "output", "exit_code", "elapsed", "timed_out"} <= set(ns)


def test_malformed_action_counts_as_a_step_and_never_raises(env: CountEnv) -> None:
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step("let me think")
    assert obs.startswith("Invalid action: No tool call") and "<tool_call>" in obs
    assert info["next_state"]["valid"] is False and info["next_state"]["action"] is None
    assert info["step"] == 0 and reward == 0.0 and not (terminated or truncated)
    _, _, _, _, info = env.step('<tool_call>{"name": "rm", "arguments": {}}</tool_call>')
    assert "Unknown tool 'rm'" in info["next_state"]["error"] and info["step"] == 1


def test_truncation_grades_the_final_state(env: CountEnv) -> None:
    env.reset(options={"task": "count-1"})
    for i in range(env.max_steps):
        _, reward, terminated, truncated, info = env.step(LS)
        assert info["step"] == i
    assert truncated and not terminated
    assert reward == -1.0 and info["outcome"] == {"reward": -1.0, "answer": None}
    with pytest.raises(ResetNeeded):
        env.step(LS)


def test_max_steps_argument_and_step_before_reset(pool: SandboxPool) -> None:
    env = CountEnv(pool=pool, max_steps=1)
    with pytest.raises(ResetNeeded):
        env.step(LS)
    env.reset()
    assert env.step("nothing")[3] is True  # truncated after one (invalid) step
    env.close()


def test_seeded_reset_is_deterministic_and_tasks_can_be_chosen(env: CountEnv) -> None:
    first = [env.reset(seed=s)[1]["task_id"] for s in range(3)]
    assert first == [env.reset(seed=s)[1]["task_id"] for s in range(3)]
    assert env.reset(options={"task": env.tasks[2]})[1]["task_id"] == "count-5"
    with pytest.raises(KeyError, match="unknown task 'nope'"):
        env.reset(options={"task": "nope"})


def test_sandbox_is_leased_for_the_episode_only(env: CountEnv, pool: SandboxPool) -> None:
    env.reset()
    assert pool.stats()["leased"] == 1
    env.step({"name": "submit", "arguments": {"n": 0}})
    assert pool.stats()["leased"] == 0  # given back as soon as the episode ends
    env.reset()
    env.close()
    env.close()  # twice is fine
    assert pool.stats()["leased"] == 0


def test_dead_sandbox_aborts_the_episode(env: CountEnv) -> None:
    env.reset(options={"task": "count-1"})
    env.sandbox.container.kill()
    obs, reward, terminated, truncated, info = env.step(LS)
    assert truncated and not terminated and reward == 0.0
    assert "aborted" in info and "outcome" not in info and "aborted" in obs
    with pytest.raises(ResetNeeded):
        env.step(LS)
    env.reset(options={"task": "count-1"})  # a fresh sandbox
    assert env.step(LS)[0] == "1\n[exit code 0]"


def test_a_task_needing_another_sandbox_gets_a_private_pool(pool: SandboxPool) -> None:
    class SmallEnv(CountEnv):
        def sandbox_overrides(self, task):
            return {"memory": "256m"}

    env = SmallEnv(pool=pool)
    env.reset(options={"task": "count-1"})
    assert pool.stats()["leased"] == 0 and env.sandbox.spec.memory == "256m"
    assert env.step(LS)[0] == "1\n[exit code 0]"
    private = list(env._private.values())
    env.close()
    assert private and all(p._closed for p in private)


def test_text_space_accepts_any_text() -> None:
    space = AnyText(100)
    assert space.contains("ünïcode ✓ \x00 {json}") and space.contains("")
    assert not space.contains("x" * 101) and not space.contains(3)
    assert space.contains(space.sample())


def test_render_ansi_returns_the_last_observation(pool: SandboxPool) -> None:
    env = CountEnv(pool=pool, render_mode="ansi")
    obs, _ = env.reset()
    assert env.render() == obs
    with pytest.raises(ValueError):
        CountEnv(pool=pool, render_mode="human")
    env.close()


def test_reset_replaces_a_sandbox_whose_shell_connection_broke(pool: SandboxPool, sever_shell) -> None:
    """The next sandbox to be leased cannot start the episode (its shell's socket was closed
    under it): reset gives it back and starts the episode on a replacement."""
    pool.wait_ready(120)
    broken = pool._ready[0]   # the one the next lease takes
    sever_shell(broken)
    env = CountEnv(pool=pool)
    try:
        env.reset(options={"task": "count-3"})
        assert env.sandbox is not broken and broken.closed
        assert env.run("ls /app/box | wc -l").stdout.strip() == "3"
    finally:
        env.close()
