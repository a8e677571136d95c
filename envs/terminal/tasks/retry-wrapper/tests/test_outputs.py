"""Runs /app/bin/retry against commands that fail a known number of times."""
import os
import subprocess
import time
from pathlib import Path

import pytest

RETRY = "/app/bin/retry"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RETRY, *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def flaky(tmp_path: Path) -> tuple[str, Path]:
    """A command that exits 7 on its first two runs and prints `ok` on the third."""
    counter = tmp_path / "count"
    script = tmp_path / "flaky.sh"
    script.write_text(f'#!/bin/bash\nn=$(( $(cat "{counter}" 2>/dev/null || echo 0) + 1 ))\n'
                      f'echo $n > "{counter}"\n[ $n -ge 3 ] && {{ echo ok; exit 0; }}\necho "fail $n" >&2\nexit 7\n')
    script.chmod(0o755)
    return str(script), counter


def test_succeeds_after_failures(flaky):
    script, counter = flaky
    out = run("-n", "3", "-d", "0", "--", script)
    assert out.returncode == 0
    assert out.stdout == "ok\n"
    assert counter.read_text().strip() == "3"
    notes = [l for l in out.stderr.splitlines() if l.startswith("retry:")]
    assert notes == ["retry: attempt 1/3 failed with exit code 7", "retry: attempt 2/3 failed with exit code 7"]
    assert "fail 1" in out.stderr


def test_gives_up_with_last_status(flaky):
    script, counter = flaky
    out = run("-n", "2", "-d", "0", "--", script)
    assert out.returncode == 7
    assert out.stdout == ""
    assert counter.read_text().strip() == "2"
    assert "retry: attempt 2/2 failed with exit code 7" in out.stderr


def test_arguments_pass_through():
    out = run("-n", "1", "-d", "0", "--", "printf", "%s|", "a b", "c", "")
    assert out.returncode == 0
    assert out.stdout == "a b|c||"
    assert out.stderr == ""


def test_default_attempts_and_delay(tmp_path):
    log = tmp_path / "runs"
    start = time.monotonic()
    out = run("--", "sh", "-c", f'echo x >> "{log}"; exit 5')
    elapsed = time.monotonic() - start
    assert out.returncode == 5
    assert len(log.read_text().splitlines()) == 3
    assert 1.9 <= elapsed < 6


def test_fractional_delay(tmp_path):
    start = time.monotonic()
    out = run("-n", "3", "-d", "0.4", "--", "false")
    elapsed = time.monotonic() - start
    assert out.returncode == 1
    assert 0.75 <= elapsed < 2.5
    assert "retry: attempt 3/3 failed with exit code 1" in out.stderr


@pytest.mark.parametrize("args", [
    ("echo", "hi"), ("-n", "0", "--", "echo", "hi"), ("-n", "abc", "--", "echo", "hi"),
    ("--",), ("-x", "--", "echo", "hi"), ("-n", "2"),
])
def test_usage_errors(args):
    out = run(*args)
    assert out.returncode == 64
    assert out.stdout == ""
    assert out.stderr.strip() != ""
    assert os.access(RETRY, os.X_OK)
