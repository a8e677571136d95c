"""A procedural terminal family whose next states say what the instruction does not.

Each instance comes from an integer seed: ``/app/note`` holds one of the 4-word
family's words (:data:`envs.terminal.procedural.WORDS`, the seed's turn in them), and the task is
"Read /app/note, then write the word it holds to /app/out/answer." -- but
``/app/out`` does not exist. A write before ``mkdir`` fails visibly (bash's
``No such file or directory`` and exit code 1); only that next state tells the agent
what to do instead. The reference run takes 4 steps (read, ``mkdir -p /app/out``,
write, finish) and the step limit is :data:`MAX_STEPS` (4), so a failed write leaves
exactly enough steps to recover (``mkdir``, write again; the final state is graded at
the step limit) only when the word was read first. The outcome is sparse: the task's
``run-tests.sh`` checks ``/app/out/answer`` once, at the end.

Two decisions make an episode succeed: read before writing (silent: a guessed word
exits 0 like a right one), and create the directory before writing (visible: the write
fails). Outcome-only RL can learn both; a step judge that reads next states (the rule
judge votes -1 on a non-zero exit) and a hint made from the error's last line point at
the second one on the very step that made it.

:func:`hasty_actions` is the warm-start behaviour (``python -m train.sft --source
hasty``): it reads half of the time (else it guesses a word), creates the directory
before writing half of the time, and after a failed write recovers (``mkdir``, write
again) half of the time, else finishes. Success of the behaviour itself is
0.625 x 0.75, about 0.47.

``TerminalEnv(tasks="outdir:0:512")`` makes seeds 0..511; named ranges
``outdir:train`` (seeds 0..1023) and ``outdir:heldout`` (seeds 2000000..2000063,
never trained on).
"""

from __future__ import annotations

import random
import shlex

from nextstate.envs.base import Task
from nextstate.envs.terminal.procedural import NOTE, WORDS, parse_range

PREFIX = "outdir:"
OUT_DIR = "/app/out"
ANSWER = f"{OUT_DIR}/answer"
INSTRUCTION = f"Read {NOTE}, then write the word it holds to {ANSWER}."
MAX_STEPS = 4
NAMED = {"train": (0, 1024), "heldout": (2_000_000, 64)}
RUN_TESTS = f"""#!/bin/bash
# Passes when {ANSWER} holds the word (surrounding whitespace ignored).
got=$(tr -d '[:space:]' < {ANSWER} 2>/dev/null)
echo "=========================== short test summary info ============================"
if [ "$got" = "{{value}}" ]; then echo "PASSED test_answer"; else echo "FAILED test_answer - got '$got'"; fi
"""

READ = {"name": "bash", "arguments": {"command": f"cat {NOTE}"}}
MKDIR = {"name": "bash", "arguments": {"command": f"mkdir -p {OUT_DIR}"}}
FINISH = {"name": "finish", "arguments": {}}


def write(word: str) -> dict:
    return {"name": "bash", "arguments": {"command": f"echo {word} > {ANSWER}"}}


def instance(seed: int) -> Task:
    """The task of ``seed``: the same on every machine."""
    word = WORDS[seed % len(WORDS)]
    return Task(f"outdir-{seed}", INSTRUCTION, {
        "dir": None, "dockerfile": False, "tests": {}, "seed": seed, "path": NOTE, "value": word,
        "choices": list(WORDS), "behaviour": "outdir",
        "setup": f"printf '%s\\n' {shlex.quote(word)} > {NOTE} && rm -rf {OUT_DIR}",
        "run_tests": RUN_TESTS.replace("{value}", word), "oracle": [READ, MKDIR, write(word), FINISH],
        "max_test_timeout_sec": 10}, category="outdir")


def hasty_actions(task: Task, rng: random.Random) -> list[dict]:
    """Read half of the time (else guess a word), ``mkdir`` before writing half of the time;
    after a failed write, recover half of the time (``mkdir``, write again), else finish.
    At most :data:`MAX_STEPS` actions."""
    read = rng.random() < 0.5
    word = task.data["value"] if read else rng.choice(task.data["choices"])
    plan = [READ] if read else []
    if rng.random() < 0.5:
        plan += [MKDIR, write(word)]
    elif rng.random() < 0.5:
        plan += [write(word), MKDIR, write(word)]
    else:
        plan += [write(word)]
    return (plan + [FINISH])[:MAX_STEPS]


def is_outdir(source: object) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def load(source: str) -> list[Task]:
    """Tasks of ``outdir:START:COUNT`` or ``outdir:NAME`` (``train``, ``heldout``)."""
    start, count = parse_range(source, PREFIX, NAMED)
    return [instance(seed) for seed in range(start, start + count)]
