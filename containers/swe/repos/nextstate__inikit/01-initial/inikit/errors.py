"""Errors raised while reading text."""

from __future__ import annotations


class ParseError(ValueError):
    """A line that cannot be read; ``lineno`` counts from 1."""

    def __init__(self, message: str, lineno: int):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno
