"""agents.chat: system prompt, message building, context truncation."""

from __future__ import annotations

import base64

import pytest

from nextstate.agents.chat import ChatConfig, Turn, build_messages, clip, observation_content, prompt_head, system_prompt
from nextstate.agents.hf_policy import HFPolicy
from nextstate.agents.policy import Generation, Policy
from nextstate.envs.base import Observation

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run",
                                           "parameters": {"type": "object", "properties": {}}}}]


class CharPolicy(Policy):
    """Stands in for a model; only its token counting (4 chars a token) is used here."""

    async def generate(self, messages, tools=None, **sampling):
        return Generation("")


def test_system_prompt_family_role_and_tools():
    text = system_prompt("terminal", TOOLS, "You are the planner.", tools_in_text=True)
    assert "Linux terminal" in text and "You are the planner." in text
    assert '"name": "bash"' in text and "<tool_call>" in text
    assert '"name": "bash"' not in system_prompt("swe", TOOLS)
    assert "code repository" in system_prompt("swe", TOOLS)


def test_without_a_system_prompt_the_prompt_is_the_task_and_history():
    policy = CharPolicy()
    policy.renders_tools = True
    on, off = ChatConfig(), ChatConfig(system_prompt=False)
    system, tools = prompt_head("terminal", TOOLS, policy, on)
    assert "Linux terminal" in system and tools == TOOLS
    assert prompt_head("terminal", TOOLS, policy, off) == (None, None)
    msgs = build_messages(None, "TASK", [Turn("<tool_call>x</tool_call>", "out")], policy=policy, tools=None,
                          config=off)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool"] and msgs[0]["content"] == "TASK"


def test_observation_with_images_becomes_parts():
    png = b"\x89PNG fake"
    content = observation_content(Observation("screen", [png]), 100)
    assert content[0] == {"type": "text", "text": "screen"}
    assert content[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(png).decode()
    assert observation_content("plain", 100) == "plain"
    assert observation_content(Observation("two", [png, png]), 100, max_images=1)[0]["text"] == \
        "two\n[1 image omitted]"


def test_an_observation_the_contract_does_not_know_is_refused():
    """The GUI env was once blind: its dict fell through to ''. Now that is an error."""
    with pytest.raises(TypeError, match="present"):
        observation_content({"screenshot": b"png", "accessibility_tree": "tree"}, 100)


def test_history_keeps_only_the_latest_images():
    policy = CharPolicy()
    shots = [bytes([0x89]) + f"PNG{i}".encode() for i in range(5)]
    turns = [Turn("act", Observation(f"obs {i}", [shots[i]])) for i in range(1, 5)]
    messages = build_messages("sys", Observation("task", [shots[0]]), turns, policy=policy, tools=None,
                              config=ChatConfig(max_images=2))
    urls = [p["image_url"]["url"] for m in messages if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image_url"]
    assert urls == ["data:image/png;base64," + base64.b64encode(s).decode() for s in shots[3:]]
    assert "[1 image omitted]" in messages[1]["content"]  # the task's screenshot is the oldest


def test_clip_keeps_head_and_tail():
    text = "A" * 500 + "B" * 500
    out = clip(text, 100)
    assert out.startswith("A" * 66) and out.endswith("B" * 34) and "omitted" in out
    assert clip("short", 100) == "short"


def turns(n: int, size: int = 400) -> list[Turn]:
    return [Turn(f"action {i} " + "x" * size, f"output {i} " + "y" * size, valid=i % 3 != 2)
            for i in range(n)]


def test_no_truncation_when_it_fits():
    msgs = build_messages("SYS", "TASK", turns(3), policy=CharPolicy(), tools=TOOLS,
                          config=ChatConfig(context_tokens=100_000))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant",
                                         "tool", "assistant", "user"]
    assert msgs[3]["tool_call_id"] == "call_0"
    assert msgs[1]["content"] == "TASK"


def test_truncation_keeps_system_task_and_latest_turns():
    policy, config = CharPolicy(), ChatConfig(context_tokens=1200, max_response_tokens=200)
    msgs = build_messages("SYS", "TASK", turns(30), policy=policy, tools=None, config=config)
    assert policy.count_tokens(msgs) <= 1000
    assert msgs[0]["content"] == "SYS"
    assert msgs[1]["content"].startswith("TASK") and "earlier steps omitted" in msgs[1]["content"]
    assert msgs[-2]["content"].startswith("action 29") and msgs[-1]["content"].startswith("output 29")
    kept = [m["content"].split()[1] for m in msgs[2::2]]
    assert kept == [str(i) for i in range(30 - len(kept), 30)]  # a contiguous recent tail
    assert len(kept) >= 2


def test_truncation_drops_as_few_turns_as_possible():
    policy = CharPolicy()
    full = policy.count_tokens(build_messages("SYS", "TASK", turns(10), policy=policy, tools=None,
                                              config=ChatConfig(context_tokens=10**6)))
    config = ChatConfig(context_tokens=full - 150 + 100, max_response_tokens=100)
    msgs = build_messages("SYS", "TASK", turns(10), policy=policy, tools=None, config=config)
    assert "1 earlier step omitted" in msgs[1]["content"]
    assert len(msgs) == 2 + 2 * 9


def test_huge_last_observation_is_clipped_to_fit():
    policy = CharPolicy()
    big = [Turn("act", "z" * 200_000)]
    msgs = build_messages("SYS", "TASK", big, policy=policy, tools=None,
                          config=ChatConfig(context_tokens=3000, max_response_tokens=500))
    assert policy.count_tokens(msgs) <= 2500
    assert "characters omitted" in msgs[-1]["content"]


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return HFPolicy("tiny")


@pytest.mark.parametrize("n_turns", [0, 1, 12])
def test_truncation_with_a_real_tokenizer(tiny, n_turns):
    policy = tiny
    config = ChatConfig(context_tokens=2500, max_response_tokens=500)
    msgs = build_messages("SYS", "TASK " * 50, turns(n_turns, 300), policy=policy, tools=TOOLS,
                          config=config)
    assert policy.count_tokens(msgs, TOOLS) <= 2000
