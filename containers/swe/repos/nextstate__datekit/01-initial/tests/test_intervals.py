from datetime import date

import pytest

from datekit.intervals import Interval, merge_intervals, total_days


def d(day: int, month: int = 1) -> date:
    return date(2024, month, day)


def test_interval_days_include_both_ends():
    assert Interval(d(1), d(1)).days == 1
    assert Interval(d(1), d(10)).days == 10


def test_interval_rejects_reversed_ends():
    with pytest.raises(ValueError):
        Interval(d(5), d(4))


def test_contains():
    interval = Interval(d(3), d(6))
    assert d(3) in interval
    assert d(6) in interval
    assert d(7) not in interval


def test_overlaps():
    assert Interval(d(1), d(5)).overlaps(Interval(d(5), d(9)))
    assert not Interval(d(1), d(4)).overlaps(Interval(d(5), d(9)))


def test_merge_joins_overlapping_and_adjacent():
    merged = merge_intervals([Interval(d(4), d(6)), Interval(d(1), d(3)), Interval(d(6), d(8))])
    assert merged == [Interval(d(1), d(8))]


def test_merge_keeps_gaps():
    merged = merge_intervals([Interval(d(1), d(2)), Interval(d(5), d(6))])
    assert merged == [Interval(d(1), d(2)), Interval(d(5), d(6))]


def test_total_days_counts_overlap_once():
    assert total_days([Interval(d(1), d(5)), Interval(d(3), d(7))]) == 7
