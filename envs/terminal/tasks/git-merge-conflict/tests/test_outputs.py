"""Checks the merge commit, the conflict resolution and the merged tree."""
import subprocess
from pathlib import Path

REPO = Path("/app/service")
CONFIG = ('"""Service configuration."""\n\nHOST = "0.0.0.0"\nPORT = 8000\nTIMEOUT = 60\nRETRIES = 3\n'
          'LOG_LEVEL = "INFO"\n')
CHANGELOG = ("# Changelog\n\n## Unreleased\n- Raise default timeout to 60s\n- Add retry support\n\n"
             "## 1.0.0\n- First release\n")


def git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_merge_commit_parents():
    assert git("symbolic-ref", "--short", "HEAD") == "main"
    parents = git("rev-list", "--parents", "-n", "1", "HEAD").split()[1:]
    assert len(parents) == 2, "HEAD is not a merge commit"
    assert git("log", "-1", "--format=%s", parents[0]) == "Document HOST"
    assert parents[1] == git("rev-parse", "feature/retry")
    assert git("log", "-1", "--format=%s", "feature/retry") == "Use retries in client"


def test_config_resolution():
    assert (REPO / "config.py").read_text() == CONFIG
    assert git("show", "HEAD:config.py") + "\n" == CONFIG


def test_changelog_resolution():
    assert (REPO / "CHANGELOG.md").read_text() == CHANGELOG


def test_both_sides_kept_and_code_runs():
    assert "Listens on HOST:PORT" in (REPO / "README.md").read_text()
    assert (REPO / "retry.py").is_file()
    out = subprocess.run(["python3", "-B", "-c", "import client; print(client.describe())"], cwd=REPO,
                         capture_output=True, text=True, timeout=20)
    assert out.stdout.strip() == "timeout=60 attempts=4", out.stderr


def test_clean_tree_without_markers():
    assert git("status", "--porcelain") == ""
    assert not (REPO / ".git/MERGE_HEAD").exists()
    assert "retry.py" in git("ls-files").split()
    for name in git("ls-files").split():
        text = (REPO / name).read_text()
        assert "<<<<<<<" not in text and ">>>>>>>" not in text, name
