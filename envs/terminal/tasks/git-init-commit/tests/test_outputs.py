"""Checks the new repository: branch, single commit, tracked files, clean status."""
import subprocess
from pathlib import Path

REPO = Path("/app/project")


def git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_branch_is_main():
    assert git("symbolic-ref", "--short", "HEAD").strip() == "main"


def test_single_initial_commit():
    subjects = git("log", "--format=%s").splitlines()
    assert subjects == ["Initial commit"]


def test_tracked_files():
    tracked = set(git("ls-files").split())
    assert tracked == {".gitignore", ".env.example", "README.md", "src/app.py", "src/pkg/__init__.py",
                       "src/pkg/core.py", "tests/test_core.py"}


def test_clean_and_ignored_files_kept():
    assert git("status", "--porcelain") == ""
    for rel in ("debug.log", "src/pkg/trace.log", "build/app.bin", ".env"):
        assert (REPO / rel).is_file(), rel
    assert git("check-ignore", "other/new.log").strip() == "other/new.log"
