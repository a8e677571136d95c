"""Hindsight hints for On-Policy Distillation (OPD), after OpenClaw-RL's ``openclaw-opd``.

A hint source reads a step's next state and may return a short hint telling how the
step should have been different. The step's prompt with the hint appended to its
last user (or tool) turn is the *teacher context*; a teacher model scores the step's
own response tokens there, and the per-token difference with the rollout's
log-probs is the OPD advantage (:func:`train.advantage.token_advantages`).

Two sources, one interface (``await source.judge(request) -> JudgeResult``, the
selected hint in ``result.hint``):

* :class:`HintJudge` -- an LLM (any OpenAI-compatible server, or the policy's own
  model) asked whether the next state reveals hindsight that would have improved the
  step: ``\\boxed{1}`` with a hint between ``[HINT_START]`` and ``[HINT_END]``, or
  ``\\boxed{-1}`` without one; ``m`` answers per step;
* :class:`judges.rules.RuleHints` -- a rule-based baseline on CPU that reads only the
  next state (the last line of an error, a rejected action's reason).

Selection (:func:`select_hint`): keep the answers that voted +1 with a hint longer
than 10 characters, take the longest; none -> the step has no hint.
"""

from __future__ import annotations

import copy

from nextstate.judges.prm import JudgeRequest, JudgeResult, StepJudge, parse_hint, parse_vote, render_prompt, tally

MIN_HINT_CHARS = 10
HINT_HEADER = "[hint from the next state]"
HINT_TEMPLATE = {
    "system": "You review one step of an AI agent, in hindsight. You see the task, the steps so far, "
              "the step under review and the next state it led to (what the environment answered).",
    "user": "## Task\n{instruction}\n\n## Steps so far\n{history}\n\n## Step under review\n{action}\n\n"
            "## Next state\n{next_state}\n\n"
            "## Your job\nDoes the next state reveal how the step under review should have been "
            "different (an error, a failed check, a wrong path)? If it does, write a concrete hint of "
            "1-3 sentences for the agent between [HINT_START] and [HINT_END], then end with \\boxed{1}. "
            "If it reveals nothing of the kind, write no hint and end with \\boxed{-1}.",
}


def select_hint(votes: list[int | None], hints: list[str | None]) -> str | None:
    """The longest hint among the +1 votes whose hint is longer than 10 characters."""
    good = [h.strip() for v, h in zip(votes, hints) if v == 1 and h and len(h.strip()) > MIN_HINT_CHARS]
    return max(good, key=len) if good else None


def teacher_messages(messages: list[dict], hint: str) -> list[dict]:
    """``messages`` with ``hint`` appended to the last user or tool turn (the environment's
    latest turn; a new user turn when there is none)."""
    out = copy.deepcopy(messages)
    suffix = f"\n\n{HINT_HEADER}\n{hint.strip()}"
    for msg in reversed(out):
        if msg.get("role") in ("user", "tool"):
            content = msg.get("content")
            if isinstance(content, list):
                msg["content"] = [*content, {"type": "text", "text": suffix}]
            else:
                msg["content"] = (content or "") + suffix
            return out
    return [*out, {"role": "user", "content": suffix.lstrip()}]


def hint_result(answers: list[str], prompt: str = "") -> JudgeResult:
    """Votes of the hint judge's answers, their hints selected by :func:`select_hint`."""
    result = tally(answers, prompt)
    result.hint = select_hint([parse_vote(a) for a in answers], [parse_hint(a) for a in answers])
    return result


class HintJudge(StepJudge):
    """An LLM hint source: :class:`~judges.prm.StepJudge`'s backend, votes and limits, asked
    the hindsight question of :data:`HINT_TEMPLATE` instead of the family's judge prompt."""

    def messages(self, req: JudgeRequest) -> list[dict]:
        template = {**HINT_TEMPLATE, "limits": self.template(req.family)["limits"]}
        return render_prompt(template, req, hints=False)

    async def judge(self, req: JudgeRequest) -> JudgeResult:
        result = await super().judge(req)
        if result.raw:
            result.hint = hint_result(result.raw).hint
        return result

