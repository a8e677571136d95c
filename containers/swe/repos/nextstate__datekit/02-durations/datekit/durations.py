"""Durations written for people, such as ``"1w 2d"`` or ``"3h 15m"``, to and from ``timedelta``."""

from __future__ import annotations

import re
from datetime import timedelta

UNIT_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)([wdhms])")


def parse_duration(text: str) -> timedelta:
    """The ``timedelta`` that ``text`` spells, e.g. ``"1w 2d 3h"``; raises ``ValueError``.

    Units: ``w`` weeks, ``d`` days, ``h`` hours, ``m`` minutes, ``s`` seconds.
    """
    parts = text.split()
    if not parts:
        raise ValueError("empty duration")
    seconds = 0
    for part in parts:
        match = _PART.fullmatch(part)
        if match is None:
            raise ValueError(f"bad duration part {part!r} in {text!r}")
        seconds += int(match.group(1)) * UNIT_SECONDS[match.group(2)]
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta) -> str:
    """The spelling of ``delta`` in whole seconds, largest unit first: ``"1d 2h"``, or ``"0s"``."""
    if delta < timedelta(0):
        raise ValueError(f"negative duration: {delta}")
    seconds = int(delta.total_seconds())
    parts = []
    for unit, size in UNIT_SECONDS.items():
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts) or "0s"
