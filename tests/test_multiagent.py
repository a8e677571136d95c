"""Multi-agent episodes: the native relay family, the PettingZoo AEC API over both routes, and
the agent loop giving each agent of a MultiAgentEnv only its own view."""

from __future__ import annotations

import asyncio
import json
import re
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
from pettingzoo.test import api_test

from nextstate.agents.testing import ScriptedPolicy
from nextstate.envs.base import play
from nextstate.envs.multiagent import AECEnv
from nextstate.envs.relay import NOTE, RelayEnv
from nextstate.envs.relay.env import load
from nextstate.envs.terminal import TerminalEnv
from nextstate.train.rollout import run_episode

pytestmark = pytest.mark.docker


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def relay(terminal_image):
    env = RelayEnv("relay:0:8")
    yield env
    env.close()


def test_heldout_seeds_are_never_the_training_seeds():
    train, heldout = {t.data["seed"] for t in load("relay:train")}, {t.data["seed"] for t in load("relay:heldout")}
    assert len(train) == 1024 and len(heldout) == 64 and not train & heldout
    with pytest.raises(ValueError, match="relay:START:COUNT"):
        load("relay:x")


def test_gold_team_succeeds_and_noop_fails(relay):
    for task in relay.tasks[:2]:
        relay.reset(options={"task": task})
        assert play(relay, relay.oracle_actions(task, "gold"))[0] == 1.0
        relay.reset(options={"task": task})
        reward, info = play(relay, relay.oracle_actions(task, "noop"))
        assert reward == -1.0 and info["outcome"]["answer"] == ""


def test_information_is_split_between_reader_and_writer(relay):
    task = relay.tasks[1]
    word = task.data["value"]
    obs, info = relay.reset(options={"task": task})
    assert info["agent"] == "reader" and [t["function"]["name"] for t in info["tools"]] == ["bash", "say"]
    assert word not in obs
    obs, _, _, _, info = relay.step(call("bash", command=f"cat {NOTE}"))
    assert info["next_agent"] == "writer" and word not in obs            # the writer sees no file
    obs, _, _, _, info = relay.step(call("bash", command="ls /"))       # the writer has no shell
    assert info["agent"] == "writer" and not info["next_state"]["valid"]
    assert word in obs                                                   # back to the reader: its cat output
    obs, _, _, _, info = relay.step(call("answer", word=word))          # the reader cannot answer
    assert not info["next_state"]["valid"] and "The writer says" not in obs
    assert "Invalid action" in obs                                        # the writer's own failed step
    obs, _, _, _, info = relay.step(call("say", message="waiting"))     # the writer
    assert "The writer says: waiting" in obs
    obs, _, terminated, _, info = relay.step(call("say", message=word))  # the reader tells
    assert info["agent"] == "reader" and obs.endswith(f"The reader says: {word}") and not terminated


def test_aec_api_on_the_native_family_and_on_a_routed_single_agent_env(terminal_image):
    for env in (AECEnv(RelayEnv("relay:0:4")),
                AECEnv(TerminalEnv("procedural:0:4"), roles=["planner_0", "executor_0"])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # PettingZoo's advice to prefer Box spaces and numbered names
            api_test(env, num_cycles=10)
        env.close()


def test_aec_episode_gives_the_team_its_outcome(terminal_image):
    env = AECEnv(RelayEnv("relay:0:4"))
    task = env.env.tasks[2]
    env.reset(options={"task": task})
    script = iter(env.env.oracle_actions(task, "gold"))
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        if terminated or truncated:
            assert reward == 1.0 and info["outcome"]["word"] == task.data["value"]
            env.step(None)
        else:
            env.step(next(script))
    assert env.agents == []
    env.close()


def _reader(messages: list[dict]) -> str:
    seen = "\n".join(str(m["content"]) for m in messages if m["role"] in ("user", "tool"))
    found = re.search(r"^(\w+)\n\[exit code 0\]", seen, re.M)
    return call("say", message=found.group(1)) if found else call("bash", command=f"cat {NOTE}")


def _writer(messages: list[dict]) -> str:
    seen = "\n".join(str(m["content"]) for m in messages if m["role"] in ("user", "tool"))
    told = re.search(r"The reader says: (\w+)", seen)
    return call("answer", word=told.group(1)) if told else call("say", message="ready")


def test_agent_loop_gives_each_agent_only_its_own_view(relay):
    reader, writer = ScriptedPolicy(_reader), ScriptedPolicy(_writer)
    prompts: dict[str, list[list[dict]]] = {"reader": [], "writer": []}
    for name, policy in (("reader", reader), ("writer", writer)):
        original = policy.generate

        async def spy(messages, tools=None, _name=name, _original=original, **kw):
            prompts[_name].append(messages)
            return await _original(messages, tools, **kw)
        policy.generate = spy
    task = relay.tasks[3]
    with ThreadPoolExecutor(2) as pool:
        traj = asyncio.run(run_episode(relay, {"reader": reader, "writer": writer}, task=task, group_id="g",
                                       sample=0, executor=pool))
    assert traj.outcome == 1.0 and [s.role for s in traj.steps] == ["reader", "writer", "reader", "writer"]
    word = task.data["value"]
    writer_text = json.dumps(prompts["writer"])
    assert "[exit code 0]" not in writer_text                   # never the reader's shell output
    assert f"The reader says: {word}" in json.dumps(prompts["writer"][-1])
    assert word not in json.dumps(prompts["writer"][0])          # not before it was told
    assert "You are the writer" in writer_text and "You are the writer" not in json.dumps(prompts["reader"])
    # each agent's own history: the reader's second prompt holds its first action and its output
    second = prompts["reader"][1]
    assert [m["role"] for m in second][-2:] == ["assistant", "tool"] and f"{word}\n[exit code 0]" in second[-1]["content"]


def test_a_policy_missing_for_an_agent_is_a_one_line_error(relay):
    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="no policy for the agents writer"):
        asyncio.run(run_episode(relay, {"reader": ScriptedPolicy(_reader)}, task=relay.tasks[0], group_id="g",
                                sample=0, executor=pool))
