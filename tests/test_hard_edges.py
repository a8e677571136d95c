"""Hostile actions through a real env on Docker: each is a recorded invalid step, none aborts."""

from __future__ import annotations

import json

import pytest

from envs.actions import tool_schema
from envs.base import NextStateEnv, Outcome, Task, ToolResult
from envs.pool import SandboxPool


class ShellEnv(NextStateEnv):
    """One task, a bash tool with an optional timeout, and a finish tool."""

    family = "terminal"
    tools = [tool_schema("bash", "Run a command.", {"command": "string", "timeout": "number"},
                         required=["command"]),
             tool_schema("finish", "Done.")]

    def load_tasks(self, source):
        return [Task("t", "Do anything.")]

    def call_tool(self, call):
        if call.name == "finish":
            return ToolResult("bye", done=True)
        return self.command_result(self.run(call.arguments["command"], call.arguments.get("timeout")))

    def compute_outcome(self):
        return Outcome(0.0)


def bash(command: str, timeout: str = "") -> str:
    extra = f', "timeout": {timeout}' if timeout else ""
    return f'<tool_call>{{"name": "bash", "arguments": {{"command": {json.dumps(command)}{extra}}}}}</tool_call>'


HOSTILE = {
    "nan timeout": bash("echo x", "NaN"),
    "inf timeout": bash("echo x", "Infinity"),
    "-inf timeout": bash("echo x", "-Infinity"),
    "overflowing float": bash("echo x", "1e999"),
    "huge integer": bash("echo x", "1" + "0" * 400),
    "too many digits": bash("echo x", "1" + "0" * 5000),
    "lone surrogate": '<tool_call>{"name": "bash", "arguments": {"command": "echo \\ud800"}}</tool_call>',
    "raw lone surrogate": bash("echo x").replace("echo x", "echo \ud800"),
    "NUL byte": bash("echo a\x00b"),
    "deep JSON": "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
    "deep arguments": '<tool_call>{"name": "bash", "arguments": ' + '{"a": ' * 60_000 + "1"
                      + "}" * 60_000 + "}</tool_call>",
}


@pytest.fixture(scope="module")
def env(terminal_image):
    with SandboxPool(terminal_image, size=1, backend="docker") as pool:
        e = ShellEnv(pool=pool, max_steps=2 * len(HOSTILE) + 5)
        yield e
        e.close()


@pytest.mark.docker
def test_every_malformed_action_is_a_recorded_invalid_step(env):
    env.reset()
    for what, action in HOSTILE.items():
        obs, reward, terminated, truncated, info = env.step(action)
        ns = info["next_state"]
        assert "aborted" not in info, what
        assert ns["valid"] is False and obs.startswith("Invalid action: "), (what, obs[:200])
        assert len(ns["error"]) < 400 and "Traceback" not in ns["error"], what
        assert not terminated and not truncated
        # nothing was sent: the next command's output is its own, no leaked marker
        obs, *_ = env.step(bash("echo ok"))
        assert obs == "ok\n[exit code 0]", (what, obs[:200])
    assert env.step('<tool_call>{"name": "finish", "arguments": {}}</tool_call>')[2]  # lease given back


@pytest.mark.docker
def test_malformed_actions_do_not_abort_an_agent_loop_episode(env):
    """Through agents.loop, as training runs it: every step is recorded, the episode ends normally."""
    import asyncio

    from agents.loop import collect
    from agents.testing import ScriptedPolicy

    hostile = [a for what, a in HOSTILE.items() if what != "raw lone surrogate"]  # not tokenizable
    script = hostile + ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>']
    answers = iter(script)   # in order, whatever the chat budget leaves of the history
    policy = ScriptedPolicy(lambda messages: next(answers))
    [traj] = asyncio.run(collect(lambda: ShellEnv(pool=env.pool, max_steps=len(script)),
                                 policy, env.tasks, parallel=1))
    assert traj.status == "finished", (traj.status, traj.error)
    assert len(traj.steps) == len(script)
    assert sum(not s.next_state["valid"] for s in traj.steps) == len(hostile)
