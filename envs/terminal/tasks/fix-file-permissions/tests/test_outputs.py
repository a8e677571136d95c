"""Checks the mode of every file and directory under /app/project."""
import os
import stat
from pathlib import Path

ROOT = Path("/app/project")
EXPECTED_FILES = {
    "scripts/build.sh": 0o755, "scripts/deploy.sh": 0o755, "scripts/ci/lint.sh": 0o755,
    "scripts/README.txt": 0o644, "src/main.py": 0o644, "src/pkg/__init__.py": 0o644,
    "README.md": 0o644, "docs/guide.md": 0o644,
    "secrets/api_key.txt": 0o600, "secrets/db_password.txt": 0o600,
}


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_shell_scripts_executable():
    for rel in ("scripts/build.sh", "scripts/deploy.sh", "scripts/ci/lint.sh"):
        assert mode(ROOT / rel) == 0o755, rel


def test_secrets_locked_down():
    assert mode(ROOT / "secrets") == 0o700
    for rel in ("secrets/api_key.txt", "secrets/db_password.txt"):
        assert mode(ROOT / rel) == 0o600, rel


def test_other_files_and_dirs():
    for rel in ("scripts/README.txt", "src/main.py", "src/pkg/__init__.py", "README.md", "docs/guide.md"):
        assert mode(ROOT / rel) == 0o644, rel
    for rel in (".", "scripts", "scripts/ci", "src", "src/pkg", "docs"):
        assert mode(ROOT / rel) == 0o755, rel


def test_tree_and_contents_unchanged():
    files = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()}
    assert files == set(EXPECTED_FILES)
    assert (ROOT / "secrets/api_key.txt").read_text() == "key=abc123\n"
    assert (ROOT / "scripts/build.sh").read_text() == "#!/bin/sh\necho build\n"
    assert mode(ROOT / "src/main.py") != 0o777
