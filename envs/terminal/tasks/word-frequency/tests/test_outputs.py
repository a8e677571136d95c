"""Checks the top-10 word list."""
from pathlib import Path

EXPECTED = [
    "147 river", "69 stone", "48 harbor", "40 lantern", "32 signal",
    "26 meadow", "23 copper", "23 winter", "22 thunder", "19 velvet",
]


def lines() -> list[str]:
    return [" ".join(l.split()) for l in Path("/app/top_words.txt").read_text().splitlines() if l.strip()]


def test_top_three():
    assert lines()[:3] == EXPECTED[:3]


def test_full_top_ten_with_ties():
    assert lines() == EXPECTED
