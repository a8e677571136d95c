"""Runs /app/stats.py on inputs that exercise each documented behaviour."""
import subprocess
from pathlib import Path


def stats(tmp_path: Path, text: str, stdin: bool = False) -> subprocess.CompletedProcess:
    if stdin:
        return subprocess.run(["python3", "/app/stats.py", "-"], input=text, capture_output=True,
                              text=True, timeout=20)
    data = tmp_path / "numbers.txt"
    data.write_text(text)
    return subprocess.run(["python3", "/app/stats.py", str(data)], capture_output=True, text=True, timeout=20)


def test_unsorted_odd_count(tmp_path):
    out = stats(tmp_path, "9\n1\n5\n3\n7\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "count=5 mean=5.00 median=5.00 min=1.00 max=9.00"
    out = stats(tmp_path, "10\n2\n3\n")
    assert out.stdout.strip() == "count=3 mean=5.00 median=3.00 min=2.00 max=10.00"


def test_even_count_median(tmp_path):
    out = stats(tmp_path, "4\n1\n3\n2\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "count=4 mean=2.50 median=2.50 min=1.00 max=4.00"


def test_blank_and_comment_lines(tmp_path):
    out = stats(tmp_path, "# readings\n\n2.5\n   \n  # calibrated\n7.5\n\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "count=2 mean=5.00 median=5.00 min=2.50 max=7.50"


def test_negative_numbers(tmp_path):
    out = stats(tmp_path, "-3\n-1.5\n-8\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "count=3 mean=-4.17 median=-3.00 min=-8.00 max=-1.50"


def test_standard_input(tmp_path):
    out = stats(tmp_path, "1\n2\n3\n10\n", stdin=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "count=4 mean=4.00 median=2.50 min=1.00 max=10.00"


def test_no_numbers(tmp_path):
    out = stats(tmp_path, "# nothing here\n\n")
    assert out.returncode == 1
    assert out.stdout == ""
    assert "stats: no numbers" in out.stderr
