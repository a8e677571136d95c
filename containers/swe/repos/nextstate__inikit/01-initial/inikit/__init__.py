"""inikit: a small INI reader."""

from inikit.errors import ParseError
from inikit.ini import DEFAULT, parse_ini

__all__ = ["DEFAULT", "ParseError", "parse_ini"]
__version__ = "0.1.0"
