#!/bin/bash
set -euo pipefail
cat > /app/roman.py <<'PY'
"""Converts between integers and Roman numerals: roman.py to-roman N | from-roman S."""
import sys

SYMBOLS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
           (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(n: int) -> str:
    if not 1 <= n <= 3999:
        raise ValueError(f"{n} is out of range 1..3999")
    out = []
    for value, symbol in SYMBOLS:
        count, n = divmod(n, value)
        out.append(symbol * count)
    return "".join(out)


def from_roman(text: str) -> int:
    s = text.upper()
    total, i = 0, 0
    for value, symbol in SYMBOLS:
        while s.startswith(symbol, i):
            total += value
            i += len(symbol)
    if i != len(s) or not s or total > 3999 or to_roman(total) != s:
        raise ValueError(f"invalid Roman numeral {text!r}")
    return total


def main(argv: list[str]) -> int:
    try:
        if len(argv) != 2:
            raise ValueError("usage: roman.py to-roman N | from-roman S")
        command, arg = argv
        if command == "to-roman":
            try:
                n = int(arg)
            except ValueError:
                raise ValueError(f"not an integer: {arg!r}") from None
            print(to_roman(n))
        elif command == "from-roman":
            print(from_roman(arg))
        else:
            raise ValueError(f"unknown command {command!r}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
PY
