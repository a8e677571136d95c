"""The personal track's two simulated users, each with the rule scorer of its stated style.

Both are **rule-written**: no LLM writes their replies or scores their answers. A user asks
(:meth:`User.ask`), its scorer scores the agent's first answer from 0 to 1 in steps of 0.25 (one
quarter per criterion met, :meth:`User.score`), and it replies in words (:meth:`User.reply`):

* **approval** when every criterion is met;
* a **re-ask** when the answer does not answer at all (the student gets no number; the teacher's
  comment says neither right nor wrong);
* else a **correction** that says what to change, one sentence per unmet criterion, in the words
  that user would use (the proxy's next request carries it: the OPD hint's source);
* with probability ``1 - comment_rate`` (the bench's ``--comment-rate``) the user says nothing
  about the answer and moves on (``Okay.``): users do not comment on every answer, and an evolving judge can then still
  judge by what they said before.

Users are a registry (:func:`register_user`, which refuses a name twice):

* ``student`` -- homework help that must not look AI-written: the right answer, no bold, no
  numbered step list, plain paragraphs (no headings or bullets);
* ``teacher`` -- a grading comment on a student's generated (possibly wrong) solution that is
  specific and friendly: the right verdict, a number from the solution named, a friendly word,
  and what to do next.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Callable

from nextstate.train.proxy.registry import make, registrar

from bench.personal.problems import Problem, Solution, problem, solution

USERS: dict[str, Callable[..., Any]] = {}
register_user = registrar(USERS, "simulated user")
register_user.__doc__ = "Add a simulated user under ``name`` (``--users name``); a name already taken is an error."

_BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")
_NUMBERED = re.compile(r"^\s*(?:\d+[.)]|step\s+\d+\s*[:.)-])", re.I | re.M)
_MARKUP = re.compile(r"^\s*(?:#{1,6}\s|[-*•+]\s)", re.M)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WRONG = re.compile(r"\b(?:mistake|error|incorrect|not (?:quite )?(?:right|correct)|wrong|slip|off by)\b", re.I)
_RIGHT = re.compile(r"\b(?:correct|right|well done|perfect|spot on)\b", re.I)
_FRIENDLY = re.compile(r"\b(?:great|good|nice|well done|thank|lovely|keep it up|you're close|almost|proud|"
                       r"excellent|awesome)\b", re.I)
_NEXT = re.compile(r"\b(?:try|check|recheck|double-check|next time|remember|look again|redo)\b", re.I)
APPROVALS = {"student": ["Thanks, that reads like my own writing.", "Perfect, thank you.", "Great, that works for me."],
             "teacher": ["Thanks, that comment is just what I wanted.", "Perfect, I will use that one.",
                         "Great comment, thank you."]}
SILENT = "Okay."


def numbers(text: str) -> list[float]:
    """The numbers written in ``text``, in order."""
    return [float(x) for x in _NUMBER.findall(text)]


def has_bold(text: str) -> bool:
    """Whether ``text`` uses Markdown bold (``**x**`` or ``__x__``)."""
    return bool(_BOLD.search(text))


def has_numbered_steps(text: str) -> bool:
    """Whether ``text`` has a numbered list line (``1.``, ``2)``, ``Step 3:``)."""
    return bool(_NUMBERED.search(text))


def has_markup(text: str) -> bool:
    """Whether ``text`` has a heading or bullet line (not plain paragraphs)."""
    return bool(_MARKUP.search(text))


def is_friendly(text: str) -> bool:
    """Whether ``text`` has a friendly word (great, good, nice, well done, ...)."""
    return bool(_FRIENDLY.search(text))


def says_next_step(text: str) -> bool:
    """Whether ``text`` says what to do next (try, check, next time, ...)."""
    return bool(_NEXT.search(text))


def verdict(text: str) -> bool | None:
    """What a grading comment says of the solution: False (a mistake named), True (right), None (neither)."""
    if _WRONG.search(text):
        return False
    return True if _RIGHT.search(text) else None


@dataclass
class Criterion:
    """One quarter of a user's score: its name, whether an answer meets it, and the sentence the
    user says when it does not (what to change)."""

    name: str
    met: Callable[[str, Any], bool]
    correction: str


class User:
    """A simulated user: asks about a generated case, scores a first answer by its
    :attr:`criteria` (a rule scorer), replies in words."""

    name = ""
    criteria: list[Criterion] = []

    def __init__(self, comment_rate: float = 1.0):
        self.comment_rate = comment_rate

    def case(self, rng: random.Random) -> Any:
        raise NotImplementedError

    def ask(self, case: Any) -> str:
        raise NotImplementedError

    def answers(self, text: str, case: Any) -> bool:
        """Whether ``text`` answers at all (else the user asks again)."""
        raise NotImplementedError

    def reask(self, case: Any) -> str:
        raise NotImplementedError

    def unmet(self, text: str, case: Any) -> list[Criterion]:
        """The criteria ``text`` does not meet."""
        return [c for c in self.criteria if not c.met(text, case)]

    def score(self, text: str, case: Any) -> float:
        """The rule scorer: the share of the criteria met, 0 to 1 in steps of 1 / len(criteria)
        (0.25 here); an answer that does not answer at all scores 0."""
        if not self.answers(text, case):
            return 0.0
        return (len(self.criteria) - len(self.unmet(text, case))) / len(self.criteria)

    def reply(self, text: str, case: Any, rng: random.Random) -> tuple[str, str]:
        """``(kind, words)``: what the user says to ``text`` (kind: ``approval``, ``reask``,
        ``correction`` or ``silent``)."""
        if rng.random() >= self.comment_rate:
            return "silent", SILENT
        if not self.answers(text, case):
            return "reask", self.reask(case)
        unmet = self.unmet(text, case)
        if not unmet:
            return "approval", rng.choice(APPROVALS[self.name])
        return "correction", " ".join(c.correction for c in unmet)


@register_user("student")
class Student(User):
    """Wants homework help that does not look AI-written: plain paragraphs, no bold, no numbered steps."""

    name = "student"
    criteria = [
        Criterion("answer", lambda t, p: p.answer in numbers(t),
                  "I think the final number is wrong, can you check the arithmetic again?"),
        Criterion("no_bold", lambda t, p: not has_bold(t),
                  "I'd like it without any bold text, my teacher will know it is AI."),
        Criterion("no_numbered_steps", lambda t, p: not has_numbered_steps(t),
                  "I'd like it without numbered steps, just say it like a person would."),
        Criterion("plain_paragraphs", lambda t, p: not has_markup(t),
                  "I prefer plain paragraphs, no headings or bullet points."),
    ]

    def case(self, rng: random.Random) -> Problem:
        return problem(rng)

    def ask(self, case: Problem) -> str:
        return f"Can you help me with my maths homework? {case.text}"

    def answers(self, text: str, case: Problem) -> bool:
        return bool(numbers(text))

    def reask(self, case: Problem) -> str:
        return "You didn't give me an answer. How many is it?"


@dataclass
class Graded:
    """The teacher's case: a problem and a student's solution of it."""

    problem: Problem
    solution: Solution


@register_user("teacher")
class Teacher(User):
    """Wants grading comments that are specific and friendly."""

    name = "teacher"
    criteria = [
        Criterion("verdict", lambda t, g: verdict(t) is (g.solution.slip is None),
                  "That verdict is not right: look at the student's arithmetic again."),
        Criterion("specific", lambda t, g: bool(set(numbers(t)) & set(numbers(g.solution.text))),
                  "I prefer comments that are specific: name the step and the number you mean."),
        Criterion("friendly", lambda t, g: is_friendly(t),
                  "Please make it more friendly, they are twelve."),
        Criterion("next_step", lambda t, g: says_next_step(t),
                  "I'd like it to tell them what to try next time."),
    ]

    def __init__(self, comment_rate: float = 1.0, slip_rate: float = 0.5):
        super().__init__(comment_rate)
        self.slip_rate = slip_rate

    def case(self, rng: random.Random) -> Graded:
        p = problem(rng)
        return Graded(p, solution(p, rng, self.slip_rate))

    def ask(self, case: Graded) -> str:
        return (f"Please write a short grading comment for my student's solution.\nProblem: {case.problem.text}\n"
                f"Student's solution: {case.solution.text}")

    def answers(self, text: str, case: Graded) -> bool:
        return verdict(text) is not None

    def reask(self, case: Graded) -> str:
        return "You didn't say whether the student's answer is right. Is it?"


def make_user(name: str, **kw: Any) -> User:
    """The registered simulated user ``name``."""
    return make(USERS, "simulated user", name, **kw)
