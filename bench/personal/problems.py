"""GSM8K-style arithmetic word problems from a seeded generator (no data hub), and a student's
worked solution of one, with a seeded arithmetic slip or without.

A :class:`Problem` is a story of three steps (each a result the next one uses) and its answer;
:func:`problem` draws one from a :class:`random.Random`. :func:`solution` writes a student's
solution in words, one sentence a step; with a slip, one step's result is off and the steps after
it carry the wrong value on, as a student's mistake does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

NAMES = ["Maya", "Leo", "Priya", "Sam", "Ana", "Tom", "Zoe", "Omar"]
# every story takes the same three steps: b x c, plus a, minus d (p: the previous result, r: this one)
TEMPLATES: list[tuple[str, list[str]]] = [
    ("{name} has {a} stickers. {name} buys {b} packs with {c} stickers in each pack, then gives {d} stickers "
     "to a friend. How many stickers does {name} have now?",
     ["{b} packs of {c} stickers make {b} x {c} = {r}", "with the {a} from before that is {p} + {a} = {r}",
      "after giving away {d} it is {p} - {d} = {r}"]),
    ("A baker makes {b} trays of {c} muffins and already had {a} muffins. {d} muffins are sold. "
     "How many muffins are left?",
     ["{b} trays of {c} muffins are {b} x {c} = {r}", "adding the {a} already made gives {p} + {a} = {r}",
      "selling {d} leaves {p} - {d} = {r}"]),
    ("{name} earns {c} dollars an hour and works {b} hours. {name} already saved {a} dollars and then "
     "spends {d} dollars on a game. How many dollars does {name} have?",
     ["{b} hours at {c} dollars is {b} x {c} = {r}", "with the {a} saved that makes {p} + {a} = {r}",
      "spending {d} leaves {p} - {d} = {r}"]),
    ("A school orders {b} boxes of {c} pencils and has {a} pencils in the cupboard. Teachers hand out "
     "{d} pencils. How many pencils are left?",
     ["{b} boxes of {c} pencils hold {b} x {c} = {r}", "with the {a} in the cupboard there are {p} + {a} = {r}",
      "handing out {d} leaves {p} - {d} = {r}"]),
]


def step(i: int, prev: int, n: dict[str, int]) -> int:
    """The correct result of step ``i`` from the previous result ``prev`` and the numbers ``n``."""
    return (n["b"] * n["c"], prev + n["a"], prev - n["d"])[i]


@dataclass
class Problem:
    """A word problem: its ``text``, its numbers, the correct value after each step and the answer."""

    text: str
    numbers: dict[str, int]
    template: int
    values: list[int] = field(default_factory=list)

    @property
    def answer(self) -> int:
        return self.values[-1]


def problem(rng: random.Random) -> Problem:
    """One problem drawn from ``rng``: a template and its numbers (the answer is positive)."""
    t = rng.randrange(len(TEMPLATES))
    n = {"a": rng.randint(5, 40), "b": rng.randint(2, 9), "c": rng.randint(3, 12)}
    n["d"] = rng.randint(2, n["a"] + n["b"] * n["c"] - 1)
    values, prev = [], 0
    for i in range(3):
        prev = step(i, prev, n)
        values.append(prev)
    return Problem(TEMPLATES[t][0].format(name=rng.choice(NAMES), **n), n, t, values)


@dataclass
class Solution:
    """A student's worked solution of a problem: its ``text``, the answer it reaches, and the step
    (0-based) where it slipped (None: it is correct)."""

    text: str
    answer: int
    slip: int | None
    values: list[int]


def solution(p: Problem, rng: random.Random, slip_rate: float = 0.5) -> Solution:
    """A student's solution of ``p``: with probability ``slip_rate`` one step's result is off by a
    small amount and the later steps carry it on."""
    sentences_of = TEMPLATES[p.template][1]
    slip = rng.randrange(3) if rng.random() < slip_rate else None
    offset = rng.choice([-10, -2, -1, 1, 2, 10])
    sentences, values, prev = [], [], 0
    for i, sentence in enumerate(sentences_of):
        r = step(i, prev, p.numbers) + (offset if i == slip else 0)
        sentences.append(sentence.format(p=prev, r=r, **p.numbers))
        values.append(r)
        prev = r
    text = f"First, {sentences[0]}. Then {sentences[1]}. Finally {sentences[2]}. The answer is {prev}."
    return Solution(text, prev, slip, values)
