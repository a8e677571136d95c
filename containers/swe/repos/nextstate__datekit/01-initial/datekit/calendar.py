"""Calendar arithmetic on ``datetime.date`` values (proleptic Gregorian calendar)."""

from __future__ import annotations

from datetime import date

_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap_year(year: int) -> bool:
    """Whether ``year`` has a 29 February."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year: int, month: int) -> int:
    """Number of days in ``month`` (1-12) of ``year``."""
    if not 1 <= month <= 12:
        raise ValueError(f"month must be in 1..12, got {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return _MONTH_DAYS[month - 1]


def add_months(day: date, months: int) -> date:
    """``day`` moved by ``months`` (may be negative), clamped to the end of the target month.

    >>> add_months(date(2024, 1, 31), 1)
    datetime.date(2024, 2, 29)
    """
    total = day.month + months
    year = day.year + total // 12
    month = total % 12 or 12
    return date(year, month, min(day.day, days_in_month(year, month)))


def month_end(day: date) -> date:
    """The last day of ``day``'s month."""
    return day.replace(day=days_in_month(day.year, day.month))
