"""Checks the fetch_data -> load_data rename under /app/src."""
import hashlib
import re
from pathlib import Path

SRC = Path("/app/src")
EXPECTED_SHA256 = {
    "client/api.py": "70ea2c36704b8612bba2e4a5ec4457456c02ceead9afd425a7afd5a380cccf96",
    "client/cache.py": "012d2eb4cfe0895e5c324902dc6de2f404bc0dbacf78046d53bef46600c04220",
    "docs/migration.md": "fa69fa94b29dd94f698a3d95bf5b504ea582f17485a980ab8d420d6369197a1f",
    "jobs/__init__.py": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "jobs/nightly sync.py": "8f703afe32a68911fadeecf22acd1070acfaa27276a4c70c061684ac38f0a057",
    "jobs/notes.txt": "609f846c8f6adee4c39246ee6814fa16080c9350af1e7a5531912a8085c7642f",
    "jobs/report.py": "bb52b52cb4926fa70c270571c68193c6cf0a2a996a211d7a5dfd27c844751936",
    "vendor/httplib/compat.py": "25ea8d280cf5f7fc5cf485ead56bcaa2e5f12ef5c8ada03e923fc550903eee1d",
}
CHANGED = ["client/api.py", "client/cache.py", "jobs/nightly sync.py"]


def digest(rel: str) -> str:
    return hashlib.sha256((SRC / rel).read_bytes()).hexdigest()


def test_no_old_identifier_left_in_project_code():
    for path in SRC.rglob("*.py"):
        if "vendor" in path.relative_to(SRC).parts:
            continue
        assert not re.search(r"\bfetch_data\b", path.read_text()), path


def test_renamed_files_exact():
    for rel in CHANGED:
        assert digest(rel) == EXPECTED_SHA256[rel], rel


def test_untouched_files():
    for rel, sha in EXPECTED_SHA256.items():
        if rel not in CHANGED:
            assert digest(rel) == sha, rel
    assert "load_data" in (SRC / "client/api.py").read_text()


def test_changed_files_list():
    lines = [l.strip() for l in Path("/app/changed_files.txt").read_text().splitlines() if l.strip()]
    assert lines == CHANGED
