"""datekit: calendar arithmetic and closed date intervals."""

from datekit.calendar import add_months, days_in_month, is_leap_year
from datekit.intervals import Interval, merge_intervals, total_days

__all__ = ["Interval", "add_months", "days_in_month", "is_leap_year", "merge_intervals",
           "total_days"]
__version__ = "0.1.0"
