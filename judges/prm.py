"""Step-level process reward: an LLM judges each action by the state it led to.

For every step the judge sees the task, a compressed history, the action and
the next state (the tool's output, an error, screenshots), reasons briefly and
ends with ``\\boxed{1}`` or ``\\boxed{-1}``. ``m`` answers are sampled (one
request with ``n=m`` where the backend batches); the step's score is their
majority (ties 0). With ``hints=True`` the judge may also write a short
hindsight hint between ``[HINT_START]`` and ``[HINT_END]``.

A judge failure (timeout, server error) gives no votes and an ``error``; it is
logged and never raised, so a rollout never waits on or dies with its judge.
Prompts come from the family's ``judge_template`` in :mod:`envs.registry`
(keys ``system``, ``user``, ``hint``, ``limits``; a family registered without
one gets ``judges/templates/default.yaml``); pass
``templates={family: dict_or_path}`` to override any of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from nextstate.agents.chat import clip, multimodal
from nextstate.agents import make_policy
from nextstate.agents.policy import Policy, content_text
from nextstate.envs import registry
from nextstate.envs.base import Observation

log = logging.getLogger(__name__)
TEMPLATES = Path(__file__).resolve().parent / "templates"
DEFAULT_TEMPLATE = "default.yaml"  # what a family registered without judge_template gets
_BOXED = re.compile(r"\\boxed\{\s*([+-]?\d+)\s*\}")
_HINT = re.compile(r"\[HINT_START\](.*?)\[HINT_END\]", re.DOTALL)
DEFAULT_LIMITS = {"keep_first": 1, "keep_last": 6, "step_output_chars": 600,
                  "history_chars": 8000, "next_state_chars": 6000, "instruction_chars": 4000}


@dataclass
class JudgeRequest:
    """One step to judge. ``history``: earlier steps as ``{"action", "next_state"}`` dicts;
    ``action``: the parsed call (``{"name", "arguments"}``) or the raw text when it did not parse;
    ``before``/``after``: the observations before and after the step (what ``env.present``
    returned); their images -- the screen before and after -- are attached, labelled."""

    family: str
    instruction: str
    history: list[dict]
    action: dict | str | None
    next_state: dict
    before: Observation | None = None
    after: Observation | None = None

    def screens(self) -> list[tuple[str, list[bytes]]]:
        """``(label, images)`` for the screens before and after the step, where there are any."""
        out = []
        for label, obs in (("before", self.before), ("after", self.after)):
            if obs is not None and obs.images:
                out.append((f"Screen {label} the action:", obs.images))
        return out


@dataclass
class JudgeResult:
    """Votes in {-1, 0, 1} (an unparseable answer votes 0), their majority, the mean of the
    parseable ones, the longest hint, and what was sent and received."""

    votes: list[int] = field(default_factory=list)
    score: int = 0
    mean: float | None = None
    hint: str | None = None
    error: str | None = None
    prompt: str = ""
    raw: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def parse_vote(answer: str) -> int | None:
    """The last ``\\boxed{1|+1|0|-1}`` in ``answer``; None when there is none."""
    found = _BOXED.findall(answer or "")
    if not found:
        return None
    value = int(found[-1])
    return value if value in (-1, 0, 1) else None


def parse_hint(answer: str) -> str | None:
    found = [h.strip() for h in _HINT.findall(answer or "")]
    return max(found, key=len) if found else None


def majority(votes: list[int]) -> int:
    """The most common vote; 0 when the top is tied or there are no votes."""
    top = Counter(votes).most_common(2)
    if not top or (len(top) > 1 and top[0][1] == top[1][1]):
        return 0
    return top[0][0]


def tally(answers: list[str], prompt: str = "") -> JudgeResult:
    """Votes, score, mean and hint from the judge's answers."""
    parsed = [parse_vote(a) for a in answers]
    valid = [v for v in parsed if v is not None]
    hints = [h for h in map(parse_hint, answers) if h and len(h) > 10]
    votes = [0 if v is None else v for v in parsed]
    return JudgeResult(votes=votes, score=majority(votes),
                       mean=sum(valid) / len(valid) if valid else None,
                       hint=max(hints, key=len) if hints else None, prompt=prompt, raw=list(answers))


def load_template(family: str, override: Mapping[str, Any] | str | os.PathLike | None = None
                  ) -> dict[str, Any]:
    """The family's template (its registration's ``judge_template``, else ``default.yaml``)
    with ``override`` (a dict or a YAML path) laid over it."""
    known = family in registry.names()
    if not known and override is None:
        raise ValueError(f"no judge template for family {family!r}: register it in envs.registry "
                         f"or pass templates={{{family!r}: ...}}")
    source = (registry.spec(family).judge_template or DEFAULT_TEMPLATE) if known else {}
    if isinstance(source, str) and "/" not in source and os.sep not in source:
        source = TEMPLATES / source   # a bare file name: one of the templates shipped here
    base = _read_template(source)
    if override is not None:
        extra = _read_template(override)
        base = {**base, **extra, "limits": {**base.get("limits", {}), **extra.get("limits", {})}}
    if "user" not in base:
        raise ValueError(f"judge template for family {family!r} has no 'user' prompt")
    base["limits"] = {**DEFAULT_LIMITS, **base.get("limits", {})}
    return base


def _read_template(source: Mapping[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """A template given as a dict or a YAML path."""
    if isinstance(source, Mapping):
        return dict(source)
    return yaml.safe_load(Path(source).read_text()) or {}


def format_action(action: dict | str | None) -> str:
    if isinstance(action, dict):
        return "<tool_call>" + json.dumps({"name": action.get("name"),
                                           "arguments": action.get("arguments")},
                                          ensure_ascii=False) + "</tool_call>"
    return "(no action)" if not action else str(action)


def format_next_state(state: dict, max_chars: int) -> str:
    if not state.get("valid", True):
        return f"The action was rejected: {state.get('error') or 'invalid action'}"
    lines = []
    if state.get("exit_code") is not None:
        lines.append(f"exit code: {state['exit_code']}")
    if state.get("timed_out"):
        lines.append("the command timed out")
    if state.get("error"):
        lines.append(f"error: {state['error']}")
    output = str(state.get("output") or "")
    lines.append("output:\n" + clip(output, max_chars) if output.strip() else "output: (empty)")
    return "\n".join(lines)


def compress_history(history: list[dict], limits: Mapping[str, int]) -> str:
    """Earlier steps as text: the first and last few kept, outputs and total capped."""
    if not history:
        return "(this is the first step)"
    first, last = limits["keep_first"], limits["keep_last"]
    indexed = list(enumerate(history, 1))
    if len(indexed) > first + last:
        dropped = len(indexed) - first - last
        indexed = indexed[:first] + [(0, {"omitted": dropped})] + indexed[len(indexed) - last:]
    parts = []
    for i, entry in indexed:
        if "omitted" in entry:
            parts.append(f"[... {entry['omitted']} steps omitted ...]")
            continue
        state = format_next_state(entry.get("next_state") or {}, limits["step_output_chars"])
        parts.append(f"Step {i}: {format_action(entry.get('action'))}\n{state}")
    return clip("\n\n".join(parts), limits["history_chars"])


def render_prompt(template: Mapping[str, Any], req: JudgeRequest, hints: bool) -> list[dict]:
    """Chat messages for one judge request (images attached as data URLs)."""
    limits = template["limits"]
    fields_ = {"instruction": clip(req.instruction, limits["instruction_chars"]),
               "history": compress_history(req.history, limits),
               "action": format_action(req.action),
               "next_state": format_next_state(req.next_state, limits["next_state_chars"])}
    user = template["user"]
    for key, value in fields_.items():  # plain substitution: braces elsewhere stay as they are
        user = user.replace("{" + key + "}", value)
    if hints and template.get("hint"):
        user = user.rstrip() + "\n\n" + template["hint"]
    content: str | list[dict] = user
    screens = req.screens()
    if screens:  # each screen after its label: "Screen before the action:" <image> ...
        content = [{"type": "text", "text": user}] + [part for label, images in screens
                                                      for part in multimodal(label, images)]
    return [{"role": "system", "content": template.get("system", "").strip()},
            {"role": "user", "content": content}]


class StepJudge:
    """Judges steps with ``backend`` (a Policy, or a spec for :func:`make_policy`): an
    OpenAI-compatible server, or a local model -- the acting policy itself to judge with
    the policy's own model.

    ``m`` answers per step at ``temperature``; at most ``max_concurrency``
    requests in flight (its own limit); each backend call bounded by ``timeout``.
    """

    def __init__(self, backend: Policy | str, m: int = 1, temperature: float = 0.6,
                 max_concurrency: int = 16, timeout: float = 60.0, hints: bool = False,
                 templates: Mapping[str, Mapping[str, Any] | str | os.PathLike] | None = None,
                 max_tokens: int = 1024):
        self.backend = make_policy(backend) if isinstance(backend, str) else backend
        self.m, self.temperature, self.timeout = m, temperature, timeout
        self.max_concurrency, self.hints, self.max_tokens = max_concurrency, hints, max_tokens
        self.overrides = dict(templates or {})
        self._templates: dict[str, dict[str, Any]] = {}
        self._limits: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = \
            weakref.WeakKeyDictionary()

    def template(self, family: str) -> dict[str, Any]:
        if family not in self._templates:
            self._templates[family] = load_template(family, self.overrides.get(family))
        return self._templates[family]

    def messages(self, req: JudgeRequest) -> list[dict]:
        return render_prompt(self.template(req.family), req, self.hints)

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._limits:
            self._limits[loop] = asyncio.Semaphore(self.max_concurrency)
        return self._limits[loop]

    async def judge(self, req: JudgeRequest) -> JudgeResult:
        """Votes for one step; never raises for a backend failure (``error`` is set instead)."""
        messages = self.messages(req)
        prompt = "\n\n".join(content_text(m["content"]) for m in messages)
        async with self._semaphore():
            try:
                answers = await asyncio.wait_for(
                    self.backend.complete(messages, n=self.m, temperature=self.temperature,
                                          max_tokens=self.max_tokens), self.timeout)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # timeouts, HTTP errors, a broken backend: no votes
                error = f"{type(e).__name__}: {str(e) or f'no answer within {self.timeout:g}s'}"
                log.warning("step judge failed (%s): %s", req.family, error)
                return JudgeResult(error=error, prompt=prompt)
        return tally(answers, prompt)

