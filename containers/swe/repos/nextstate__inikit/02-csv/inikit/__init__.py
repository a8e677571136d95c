"""inikit: a small INI reader and CSV line splitting."""

from inikit.csvline import join_line, split_line
from inikit.errors import ParseError
from inikit.ini import DEFAULT, parse_ini

__all__ = ["DEFAULT", "ParseError", "join_line", "parse_ini", "split_line"]
__version__ = "0.2.0"
