from datetime import timedelta

import pytest

from datekit.durations import format_duration, parse_duration


def test_parse_single_part():
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("2w") == timedelta(weeks=2)


def test_parse_spaced_parts():
    assert parse_duration("1d 2h 30m") == timedelta(days=1, hours=2, minutes=30)


@pytest.mark.parametrize("text", ["", "5x", "h", "1.5h", "-3d", "2d 5x"],
                         ids=["empty", "unknown-unit", "no-number", "fraction", "negative", "bad-part"])
def test_parse_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_largest_unit_first():
    assert format_duration(timedelta(days=8, minutes=5)) == "1w 1d 5m"


def test_format_zero():
    assert format_duration(timedelta(0)) == "0s"


def test_format_rejects_negative():
    with pytest.raises(ValueError):
        format_duration(timedelta(seconds=-1))


def test_format_then_parse_round_trips():
    delta = timedelta(days=3, hours=4, seconds=7)
    assert parse_duration(format_duration(delta)) == delta
