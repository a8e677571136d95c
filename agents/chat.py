"""The one place that turns an episode into chat messages.

System prompt (a family intro, an optional per-role note, and the tool schemas
when the policy cannot take them through ``tools=``), the message list from
the episode so far, truncation of that history to a token budget (keep the
system prompt, the task and the latest turns; drop the middle with a marker),
the images kept in the history (the last ``max_images``, as OSWorld's agents keep
the last few screenshots), and the stop strings and response length for each
generation. Observations arrive as :class:`envs.base.Observation` (what
``env.present`` returns); nothing here looks inside a family's own observation.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from nextstate.agents.policy import Policy
from nextstate.envs import registry
from nextstate.envs.base import Observation

TOOL_FORMAT = ('Call a tool by answering with <tool_call>{"name": <tool name>, "arguments": '
               '<JSON object of arguments>}</tool_call>.')


def action_text(action: Any) -> str:
    """A scripted action as the model would write it (Hermes ``<tool_call>`` JSON)."""
    if isinstance(action, str):
        return action
    if "action_type" in action:   # a GUI oracle's OSWorld computer_13 dict: the computer tool's call
        from nextstate.envs.gui.env import computer_call
        action = {"name": "computer", "arguments": computer_call(action).arguments}
    return "<tool_call>" + json.dumps({"name": action["name"], "arguments": action.get("arguments", {})}) \
        + "</tool_call>"


@dataclass
class ChatConfig:
    """Context budget and generation limits.

    ``context_tokens`` bounds the prompt plus ``max_response_tokens``;
    ``max_observation_chars`` clips each observation (head and tail kept);
    ``max_images`` is how many of the latest images the history keeps (older
    ones become an ``[image omitted]`` note; 0 sends none). ``system_prompt``
    False sends no system turn and no tool list: the task and the history only,
    for a model fine-tuned to a fixed tool format (the CPU demo's tiny model,
    which cannot learn to use what it reads behind a long constant preamble).
    """

    context_tokens: int = 32768
    max_response_tokens: int = 1024
    stop: tuple[str, ...] = ("</tool_call>",)
    max_observation_chars: int = 16000
    max_images: int = 3
    system_prompt: bool = True

    def sampling(self) -> dict[str, Any]:
        """Stop conditions and length for a policy call (EOS always stops too)."""
        return {"max_tokens": self.max_response_tokens, "stop": list(self.stop)}


def system_prompt(family: str, tools: list[dict], role_note: str | None = None, *,
                  tools_in_text: bool = False) -> str:
    """Family intro (from :mod:`envs.registry`), role note, and -- when the template cannot
    render them -- the tools."""
    known = family in registry.names()
    parts = [registry.spec(family).intro if known else registry.DEFAULT_INTRO]
    if role_note:
        parts.append(role_note)
    if tools_in_text:
        parts.append("Tools (JSON schemas):\n" + "\n".join(json.dumps(t) for t in tools))
    parts.append(TOOL_FORMAT)
    return "\n\n".join(parts)


def prompt_head(family: str, tools: list[dict], policy: Policy, config: "ChatConfig",
                role_note: str | None = None) -> tuple[str | None, list[dict] | None]:
    """``(system prompt, tools for the policy call)`` of a step: both ``None`` when
    ``config.system_prompt`` is off; the tools are ``None`` too when the policy's template
    can't render them (they are then in the system prompt's text)."""
    if not config.system_prompt:
        return None, None
    system = system_prompt(family, tools, role_note, tools_in_text=not policy.renders_tools)
    return system, tools if policy.renders_tools else None


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to about ``max_chars``, keeping its head and tail."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters omitted ...]\n{text[-tail:]}"


def _image_url(image: Any) -> str:
    if isinstance(image, bytes):
        return "data:image/png;base64," + base64.b64encode(image).decode()
    return image if str(image).startswith("data:") else "data:image/png;base64," + str(image)


def multimodal(text: str, images: list[Any] | None) -> str | list[dict]:
    """Message content: ``text``, plus OpenAI ``image_url`` parts (data URLs) when there are
    images (PNG bytes, base64 text or data URLs)."""
    if not images:
        return text
    return [{"type": "text", "text": text}] + [
        {"type": "image_url", "image_url": {"url": _image_url(im)}} for im in images]


def observation_content(obs: Observation | str | None, max_chars: int,
                        max_images: int | None = None) -> str | list[dict]:
    """Message content for an observation: its clipped text, then its images as ``image_url``
    parts (the first ``max_images`` of them, the rest noted as omitted)."""
    obs = Observation.of(obs)
    text = clip(obs.text, max_chars)
    keep = len(obs.images) if max_images is None else max(0, min(max_images, len(obs.images)))
    if keep < len(obs.images):
        n = len(obs.images) - keep
        text += f"\n[{n} image{'s' * (n != 1)} omitted]"
    return multimodal(text, obs.images[:keep])


@dataclass
class Turn:
    """One step in the conversation: the assistant's text and what came back."""

    text: str
    observation: Observation | str
    valid: bool = True  # a tool ran (observation is its result), else a format error message


def turn_messages(turn: Turn, index: int, max_chars: int, max_images: int | None = None) -> list[dict]:
    """The assistant's message, then the tool's result (or, for an invalid action, the error
    as a user message: no tool ran)."""
    content = observation_content(turn.observation, max_chars, max_images)
    if turn.valid:
        reply = {"role": "tool", "content": content, "tool_call_id": f"call_{index}"}
    else:
        reply = {"role": "user", "content": content}
    return [{"role": "assistant", "content": turn.text}, reply]


def _with_marker(task: dict, dropped: int) -> dict:
    note = f"\n\n[{dropped} earlier step{'s' * (dropped != 1)} omitted to fit the context window]"
    content = task["content"]
    if isinstance(content, list):
        return {**task, "content": content + [{"type": "text", "text": note}]}
    return {**task, "content": content + note}


def _image_quota(observations: list[Observation | str], max_images: int) -> list[int]:
    """How many images each observation may show so that only the latest ``max_images`` stay."""
    quota, left = [], max_images
    for obs in reversed(observations):
        n = len(Observation.of(obs).images)
        quota.append(min(n, left))
        left -= quota[-1]
    return quota[::-1]


def build_messages(system: str | None, first_observation: Observation | str, turns: list[Turn], *, policy: Policy,
                   tools: list[dict] | None, config: ChatConfig) -> list[dict]:
    """The prompt for the next step, truncated to ``config``'s budget.

    Keeps the system prompt (none when ``system`` is None), the task (first observation) and as many of the
    latest turns as fit; the dropped middle is announced in the task message.
    When even the last turn alone does not fit, observations are clipped harder.
    Only the latest ``config.max_images`` images are sent.
    """
    budget = config.context_tokens - config.max_response_tokens
    max_chars = config.max_observation_chars
    quota = _image_quota([first_observation] + [t.observation for t in turns], config.max_images)

    def render(dropped: int) -> list[dict]:
        task = {"role": "user", "content": observation_content(first_observation, max_chars, quota[0])}
        body = [m for i, t in enumerate(turns) if i >= dropped
                for m in turn_messages(t, i, max_chars, quota[i + 1])]
        head = [{"role": "system", "content": system}] if system is not None else []
        return [*head, _with_marker(task, dropped) if dropped else task, *body]

    def fits(dropped: int) -> bool:
        return policy.count_tokens(render(dropped), tools) <= budget

    if fits(0):
        return render(0)
    lo, hi = 1, max(len(turns) - 1, 1)  # find the fewest dropped turns that fit; keep >= 1 turn
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    dropped = min(lo, len(turns) - 1) if turns else 0
    while not fits(dropped) and max_chars > 200:
        max_chars //= 2
    return render(dropped)
