"""Warm starts per role on a multi-agent family (relay): each role's examples are that role's own
view, built as the agent loop builds it, and a run with ``agents`` warm-starts one model per policy."""

from __future__ import annotations

import asyncio
import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from nextstate.agents.chat import ChatConfig
from nextstate.agents.recorder import Recorder
from nextstate.agents.testing import ScriptedPolicy
from nextstate.envs.relay import RelayEnv
from nextstate.envs.relay.env import WORDS, hasty_actions, instance
from nextstate.train.rollout import agent_measures, run_episode
from nextstate.train.sft import oracle_episode

CHAT = ChatConfig(context_tokens=2048, max_response_tokens=48, system_prompt=False)


def text_of(messages: list[dict]) -> str:
    return "\n".join(str(m["content"]) for m in messages)


def test_hasty_relay_behaviour_leaves_each_role_something_to_learn():
    plans = [hasty_actions(instance(7), random.Random(i)) for i in range(400)]
    word = instance(7).data["value"]
    read = [p for p in plans if p[0]["name"] == "bash"]
    assert 150 <= len(read) <= 250                                       # the reader looks half of the time
    assert all(p[2]["arguments"]["message"] == word for p in read)       # and then tells what it read
    told = [p[-2 if p in read else 0]["arguments"]["message"] for p in plans]
    as_told = sum(p[-1]["arguments"]["word"] == t for p, t in zip(plans, told))
    assert 0.55 <= as_told / len(plans) <= 0.7                           # the writer repeats it 5 times in 8
    assert {p[-1]["arguments"]["word"] for p in plans} == set(WORDS)


def test_agent_measures_are_each_roles_own():
    task = instance(3)
    word, other = task.data["value"], next(w for w in WORDS if w != task.data["value"])
    say = lambda m: {"name": "say", "arguments": {"message": m}}   # noqa: E731
    actions = [("reader", {"name": "bash", "arguments": {"command": "cat /app/note"}}), ("writer", say("ready")),
               ("reader", say(f"it is {word}")), ("writer", {"name": "answer", "arguments": {"word": other}})]
    assert RelayEnv.agent_measures(task, actions) == {"reader/word_told": 1.0, "writer/answer_when_told": 0.0}
    answer = lambda w: {"name": "answer", "arguments": {"word": w}}   # noqa: E731
    right = [("reader", say(other)), ("writer", say("?")), ("reader", say(word)), ("writer", answer(f" {word.upper()}"))]
    assert RelayEnv.agent_measures(task, right) == {"reader/word_told": 0.5, "writer/answer_when_told": 1.0}
    # told, but the steps ran out before the writer answered: the writer's part failed
    assert RelayEnv.agent_measures(task, right[:3] + [("writer", say(word))])["writer/answer_when_told"] == 0.0
    # the reader never told the word: repeating its wrong word is not the writer's part, right or wrong
    wrong = [("reader", say(other)), ("writer", answer(other.upper()))]
    assert RelayEnv.agent_measures(task, wrong) == {"reader/word_told": 0.0}
    assert RelayEnv.agent_measures(task, [("reader", None), ("writer", None)]) == {}


@pytest.mark.docker
def test_each_roles_examples_are_its_own_view_as_the_agent_loop_builds_it(tmp_path, terminal_image):
    env = RelayEnv("relay:0:8", max_steps=6)
    policy = ScriptedPolicy(["unused"])   # builds prompts with the tiny tokenizer; generates nothing here
    try:
        for i, task in enumerate(env.tasks):
            word = task.data["value"]
            examples = oracle_episode(env, task, policy, CHAT, "hasty", random.Random(i))
            assert examples and [e.role for e in examples][:2] == ["reader", "writer"]
            actions = [json.loads(e.text.removeprefix("<tool_call>").removesuffix("</tool_call>")) for e in examples]
            said = [a["arguments"]["message"] for e, a in zip(examples, actions) if e.role == "reader" and a["name"] == "say"]
            for k, ex in enumerate(examples):
                seen = text_of(ex.messages)
                assert ("You are the reader" in seen) == (ex.role == "reader")
                if ex.role == "writer":   # the writer sees only what the reader said, never the note
                    told = [a["arguments"]["message"] for e, a in zip(examples[:k], actions) if e.role == "reader"
                            and a["name"] == "say"]
                    assert "cat /app/note" not in seen and (word in told or word not in seen), seen
                    assert all(line.startswith("The reader says:") for line in seen.splitlines() if word in line)
            # the agent loop, replaying the same actions, shows each role the very same prompts
            scripts = {role: ScriptedPolicy([e.text for e in examples if e.role == role]) for role in ("reader", "writer")}
            rec = Recorder(tmp_path / f"{i}.jsonl")
            with ThreadPoolExecutor(2) as pool:
                traj = asyncio.run(run_episode(env, scripts, task=task, group_id="g", sample=i, executor=pool,
                                               chat=CHAT, recorder=rec))
            rec.close()
            rows = [json.loads(line) for line in (tmp_path / f"{i}.jsonl").read_text().splitlines()]
            steps = [r for r in rows if r["kind"] == "step"]
            assert [(r["role"], r["messages"]) for r in steps] == [(e.role, e.messages) for e in examples]
            measured = agent_measures(RelayEnv, env.tasks, [traj])
            assert measured["reader/word_told"] == sum(m == word for m in said) / len(said)
    finally:
        env.close()


@pytest.mark.docker
def test_a_run_with_agents_warm_starts_one_model_per_role(tmp_path, terminal_image):
    from nextstate.train.config import load_config
    from nextstate.train.sft import warm_starts

    cfg = load_config("relay", cpu_demo=True, overrides=[
        "agents.reader=tiny", "agents.writer=tiny", "sft.tasks=relay:0:4", "sft.steps=2", "rollout.parallel=2"])
    starts = warm_starts(cfg, tmp_path, progress=False)
    assert starts == {"reader": str(tmp_path / "reader"), "writer": str(tmp_path / "writer")}
    for role in ("reader", "writer"):
        summary = json.loads((tmp_path / role / "sft.json").read_text())
        assert summary["roles"] == [role] and summary["source"] == "hasty" and summary["examples"] >= 4
        assert (tmp_path / role / "model.safetensors").is_file()
    assert warm_starts(cfg, tmp_path, progress=False) == starts   # made once, then reused
    shared = load_config("relay", cpu_demo=True, overrides=["sft.tasks=relay:0:4", "sft.steps=2", "rollout.parallel=2"])
    one = warm_starts(shared, tmp_path / "shared", progress=False)
    assert one == {"reader+writer": str(tmp_path / "shared")}
    summary = json.loads((tmp_path / "shared" / "sft.json").read_text())
    assert summary["roles"] == ["reader", "writer"]
    per_role = sum(json.loads((tmp_path / r / "sft.json").read_text())["examples"] for r in ("reader", "writer"))
    assert summary["examples"] == per_role   # the same episodes, split by role
