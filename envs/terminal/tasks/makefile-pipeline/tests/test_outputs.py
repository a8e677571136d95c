"""Runs the pipeline Makefile in fresh copies of /app/pipeline."""
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

MERGED = "name,score\nalice,12\nbob,7\ncarol,30\ndave,5\nerin,21\nfrank,9\n"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    assert Path("/app/pipeline/Makefile").is_file(), "no /app/pipeline/Makefile"
    copy = tmp_path / "pipeline"
    shutil.copytree("/app/pipeline", copy, ignore=shutil.ignore_patterns("build"))
    past = time.time() - 3600
    for path in copy.rglob("*"):
        os.utime(path, (past, past))
    return copy


def make(where: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", *args], cwd=where, capture_output=True, text=True, timeout=30)


def lines(path: Path) -> list[str]:
    return [l.strip() for l in path.read_text().splitlines() if l.strip()]


def test_build_outputs(work):
    out = make(work)
    assert out.returncode == 0, out.stderr
    assert (work / "build/merged.csv").read_text() == MERGED
    assert lines(work / "build/stats.txt") == ["rows=6", "total=84"]


def test_second_run_is_noop(work):
    assert make(work).returncode == 0
    before = {p: p.stat().st_mtime_ns for p in (work / "build").iterdir()}
    assert make(work, "-q").returncode == 0
    assert make(work).returncode == 0
    assert {p: p.stat().st_mtime_ns for p in (work / "build").iterdir()} == before


def test_rebuild_after_change_and_new_file(work):
    assert make(work).returncode == 0
    (work / "src/b.csv").write_text("name,score\ncarol,31\n")
    future = time.time() + 5
    os.utime(work / "src/b.csv", (future, future))
    assert make(work, "-q").returncode != 0
    assert make(work).returncode == 0
    assert "carol,31" in lines(work / "build/merged.csv")
    assert lines(work / "build/stats.txt") == ["rows=6", "total=85"]
    (work / "src/0-first.csv").write_text("name,score\nzed,100\n")
    os.utime(work / "src/0-first.csv", (future + 5, future + 5))
    assert make(work).returncode == 0
    assert lines(work / "build/merged.csv")[:2] == ["name,score", "zed,100"]
    assert lines(work / "build/stats.txt") == ["rows=7", "total=185"]


def test_clean(work):
    assert make(work).returncode == 0
    out = make(work, "clean")
    assert out.returncode == 0, out.stderr
    assert not (work / "build").exists()
    assert (work / "src/a.csv").is_file()


def test_no_absolute_app_paths():
    assert "/app" not in Path("/app/pipeline/Makefile").read_text()
