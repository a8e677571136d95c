"""A procedurally generated terminal task family, sized for small models.

Each instance comes from an integer seed: ``/app/note`` holds one of a few
words (:data:`WORDS`, the seed's turn in them), and the task is to write that word
into ``/app/answer``. The instruction is the same for every instance and the
word appears nowhere but in the file, so the agent has to read it first
(step 1) and act on what it read (step 2): the next state of step 1 is what
step 2 needs. It is a small conditional (which of K words to write), not a
copy of an arbitrary string, so that a tiny model can learn it on CPU. The
final state is graded in the sandbox by the task's own ``run-tests.sh`` (the
file's content is compared with the word), like any terminal-bench task,
through :func:`envs.terminal.grade_terminal_task`.

:func:`hasty_actions` is a behaviour policy for warm starts (``python -m
train.sft --source hasty``): half of the time it reads the note and writes what it
read, otherwise it writes a word picked at random without reading. A model
cloned from it knows the format and what to do with the note once it has read
it, but reads only about half of the time (success about 5/8): what RL has to
learn is to look before acting, which only the next state of the reading step
rewards.

Instances are plain :class:`~envs.base.Task` rows that :class:`~envs.terminal.TerminalEnv`
runs: ``TerminalEnv(tasks="procedural:0:512")`` makes seeds 0..511. Named
ranges: ``procedural:train`` (seeds 0..1023) and ``procedural:heldout``
(seeds 1000000..1000063, never trained on).
"""

from __future__ import annotations

import random
import shlex

from nextstate.envs.base import Task

PREFIX = "procedural:"
NOTE = "/app/note"
WORDS = ("red", "green", "blue", "amber")
INSTRUCTION = f"Read {NOTE}, then write the word it holds to /app/answer."
NAMED = {"train": (0, 1024), "heldout": (1_000_000, 64)}
RUN_TESTS = """#!/bin/bash
# Passes when /app/answer holds the word (surrounding whitespace ignored).
got=$(tr -d '[:space:]' < /app/answer 2>/dev/null)
echo "=========================== short test summary info ============================"
if [ "$got" = "{value}" ]; then echo "PASSED test_answer"; else echo "FAILED test_answer - got '$got'"; fi
"""


def actions(word: str) -> list[dict]:
    """Read the note, write ``word`` to /app/answer, finish."""
    return [{"name": "bash", "arguments": {"command": f"cat {NOTE}"}},
            {"name": "bash", "arguments": {"command": f"echo {word} > /app/answer"}},
            {"name": "finish", "arguments": {}}]


def instance(seed: int) -> Task:
    """The task of ``seed``: the same on every machine."""
    word = WORDS[seed % len(WORDS)]   # balanced: always writing one word scores exactly 1/K
    return Task(f"proc-{seed}", INSTRUCTION, {
        "dir": None, "dockerfile": False, "tests": {}, "seed": seed, "path": NOTE, "value": word,
        "choices": list(WORDS), "setup": f"printf '%s\\n' {shlex.quote(word)} > {NOTE}",
        "run_tests": RUN_TESTS.replace("{value}", word), "oracle": actions(word),
        "max_test_timeout_sec": 10}, category="procedural")


def hasty_actions(task: Task, rng: random.Random) -> list[dict]:
    """Half of the time the oracle (read, write what was read, finish); otherwise write a word
    drawn uniformly from the task's choices without reading (right 1 time in K), and finish."""
    if rng.random() < 0.5:
        return task.data["oracle"]
    guess = actions(rng.choice(task.data["choices"]))
    return guess[1:]


def is_procedural(source: object) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def parse_range(source: str, prefix: str, named: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """``(start, count)`` of ``PREFIX:START:COUNT`` or ``PREFIX:NAME`` (a key of ``named``)."""
    spec = source[len(prefix):]
    if spec in named:
        return named[spec]
    try:
        start, count = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ValueError(f"bad task source {source!r}: use {prefix}START:COUNT or "
                         f"{prefix}{{{','.join(named)}}}") from None
    if count < 1 or start < 0:
        raise ValueError(f"bad task source {source!r}: START must be >= 0 and COUNT >= 1")
    return start, count


def load(source: str) -> list[Task]:
    """Tasks of ``procedural:START:COUNT`` or ``procedural:NAME`` (``train``, ``heldout``)."""
    start, count = parse_range(source, PREFIX, NAMED)
    return [instance(seed) for seed in range(start, start + count)]
