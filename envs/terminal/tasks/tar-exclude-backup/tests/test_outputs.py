"""Checks the backup archive's members and contents, and its checksum file."""
import subprocess
import tarfile
from pathlib import Path

ARCHIVE = Path("/app/backup/data-backup.tar.gz")
EXPECTED_FILES = {
    "data/docs/a.md": b"alpha\n", "data/docs/b.md": b"beta\n", "data/docs/report.tmpl": b"template\n",
    "data/src/main.py": b"print(1)\n", "data/src/lib/util.py": b"x = 2\n",
    "data/logs/app.log": b"log\n", "data/.config/settings": b"theme=dark\n",
    "data/src/cache/README": b"keep me\n",
}


def members() -> dict[str, tarfile.TarInfo]:
    with tarfile.open(ARCHIVE, "r:gz") as tar:
        return {m.name.removeprefix("./"): m for m in tar.getmembers()}


def test_archive_file_set():
    files = {name for name, m in members().items() if m.isfile()}
    assert files == set(EXPECTED_FILES)


def test_archive_contents():
    with tarfile.open(ARCHIVE, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                name = member.name.removeprefix("./")
                assert tar.extractfile(member).read() == EXPECTED_FILES[name], name


def test_excluded_entries_absent():
    names = members()
    assert not [n for n in names if n == "data/cache" or n.startswith("data/cache/")]
    assert not [n for n in names if n.endswith(".tmp")]
    assert all(n == "data" or n.startswith("data/") for n in names)


def test_checksum_file_verifies():
    out = subprocess.run(["sha256sum", "-c", "data-backup.tar.gz.sha256"], cwd="/app/backup",
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "data-backup.tar.gz: OK" in out.stdout


def test_source_untouched():
    assert Path("/app/data/cache/index.bin").read_text() == "c\n"
    assert Path("/app/data/docs/draft.tmp").is_file()
    assert ARCHIVE.is_file()
