"""Steps and trajectories: what an episode leaves for the trainer (JSONL-friendly)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from nextstate.envs.base import Observation

Status = Literal["finished", "truncated", "aborted"]


@dataclass
class Step:
    """One action: who took it, the exact tokens, what happened, and the judge's verdict.

    ``score`` is the majority of ``votes`` (ties 0), ``vote_mean`` the mean of
    the valid votes (None when the judge gave none).
    """

    role: str
    index: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str
    action: dict | None
    next_state: dict
    observation: Observation | Any  # what env.present() showed after the step
    votes: list[int] = field(default_factory=list)
    score: float = 0.0
    vote_mean: float | None = None
    hint: str | None = None
    teacher_prompt_ids: list[int] | None = None  # the prompt with the hint (OPD's teacher context)
    timing: dict[str, float] = field(default_factory=dict)
    ids_from_server: bool = True
    finish_reason: str = "stop"
    judge_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Step":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        obs = kw.get("observation")
        if isinstance(obs, dict) and set(obs) == {f.name for f in fields(Observation)}:
            kw["observation"] = Observation(**obs)
        return cls(**kw)


@dataclass
class Trajectory:
    """One episode. ``outcome`` is None unless the environment scored it."""

    task_id: str
    group_id: str
    sample: int
    family: str
    steps: list[Step] = field(default_factory=list)
    outcome: float | None = None
    status: Status = "finished"
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        kw["steps"] = [Step.from_dict(s) for s in data.get("steps", [])]
        return cls(**kw)

    def steps_of(self, role: str) -> list[Step]:
        """The steps a given role took (each policy trains only on its own)."""
        return [s for s in self.steps if s.role == role]
