"""Checks the large-file listing and the removal of *.tmp files."""
from pathlib import Path

DATA = Path("/app/data")


def test_large_files_listing():
    lines = [l for l in Path("/app/large_files.txt").read_text().splitlines() if l.strip()]
    assert lines == [
        "cache/build.tmp",
        "db/Store.sqlite",
        "logs/old/app.log.1",
        "media/raw footage/clip 01.mov",
        "media/video.bin",
    ]


def test_tmp_files_removed():
    assert not [p for p in DATA.rglob("*.tmp")]
    assert not (DATA / "cache/build.tmp").exists()


def test_other_files_kept():
    for rel in ("media/video.bin", "media/exact_100k.bin", "media/raw footage/clip 01.mov",
                "media/raw footage/clip 02.mov", "logs/old/app.log.1", "logs/app.log",
                "db/Store.sqlite", "db/index.idx", "cache/keep.tmp.txt"):
        assert (DATA / rel).is_file(), rel
    assert (DATA / "latest_video").is_symlink()
    assert (DATA / "media/video.bin").stat().st_size == 250000
    assert Path("/app/large_files.txt").is_file()
