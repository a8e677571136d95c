"""A procedurally generated terminal task family, sized for small models.

Each instance comes from an integer seed: a file with a random short name
under ``/app`` holds a random number, and the task is to copy that number
into ``/app/answer``. The number appears nowhere but in the file, so the
agent has to read it first (step 1) and act on what it read (step 2): the
next state of step 1 is what step 2 needs. The final state is graded in the
sandbox by the task's own ``run-tests.sh`` (the file's content is compared
with the number), like any terminal-bench task, through
:func:`envs.terminal.grade_terminal_task`.

Instances are plain :class:`~envs.base.Task` rows that :class:`~envs.terminal.TerminalEnv`
runs: ``TerminalEnv(tasks="procedural:0:512")`` makes seeds 0..511. Named
ranges: ``procedural:train`` (seeds 0..1023) and ``procedural:heldout``
(seeds 1000000..1000063, never trained on).
"""

from __future__ import annotations

import random
import shlex

from envs.base import Task

PREFIX = "procedural:"
NAMED = {"train": (0, 1024), "heldout": (1_000_000, 64)}
RUN_TESTS = """#!/bin/bash
# Passes when /app/answer holds the number (surrounding whitespace ignored).
got=$(tr -d '[:space:]' < /app/answer 2>/dev/null)
echo "=========================== short test summary info ============================"
if [ "$got" = "{value}" ]; then echo "PASSED test_answer"; else echo "FAILED test_answer - got '$got'"; fi
"""


def instance(seed: int) -> Task:
    """The task of ``seed``: the same on every machine."""
    rng = random.Random(f"nextstate-procedural-{seed}")
    name = rng.choice("abcdefghijkmnpqrstuvwxyz") + str(rng.randrange(10))
    value = str(rng.randrange(100, 1000))
    path = f"/app/{name}"
    return Task(f"proc-{seed}", f"Write the number in {path} to /app/answer.", {
        "dir": None, "dockerfile": False, "tests": {}, "seed": seed, "path": path, "value": value,
        "setup": f"printf '%s\\n' {shlex.quote(value)} > {path}",
        "run_tests": RUN_TESTS.replace("{value}", value),
        "oracle": [{"name": "bash", "arguments": {"command": f"cat {path}"}},
                   {"name": "bash", "arguments": {"command": f"echo {value} > /app/answer"}},
                   {"name": "finish", "arguments": {}}],
        "max_test_timeout_sec": 10}, category="procedural")


def is_procedural(source: object) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def load(source: str) -> list[Task]:
    """Tasks of ``procedural:START:COUNT`` or ``procedural:NAME`` (``train``, ``heldout``)."""
    spec = source[len(PREFIX):]
    if spec in NAMED:
        start, count = NAMED[spec]
    else:
        try:
            start, count = (int(x) for x in spec.split(":"))
        except ValueError:
            raise ValueError(f"bad task source {source!r}: use procedural:START:COUNT or "
                             f"procedural:{{{','.join(NAMED)}}}") from None
    if count < 1 or start < 0:
        raise ValueError(f"bad task source {source!r}: START must be >= 0 and COUNT >= 1")
    return [instance(seed) for seed in range(start, start + count)]
