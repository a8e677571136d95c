from datetime import date

import pytest

from datekit.calendar import add_months, days_in_month, is_leap_year, month_end


def test_leap_years():
    assert is_leap_year(2024)
    assert is_leap_year(2000)
    assert not is_leap_year(1900)
    assert not is_leap_year(2023)


def test_days_in_month():
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 12) == 31


def test_days_in_month_rejects_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2023, 13)


def test_add_months_within_year():
    assert add_months(date(2023, 3, 15), 2) == date(2023, 5, 15)


def test_add_months_clamps_to_month_end():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)


def test_add_months_across_year_end():
    assert add_months(date(2023, 11, 30), 3) == date(2024, 2, 29)


def test_add_months_negative():
    assert add_months(date(2024, 5, 31), -2) == date(2024, 3, 31)


def test_month_end():
    assert month_end(date(2024, 2, 10)) == date(2024, 2, 29)
