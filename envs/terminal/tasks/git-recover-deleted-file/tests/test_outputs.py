"""Checks the restored file, the new commit, and that history was kept."""
import subprocess
from pathlib import Path

REPO = Path("/app/repo")
LAST_CONTENT = ("database:\n  host: db.internal\n  port: 6543\n  pool: 10\n"
                "features:\n  invoices: false\n  refunds: true\n")
OLD_SUBJECTS = ["Document SETTINGS variable", "Move settings to environment", "Try pgbouncer port",
                "Add app entry point", "Tune database settings", "Add README and settings"]


def git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_file_restored_with_last_content():
    assert (REPO / "config/settings.yaml").read_text() == LAST_CONTENT
    assert git("show", "HEAD:config/settings.yaml") == LAST_CONTENT


def test_one_new_commit_on_main():
    assert git("symbolic-ref", "--short", "HEAD").strip() == "main"
    subjects = git("log", "--format=%s").splitlines()
    assert subjects == ["Restore settings.yaml"] + OLD_SUBJECTS


def test_only_settings_changed():
    changed = git("diff", "--name-status", "HEAD~1", "HEAD").split("\n")
    assert [l.split() for l in changed if l] == [["A", "config/settings.yaml"]]
    assert git("status", "--porcelain") == ""
