"""A rule-based step judge: a cheap, deterministic baseline for the LLM judge.

It reads only the next state of a step, through the same interface as
:class:`judges.prm.StepJudge` (``await judge(request) -> JudgeResult`` with
votes, majority and mean), so the trainer and the agent loop take either:

* the action was rejected (it did not parse, unknown tool, bad arguments) -> -1;
* the command timed out -> -1;
* the command exited non-zero -> -1;
* otherwise (a tool ran and exited 0, or ended the episode) -> +1.

Next states that arrive as text (a tool result or a user's reply in an OpenAI-style chat, as
``train.proxy`` sees them) are read by :func:`text_state`: an exit code written in the text
counts as above; else a message that reports an error votes -1, one that reports success +1,
and anything else 0 (the text alone does not say the action worked).

It cannot tell a right value from a wrong one; it only says whether the
action worked. Pick it with ``--judge rules`` (``judge.mode=rules``).
"""

from __future__ import annotations

import re
from typing import Any

from nextstate.judges.hints import hint_result
from nextstate.judges.prm import JudgeRequest, JudgeResult, format_action, format_next_state, tally


_EXIT = re.compile(r"(?:exit(?:ed)?[ _]?(?:with )?(?:code|status)?|return[ _]?code)\W{0,3}(-?\d+)", re.I)
_ERROR = re.compile(r"traceback \(most recent call last\)|\berror\b|\bfailed\b|\bfailure\b|"
                    r"command not found|no such file or directory|permission denied|\bexception\b", re.I)
_SUCCESS = re.compile(r"\bsuccess(?:ful|fully)?\b|\bsucceeded\b|\bpassed\b", re.I)


def text_state(text: str) -> dict[str, Any]:
    """A next state given as text: its exit code when it states one, the first phrase that
    reports an error, and whether it reports success (``from_text`` marks it for
    :func:`rule_vote`)."""
    code = _EXIT.search(text)
    error = _ERROR.search(text)
    return {"valid": True, "output": text, "from_text": True,
            "exit_code": int(code.group(1)) if code else None,
            "error": error.group(0) if error else None, "success": bool(_SUCCESS.search(text))}


def rule_vote(next_state: dict[str, Any]) -> tuple[int, str]:
    """The vote for one next state and the rule that gave it."""
    if not next_state.get("valid", True):
        return -1, "the action was rejected"
    if next_state.get("timed_out"):
        return -1, "the command timed out"
    code = next_state.get("exit_code")
    if code not in (None, 0):
        return -1, f"the command exited with {code}"
    if not next_state.get("from_text"):
        return 1, "the action ran and succeeded"
    if code is None and next_state.get("error"):
        return -1, f"the next message reports an error ({next_state['error']!r})"
    if code == 0 or next_state.get("success"):
        return 1, "the next message reports success"
    return 0, "the next message says neither success nor failure"


class RuleJudge:
    """Votes by rule on the next state; ``m`` identical votes (for the same shape as StepJudge)."""

    def __init__(self, m: int = 1):
        self.m = m

    def template(self, family: str) -> dict[str, Any]:
        """No prompt template is needed; any family is accepted."""
        return {}

    async def judge(self, req: JudgeRequest) -> JudgeResult:
        vote, why = rule_vote(req.next_state)
        prompt = f"action: {format_action(req.action)}\n{format_next_state(req.next_state, 600)}"
        return tally([f"{why}: \\boxed{{{vote}}}"] * self.m, prompt)


def rule_hint(next_state: dict[str, Any]) -> str | None:
    """A hint read off a failed next state: a rejected action's reason, a timeout, or the last
    non-empty line of a failed command's output (its error or a checker's report; for a text
    next state, one that :func:`rule_vote` calls an error); None when the step worked."""
    if not next_state.get("valid", True):
        return f"The action was rejected: {next_state.get('error') or 'invalid action'}"
    if next_state.get("timed_out"):
        return "The command timed out; run something that finishes."
    code = next_state.get("exit_code")
    if code in (None, 0) and not (code is None and next_state.get("from_text") and next_state.get("error")):
        return None
    lines = [line.strip() for line in str(next_state.get("output") or next_state.get("error") or "").splitlines()]
    last = next((line for line in reversed(lines) if line and not line.startswith("[exit code")), "")
    return last or f"The command exited with {code}."


class RuleHints:
    """A rule-based hint source (a baseline, like :class:`RuleJudge`): +1 with the failure's
    own words as the hint when a step failed visibly (:func:`rule_hint`), else -1 and no hint."""

    def __init__(self, m: int = 1):
        self.m = m

    def template(self, family: str) -> dict[str, Any]:
        """No prompt template is needed; any family is accepted."""
        return {}

    async def judge(self, req: JudgeRequest) -> JudgeResult:
        hint = rule_hint(req.next_state)
        answer = f"[HINT_START]{hint}[HINT_END] \\boxed{{1}}" if hint else "no failure seen: \\boxed{-1}"
        prompt = f"action: {format_action(req.action)}\n{format_next_state(req.next_state, 600)}"
        return hint_result([answer] * self.m, prompt)
