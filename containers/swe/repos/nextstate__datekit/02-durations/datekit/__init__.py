"""datekit: calendar arithmetic, closed date intervals and durations."""

from datekit.calendar import add_months, days_in_month, is_leap_year
from datekit.durations import format_duration, parse_duration
from datekit.intervals import Interval, merge_intervals, total_days

__all__ = ["Interval", "add_months", "days_in_month", "format_duration", "is_leap_year",
           "merge_intervals", "parse_duration", "total_days"]
__version__ = "0.2.0"
