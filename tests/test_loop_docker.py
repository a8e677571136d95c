"""The agent loop over real Docker terminal episodes, 8 at a time, judged by an HTTP server."""

from __future__ import annotations

import json

import pytest

from nextstate.train.rollout import collect
from nextstate.agents.openai_policy import OpenAIPolicy
from nextstate.agents.testing import ScriptedOpenAIServer, ScriptedPolicy
from nextstate.envs.pool import SandboxPool
from nextstate.envs.terminal import TerminalEnv, load_terminal_tasks
from nextstate.judges.prm import StepJudge

pytestmark = pytest.mark.docker

ROWS = [
    {"id": "hello", "instruction": "Create /app/hello.txt containing the word hello.",
     "tests": "import pathlib\n\ndef test_hello():\n"
              "    assert pathlib.Path('/app/hello.txt').read_text().strip() == 'hello'\n"},
    {"id": "three", "instruction": "Write the number 3 into /app/n.txt.",
     "tests": "import pathlib\n\ndef test_n():\n"
              "    assert pathlib.Path('/app/n.txt').read_text().strip() == '3'\n"},
]


def call(name: str, **args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    path = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return load_terminal_tasks(path)


async def test_eight_parallel_terminal_episodes(terminal_image, tasks):
    policy = ScriptedPolicy([call("bash", command="echo hello > /app/hello.txt && cat /app/hello.txt"),
                             call("finish")], delay=0.05)
    with SandboxPool(terminal_image, size=8) as pool, \
            ScriptedOpenAIServer(lambda req: ["fine \\boxed{1}", "bad \\boxed{-1}", "\\boxed{1}"]) as server:
        judge = StepJudge(OpenAIPolicy(server.url, model="judge"), m=3)
        trajs = await collect(lambda: TerminalEnv(tasks, pool=pool), policy, tasks, n_samples=4,
                              parallel=8, judge=judge, progress=False)
        assert pool.stats()["leased"] == 0
    assert len(trajs) == 8 and [t.task_id for t in trajs] == ["hello"] * 4 + ["three"] * 4
    for t in trajs:
        assert t.status == "finished", t.error
        assert len(t.steps) == 2 and t.family == "terminal"
        first = t.steps[0]
        assert first.next_state["exit_code"] == 0 and "hello" in first.observation.text
        for s in t.steps:
            assert s.prompt_ids and s.response_ids and len(s.logprobs) == len(s.response_ids)
            assert s.votes == [1, -1, 1] and s.score == 1.0 and s.vote_mean == pytest.approx(1 / 3)
        assert t.outcome == (1.0 if t.task_id == "hello" else -1.0)
        assert t.info["outcome"]["total"] == 1
    assert len(server.requests) == 16 and all(r["n"] == 3 for r in server.requests)
    assert len({t.group_id for t in trajs}) == 2


async def test_sandbox_dying_mid_episode_aborts(terminal_image, tasks):
    envs: list[TerminalEnv] = []

    def script(messages):
        if sum(m["role"] == "assistant" for m in messages) == 1:
            envs[0].sandbox.container.kill()  # the machine dies under the agent
        return call("bash", command="ls /app")

    def factory() -> TerminalEnv:
        envs.append(TerminalEnv(tasks, pool=pool))
        return envs[-1]

    with SandboxPool(terminal_image, size=1) as pool:
        trajs = await collect(factory, ScriptedPolicy(script), tasks[:1], progress=False)
    t = trajs[0]
    assert t.status == "aborted" and t.outcome is None
    assert "SandboxError" in t.error and len(t.steps) == 2
