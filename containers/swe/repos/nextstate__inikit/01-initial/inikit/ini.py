"""INI text: ``[section]`` headers, ``key = value`` lines, ``#`` and ``;`` comment lines."""

from __future__ import annotations

from inikit.errors import ParseError

DEFAULT = "DEFAULT"


def parse_ini(text: str) -> dict[str, dict[str, str]]:
    """Each section's keys and values; keys before the first header go to ``DEFAULT``.

    Keys are lower-cased and values stripped; a repeated key keeps its last value.
    """
    data: dict[str, dict[str, str]] = {}
    section = DEFAULT
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(f"unclosed section header {line!r}", lineno)
            section = line[1:-1].strip()
            if not section:
                raise ParseError("empty section name", lineno)
            data.setdefault(section, {})
            continue
        if "=" not in line:
            raise ParseError(f"expected 'key = value', got {line!r}", lineno)
        key, value = line.split("=")
        key = key.strip().lower()
        if not key:
            raise ParseError("empty key", lineno)
        data.setdefault(section, {})[key] = value.strip()
    return data
