"""Closed date intervals: ``Interval(start, end)`` covers both of its ends."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Iterable

ONE_DAY = timedelta(days=1)


@dataclass(frozen=True, order=True)
class Interval:
    """The days from ``start`` to ``end``, both included."""

    start: date
    end: date

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval ends before it starts: {self.start} > {self.end}")

    @property
    def days(self) -> int:
        """How many days the interval covers."""
        return (self.end - self.start).days + 1

    def __contains__(self, day: date) -> bool:
        return self.start <= day <= self.end

    def overlaps(self, other: Interval) -> bool:
        """Whether the two intervals share at least one day."""
        return self.start <= other.end and other.start <= self.end

    def touches(self, other: Interval) -> bool:
        """Whether the intervals overlap or one starts the day after the other ends."""
        return self.start <= other.end + ONE_DAY and other.start <= self.end + ONE_DAY


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same days; touching intervals are joined."""
    merged: list[Interval] = []
    for current in sorted(intervals):
        if merged and merged[-1].touches(current):
            merged[-1] = Interval(merged[-1].start, current.end)
        else:
            merged.append(current)
    return merged


def total_days(intervals: Iterable[Interval]) -> int:
    """How many distinct days the intervals cover together."""
    return sum(interval.days for interval in merge_intervals(intervals))
