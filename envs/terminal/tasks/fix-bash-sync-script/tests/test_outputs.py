"""Runs /app/sync_txt.sh on directory layouts that exercise its specification."""
import subprocess
from pathlib import Path

SCRIPT = "/app/sync_txt.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=20)


def make_source(root: Path) -> Path:
    src = root / "my notes"
    (src / "sub dir").mkdir(parents=True)
    (src / "a.txt").write_text("a\n")
    (src / "meeting notes.txt").write_text("meeting\n")
    (src / "b.txt").write_text("b\n")
    (src / "image.png").write_text("png\n")
    (src / "notes.txt.bak").write_text("bak\n")
    (src / "UPPER.TXT").write_text("upper\n")
    (src / "textfile").write_text("no extension\n")
    (src / "sub dir" / "nested.txt").write_text("nested\n")
    return src


def test_copies_txt_files_with_spaces(tmp_path):
    src = make_source(tmp_path)
    dest = tmp_path / "out dir" / "deep"
    out = run(str(src), str(dest))
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["a.txt", "b.txt", "meeting notes.txt"]
    assert (dest / "meeting notes.txt").read_text() == "meeting\n"


def test_reports_count(tmp_path):
    src = make_source(tmp_path)
    out = run(str(src), str(tmp_path / "dest"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "copied 3 files"


def test_existing_destination_and_overwrite(tmp_path):
    src = make_source(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "a.txt").write_text("old\n")
    (dest / "keep.log").write_text("keep\n")
    out = run(str(src), str(dest))
    assert out.returncode == 0, out.stderr
    assert (dest / "a.txt").read_text() == "a\n"
    assert (dest / "keep.log").read_text() == "keep\n"
    assert out.stdout.strip() == "copied 3 files"


def test_empty_source(tmp_path):
    src = tmp_path / "empty"
    src.mkdir()
    (src / "readme.md").write_text("x\n")
    dest = tmp_path / "new dest" / "sub"
    out = run(str(src), str(dest))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "copied 0 files"
    assert dest.is_dir()
    assert list(dest.iterdir()) == []


def test_missing_source(tmp_path):
    missing = tmp_path / "does not exist"
    out = run(str(missing), str(tmp_path / "dest"))
    assert out.returncode == 1
    assert out.stdout == ""
    assert f"sync_txt: no such directory: {missing}" in out.stderr
