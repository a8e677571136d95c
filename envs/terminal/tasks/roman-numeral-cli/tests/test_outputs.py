"""Runs /app/roman.py on valid and invalid inputs."""
import subprocess

import pytest


def roman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["python3", "/app/roman.py", *args], capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize("n,numeral", [
    (1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"), (400, "CD"),
    (1994, "MCMXCIV"), (2024, "MMXXIV"), (3999, "MMMCMXCIX"), (444, "CDXLIV"),
])
def test_to_roman(n, numeral):
    out = roman("to-roman", str(n))
    assert out.returncode == 0, out.stderr
    assert out.stdout == numeral + "\n"


@pytest.mark.parametrize("numeral,n", [
    ("III", 3), ("XLII", 42), ("MCMXCIV", 1994), ("mcmxciv", 1994), ("MMMCMXCIX", 3999), ("CDXLIV", 444),
])
def test_from_roman(numeral, n):
    out = roman("from-roman", numeral)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{n}\n"


@pytest.mark.parametrize("args", [
    ("to-roman", "0"), ("to-roman", "4000"), ("to-roman", "-5"), ("to-roman", "3.5"), ("to-roman", "ten"),
    ("from-roman", "IIII"), ("from-roman", "VX"), ("from-roman", "IC"), ("from-roman", "MMMM"),
    ("from-roman", "ABC"), ("from-roman", ""), ("from-roman", "XIIX"), ("convert", "10"), ("to-roman",),
])
def test_errors(args):
    out = roman(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.strip().startswith("error:")
