"""The personal track's step judge and hint source through the proxy: **rules**, no LLM (the
project's LLM judge is a model that runs here only as ``tiny`` or SmolLM2-135M, and neither
reads a user's reply reliably).

Both read a turn's next state, the user's reply, in words, through the proxy's judge interface
(``await judge(JudgeRequest) -> JudgeResult``), and the evolving rubric where the proxy puts it
(after the task text, :func:`train.proxy.rubric.with_rubric`):

* :class:`ReplyJudge`: a reply that asks for a change or asks again votes -1, one that only
  thanks votes +1; a reply that says nothing of the answer (``Okay.``) votes 0, unless the rubric
  holds stated preferences: then the answer itself is checked against those the rubric names
  (bold, numbered steps, plain paragraphs, specific: any number, friendly, what to try next), +1
  if it meets them all, else -1. Without a rubric (``--rubric off``) such turns carry no vote.
* :class:`ReplyHints`: the hint is the user's correction itself; for a silent reply, the
  rubric's lines the answer does not meet.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from nextstate.judges.hints import hint_result
from nextstate.judges.prm import JudgeRequest, JudgeResult, tally

from bench.personal.users import has_bold, has_markup, has_numbered_steps, is_friendly, numbers, says_next_step

_ASKS_CHANGE = re.compile(r"\?|\bi'd like\b|\bi prefer\b|\bplease\b|\bwrong\b|\bnot right\b|\bdidn't\b", re.I)
_THANKS = re.compile(r"\b(?:thanks|thank you|perfect|great)\b", re.I)
_RUBRIC = re.compile(r"## The user's stated preferences \(rubric v\d+\)[^\n]*\n(.*)", re.S)
# what a rubric line names -> the check an answer must pass
RUBRIC_CHECKS: list[tuple[re.Pattern, Callable[[str], bool]]] = [
    (re.compile(r"\bbold\b", re.I), lambda t: not has_bold(t)),
    (re.compile(r"\bnumbered\b", re.I), lambda t: not has_numbered_steps(t)),
    (re.compile(r"\bparagraphs?\b|\bheadings?\b|\bbullet", re.I), lambda t: not has_markup(t)),
    (re.compile(r"\bspecific\b", re.I), lambda t: bool(numbers(t))),
    (re.compile(r"\bfriendly\b", re.I), is_friendly),
    (re.compile(r"\btry\b|\bnext time\b", re.I), says_next_step),
]


def reply_vote(reply: str) -> tuple[int, str]:
    """The vote a user's reply gives the answer before it, and why."""
    if _ASKS_CHANGE.search(reply):
        return -1, "the user asks for a change or asks again"
    if _THANKS.search(reply):
        return 1, "the user approves"
    return 0, "the user says nothing of the answer"


def rubric_lines(instruction: str) -> list[str]:
    """The stated preferences the judge's task text holds (none without a rubric)."""
    found = _RUBRIC.search(instruction or "")
    return [line.strip("- ").strip() for line in found.group(1).splitlines() if line.strip()] if found else []


def unmet_lines(answer: str, lines: list[str]) -> tuple[list[str], int]:
    """The rubric ``lines`` that name a check ``answer`` fails, and how many lines name one."""
    named = [(line, check) for line in lines for pattern, check in RUBRIC_CHECKS if pattern.search(line)]
    return list(dict.fromkeys(line for line, check in named if not check(answer))), len(named)


def _answer(req: JudgeRequest) -> str:
    return req.action if isinstance(req.action, str) else str(req.action or "")


class ReplyJudge:
    """A rule judge of a user's reply, and of the answer against the evolving rubric when the
    reply says nothing of it (see the module's text)."""

    def template(self, family: str) -> dict[str, Any]:
        """No prompt template is needed; any family is accepted."""
        return {}

    async def judge(self, req: JudgeRequest) -> JudgeResult:
        reply = str(req.next_state.get("output") or "")
        vote, why = reply_vote(reply)
        if vote == 0:
            unmet, named = unmet_lines(_answer(req), rubric_lines(req.instruction))
            if named:
                vote, why = (-1, f"the answer fails the rubric: {'; '.join(unmet)}") if unmet else \
                    (1, "the answer meets the rubric's stated preferences")
        return tally([f"{why}: \\boxed{{{vote}}}"], f"reply: {reply}\nrubric: {rubric_lines(req.instruction)}")


class ReplyHints:
    """A rule hint source: the user's correction is the hint; for a silent reply, the rubric's
    lines the answer does not meet."""

    def template(self, family: str) -> dict[str, Any]:
        """No prompt template is needed; any family is accepted."""
        return {}

    async def judge(self, req: JudgeRequest) -> JudgeResult:
        reply = str(req.next_state.get("output") or "")
        hint = None
        if reply_vote(reply)[0] < 0:
            hint = reply
        elif reply_vote(reply)[0] == 0:
            unmet, _ = unmet_lines(_answer(req), rubric_lines(req.instruction))
            hint = " ".join(unmet) or None
        answer = f"[HINT_START]{hint}[HINT_END] \\boxed{{1}}" if hint else "nothing to change: \\boxed{-1}"
        return hint_result([answer], f"reply: {reply}")
