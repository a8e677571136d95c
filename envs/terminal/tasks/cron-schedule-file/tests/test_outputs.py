"""Parses /app/crontab.txt and checks each job's schedule by meaning, not spelling."""
import re
from pathlib import Path

import pytest

RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
NAMES = {3: "jan feb mar apr may jun jul aug sep oct nov dec".split(), 4: "sun mon tue wed thu fri sat".split()}


def value(text: str, field: int) -> int:
    low = text.lower()
    if field in NAMES and low in NAMES[field]:
        return NAMES[field].index(low) + (1 if field == 3 else 0)
    return int(text)


def expand(expr: str, field: int) -> set[int]:
    lo, hi = RANGES[field]
    out: set[int] = set()
    for part in expr.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            start, end = lo, hi
        elif "-" in base:
            a, b = base.split("-")
            start, end = value(a, field), value(b, field)
        else:
            start = end = value(base, field)
            if step:
                end = hi
        out.update(range(start, end + 1, int(step) if step else 1))
    if field == 4 and 7 in out:
        out = (out - {7}) | {0}
    return out


def jobs() -> dict[str, tuple[list[set[int]], str]]:
    found = {}
    for line in Path("/app/crontab.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or re.match(r"^[A-Za-z_]\w*\s*=", line):
            continue
        fields = line.split(None, 5)
        assert len(fields) == 6, f"not a 5-field cron line: {line!r}"
        sets = [expand(f, i) for i, f in enumerate(fields[:5])]
        command = fields[5]
        name = command.split()[0].rsplit("/", 1)[-1].removesuffix(".sh")
        found[name] = (sets, command)
    return found


ALL_DAYS = [set(range(1, 32)), set(range(1, 13)), set(range(0, 7))]


def test_exactly_three_jobs():
    assert sorted(jobs()) == ["backup", "cleanup", "report"]


@pytest.mark.parametrize("name,minute,hour,dow", [
    ("backup", {30}, {2}, set(range(0, 7))),
    ("report", {0}, {9}, {1}),
    ("cleanup", {0, 15, 30, 45}, set(range(24)), set(range(0, 7))),
])
def test_schedule(name, minute, hour, dow):
    sets, command = jobs()[name]
    assert sets[0] == minute and sets[1] == hour
    assert sets[2] == ALL_DAYS[0] and sets[3] == ALL_DAYS[1]
    assert sets[4] == dow
    assert command.split()[0] == f"/app/scripts/{name}.sh"


@pytest.mark.parametrize("name", ["backup", "report", "cleanup"])
def test_logging_redirection(name):
    command = jobs()[name][1].replace(">>/", ">> /")
    assert f">> /app/logs/{name}.log" in command
    assert command.rstrip().endswith("2>&1")


def test_directories_exist():
    assert Path("/app/scripts").is_dir() and Path("/app/logs").is_dir()
