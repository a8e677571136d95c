"""Step-level judges (process reward from the next state)."""

from nextstate.judges.prm import JudgeRequest, JudgeResult, StepJudge

__all__ = ["JudgeRequest", "JudgeResult", "StepJudge"]
