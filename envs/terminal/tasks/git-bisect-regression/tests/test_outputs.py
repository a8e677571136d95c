"""Checks the bisect result, the fix commit and the repository state."""
import subprocess
from pathlib import Path

REPO = Path("/app/calc")


def git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def original_commits() -> list[tuple[str, str]]:
    """(hash, subject) of the 24 original commits, oldest first, found from the new tip's history."""
    rows = [line.split(" ", 1) for line in git("log", "--reverse", "--format=%H %s", "main").splitlines()]
    return [(h, s) for h, s in rows][:24]


def test_first_bad_commit():
    bad = [h for h, s in original_commits() if s == "Simplify percentage helper"]
    assert len(bad) == 1
    assert Path("/app/first_bad.txt").read_text().strip() == bad[0]


def test_one_fix_commit_on_top():
    log = git("log", "--format=%s", "main").splitlines()
    assert len(log) == 25, "expected exactly one new commit on main"
    assert log[1] == "Update release notes (24)"
    assert git("rev-list", "--merges", "main") == ""


def test_check_passes_at_tip():
    out = subprocess.run(["./check.sh"], cwd=REPO, capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert git("diff", "HEAD~1", "HEAD", "--name-only") == "calc.py"
    calc = git("show", "HEAD:calc.py")
    assert "def sub(" in calc and "def mul(" in calc


def test_repository_state():
    assert git("symbolic-ref", "--short", "HEAD") == "main"
    assert git("status", "--porcelain") == ""
    assert not (REPO / ".git/BISECT_LOG").exists()
    assert not (REPO / ".git/BISECT_START").exists()
    assert Path("/app/first_bad.txt").is_file()
