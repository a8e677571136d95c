"""Runs /app/bin/greet with several argument lists."""
import os
import subprocess

import pytest

GREET = "/app/bin/greet"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GREET, *args], capture_output=True, text=True, timeout=10)


def test_is_executable():
    assert os.access(GREET, os.X_OK)


@pytest.mark.parametrize("args,expected", [
    ((), "Hello, world!"),
    (("Ada",), "Hello, Ada!"),
    (("Ada", "Lovelace"), "Hello, Ada Lovelace!"),
])
def test_greetings(args, expected):
    out = run(*args)
    assert out.returncode == 0
    assert out.stdout == expected + "\n"


@pytest.mark.parametrize("args,expected", [
    (("-u", "Ada"), "HELLO, ADA!"),
    (("-u",), "HELLO, WORLD!"),
    (("-u", "grace", "hopper"), "HELLO, GRACE HOPPER!"),
])
def test_uppercase(args, expected):
    out = run(*args)
    assert out.returncode == 0
    assert out.stdout == expected + "\n"
