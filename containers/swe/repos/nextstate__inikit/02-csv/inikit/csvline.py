"""One line of CSV: fields separated by ``sep``, optionally in double quotes.

Inside a quoted field the separator is literal and a doubled quote (``""``)
stands for one quote character.
"""

from __future__ import annotations

from typing import Iterable

QUOTE = '"'


def split_line(line: str, sep: str = ",") -> list[str]:
    """The fields of ``line``; raises ``ValueError`` on an unterminated quote."""
    fields: list[str] = []
    field: list[str] = []
    quoted = False
    for ch in line:
        if quoted:
            if ch == QUOTE:
                quoted = False
            else:
                field.append(ch)
        elif ch == QUOTE:
            quoted = True
        elif ch == sep:
            fields.append("".join(field))
            field = []
        else:
            field.append(ch)
    if quoted:
        raise ValueError(f"unterminated quote in {line!r}")
    fields.append("".join(field))
    return fields


def join_line(fields: Iterable[str], sep: str = ",") -> str:
    """The line for ``fields``, quoting the ones that hold ``sep``, quotes or edge spaces."""
    out = []
    for field in fields:
        if sep in field or QUOTE in field or field != field.strip():
            field = QUOTE + field.replace(QUOTE, QUOTE * 2) + QUOTE
        out.append(field)
    return sep.join(out)
