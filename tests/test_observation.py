"""The observation contract through the agent loop, for every env family.

Each family's real env runs one short episode through ``run_episode`` with a
recording policy and a recording judge (stand-ins for models: they replay a
script and keep every prompt they get). The test asserts what reached them:
the instruction, each step's output, and -- for the GUI -- the screenshot as an
image for the policy and the screens before and after each step for the judge.
The GUI env was once blind this way: its dict observation became ``''``.
"""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest
from PIL import Image

from nextstate.agents.chat import ChatConfig
from nextstate.train.rollout import run_episode
from nextstate.agents.policy import Policy
from nextstate.agents.recorder import Recorder
from nextstate.agents.testing import ScriptedPolicy
from nextstate.envs.base import Observation, Task
from nextstate.envs.pool import SandboxPool
from nextstate.judges.prm import StepJudge


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class RecordingPolicy(ScriptedPolicy):
    """A scripted policy that keeps every prompt it was given."""

    def __init__(self, script: list[str] | Callable[[list[dict]], str]):
        super().__init__(script)
        self.prompts: list[list[dict]] = []

    async def generate(self, messages, tools=None, **sampling):
        self.prompts.append(json.loads(json.dumps(messages)))
        return await super().generate(messages, tools, **sampling)


class RecordingJudge(Policy):
    """A judge backend that keeps every prompt and votes +1."""

    def __init__(self):
        self.prompts: list[list[dict]] = []

    async def generate(self, messages, tools=None, **sampling):
        raise NotImplementedError

    async def complete(self, messages, n=1, temperature=1.0, max_tokens=1024):
        self.prompts.append(messages)
        return ["looks right \\boxed{1}"] * n


def texts(content: str | list[dict]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p["type"] == "text")


def pngs(content: str | list[dict]) -> list[Image.Image]:
    if isinstance(content, str):
        return []
    urls = [p["image_url"]["url"] for p in content if p["type"] == "image_url"]
    assert all(u.startswith("data:image/png;base64,") for u in urls)
    return [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))) for u in urls]


async def play(env, task: Task, script: list[str], tmp_path, chat: ChatConfig | None = None):
    policy, judge_backend = RecordingPolicy(script), RecordingJudge()
    recorder = Recorder(tmp_path / "rollouts.jsonl")
    with ThreadPoolExecutor(2) as ex:
        traj = await run_episode(env, policy, task=task, group_id="g", sample=0,
                                 judge=StepJudge(judge_backend), recorder=recorder, executor=ex,
                                 chat=chat)
    recorder.close()
    return traj, policy.prompts, judge_backend.prompts


def test_present_refuses_what_it_cannot_show():
    assert Observation.of("text").text == "text" and Observation.of(None).text == ""
    with pytest.raises(TypeError, match="present"):
        Observation.of({"screenshot": object()})
    with pytest.raises(TypeError):
        Observation("x", ["not png bytes"])


# ---- text families: the instruction, then each step's output ------------------------------------


def _terminal(image: str) -> tuple[Any, Task, list[str], str]:
    from nextstate.envs.terminal import TerminalEnv
    env = TerminalEnv(pool=SandboxPool(image, size=1, backend="docker"))
    return env, env.tasks[0], [call("bash", command="echo step-output-$((6*7))"), call("finish")], "step-output-42"


def _toolcall(image: str) -> tuple[Any, Task, list[str], str]:
    from nextstate.envs.toolcall import ToolCallEnv
    task = Task("half", "What is 1/2 as a decimal?", {"answer": "0.5"})
    env = ToolCallEnv([task], pool=SandboxPool(image, size=1, backend="docker"))
    return env, task, [call("python", code="print(1/2 + 41.5)"), call("answer", answer="0.5")], "42.0"


def _swe(image: str) -> tuple[Any, Task, list[str], str]:
    from nextstate import containers
    from nextstate.envs.swe import SWEEnv
    from nextstate.envs.swe.instances import OFFLINE_IMAGE
    containers.ensure_image("swe")
    env = SWEEnv(pool=SandboxPool(OFFLINE_IMAGE, size=1), grade_timeout=120)
    return env, env.tasks[0], [call("bash", command="echo step-output-$((6*7))"), call("submit")], "step-output-42"


@pytest.mark.docker
@pytest.mark.parametrize("family", ["terminal", "toolcall", "swe"])
async def test_text_family_observation_reaches_policy_and_judge(family: str, terminal_image: str,
                                                                 tmp_path) -> None:
    make: Callable = {"terminal": _terminal, "toolcall": _toolcall, "swe": _swe}[family]
    env, task, script, expected = make(terminal_image)
    try:
        traj, prompts, judged = await play(env, task, script, tmp_path)
    finally:
        env.close()
        env.pool.close()
    assert traj.status == "finished" and len(traj.steps) == 2, (traj.status, traj.error)
    first_user = prompts[0][1]
    assert first_user["role"] == "user" and task.instruction[:60] in texts(first_user["content"])
    tool_reply = prompts[1][-1]
    assert tool_reply["role"] == "tool" and expected in tool_reply["content"]
    assert isinstance(traj.steps[0].observation, Observation) and not traj.steps[0].observation.images
    assert expected in texts(judged[0][1]["content"]) and not pngs(judged[0][1]["content"])


# ---- the GUI: text, the screenshot for the policy, before/after screens for the judge -----------


@pytest.fixture(scope="module")
def desktop_pool(docker_client):
    from nextstate import containers
    containers.ensure_image("desktop", client=docker_client)
    with SandboxPool("nextstate/desktop:latest", size=1, reset="reuse", memory="2g", pids_limit=1024) as p:
        yield p


@pytest.mark.docker
@pytest.mark.browser
async def test_gui_policy_sees_the_screen_and_judge_sees_before_and_after(desktop_pool, tmp_path):
    from nextstate.envs.gui import GUIEnv
    env = GUIEnv(pool=desktop_pool, settle=0.3, a11y_tree_max_chars=300)
    task = env._by_id["signup-form"]

    def script(messages: list[dict]) -> str:
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn == 0:  # click into the name field, wherever the page put it
            box = env.desktop.client.locate("#name")
            return call("computer", action="CLICK", x=box["cx"], y=box["cy"])
        if turn == 1:
            return call("computer", action="TYPING", text="Ada Lovelace")
        return call("computer", action="DONE")

    try:
        traj, prompts, judged = await play(env, task, script, tmp_path, ChatConfig(max_images=2))
    finally:
        env.close()
    assert traj.status == "finished" and len(traj.steps) == 3, (traj.status, traj.error)

    # The policy: instruction, tree (cut to its budget) and the screenshot at step 0 ...
    first = prompts[0][1]["content"]
    assert "Ada Lovelace" in texts(first) and "Accessibility tree" in texts(first)
    assert "more lines cut to fit the budget" in texts(first)
    [shot] = pngs(first)
    assert shot.size == (1280, 720)
    # ... then each step's output with the new screenshot; only the last 2 images are kept.
    last = prompts[2]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert "Result of the action: ok" in texts(last[3]["content"])
    assert "[1 image omitted]" in texts(last[1]["content"])
    assert sum(len(pngs(m["content"])) for m in last) == 2

    # The judge: the screen before and after each step, labelled; typing changed the screen.
    assert len(judged) == 3
    content = judged[1][1]["content"]
    labels = [p["text"] for p in content if p["type"] == "text"][1:]
    assert labels == ["Screen before the action:", "Screen after the action:"]
    before, after = pngs(content)
    assert before.size == after.size == (1280, 720) and before.tobytes() != after.tobytes()

    # The log: screenshots as PNG files beside rollouts.jsonl, referenced, never inlined.
    log = (tmp_path / "rollouts.jsonl").read_text()
    assert "base64" not in log
    rows = [json.loads(line) for line in log.splitlines()]
    step = next(r for r in rows if r["kind"] == "step" and r["step"] == 1)
    for ref in (step["next_state"]["screenshot_before"], step["next_state"]["screenshot_after"],
                step["observation"]["images"][0]):
        assert ref.startswith("images/") and Image.open(tmp_path / ref).size == (1280, 720)
