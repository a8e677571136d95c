"""Typed access to parsed INI data; a key missing from a section falls back to ``DEFAULT``."""

from __future__ import annotations

from typing import Any

from inikit.ini import DEFAULT, parse_ini

TRUE_WORDS = ("1", "yes", "true", "on")
FALSE_WORDS = ("0", "no", "false", "off")
_MISSING: Any = object()


class Config:
    """Sections of ``key = value`` strings, read as strings, integers or booleans."""

    def __init__(self, data: dict[str, dict[str, str]]):
        self.data = data

    @classmethod
    def from_text(cls, text: str) -> Config:
        """A config read from INI text."""
        return cls(parse_ini(text))

    def sections(self) -> list[str]:
        """Section names in file order, without ``DEFAULT``."""
        return [name for name in self.data if name != DEFAULT]

    def get(self, section: str, key: str, default: Any = _MISSING) -> Any:
        """The value of ``key`` in ``section`` or ``DEFAULT``; ``default`` or ``KeyError`` if absent."""
        key = key.lower()
        for name in (section, DEFAULT):
            values = self.data.get(name, {})
            if key in values:
                return values[key]
        if default is _MISSING:
            raise KeyError(f"{section}.{key}")
        return default

    def get_int(self, section: str, key: str, default: Any = _MISSING) -> int:
        """The value as an ``int``; raises ``ValueError`` when it is not one."""
        return int(self.get(section, key, default))

    def get_bool(self, section: str, key: str, default: Any = _MISSING) -> bool:
        """The value as a ``bool``: yes/no, true/false, on/off or 1/0."""
        value = self.get(section, key, default)
        if isinstance(value, bool):
            return value
        if value in TRUE_WORDS:
            return True
        if value in FALSE_WORDS:
            return False
        raise ValueError(f"{section}.{key} is not a boolean: {value!r}")
