"""Checks the deduplicated photo tree and the report."""
import hashlib
import os
from pathlib import Path

ROOT = Path("/app/photos")
PAIRS = [
    [
        "2023/beach.jpg",
        "2023/copy of beach.jpg"
    ],
    [
        "2023/beach.jpg",
        "2024/beach (1).jpg"
    ],
    [
        "2023/beach.jpg",
        "Archive/beach.jpg"
    ],
    [
        "2024/family/mom.jpg",
        "backup/old/mom.jpg"
    ],
    [
        "2024/party.png",
        "backup/party.png"
    ],
    [
        "2023/sunset.jpg",
        "backup/sunset.jpg"
    ]
]
SHA256 = {
    "2023/beach.jpg": "9c034504588caf0cd572bf3572e1b92bf1dba0c2ec2981303c3f24575b89efb5",
    "2023/sunset.jpg": "4677ab84f05f73c4c250e5ecee15b28aa9a8f2e03bfe3cbbd2b0bcb7666cd97b",
    "2023/copy of beach.jpg": "9c034504588caf0cd572bf3572e1b92bf1dba0c2ec2981303c3f24575b89efb5",
    "2024/beach (1).jpg": "9c034504588caf0cd572bf3572e1b92bf1dba0c2ec2981303c3f24575b89efb5",
    "2024/party.png": "9d6a3445b41325d722b566aceb0c4745d3e1ebc9eafe5ab221f046213c43a7ff",
    "2024/family/mom.jpg": "932955835945d1beed6fa00a1ba99a424cb1c8debce4d4904963a5c381acacad",
    "backup/sunset.jpg": "4677ab84f05f73c4c250e5ecee15b28aa9a8f2e03bfe3cbbd2b0bcb7666cd97b",
    "backup/party.png": "9d6a3445b41325d722b566aceb0c4745d3e1ebc9eafe5ab221f046213c43a7ff",
    "backup/old/mom.jpg": "932955835945d1beed6fa00a1ba99a424cb1c8debce4d4904963a5c381acacad",
    "inbox/IMG_0001.jpg": "b2fe0ac55a73c04516879f23a354b42632c2ae33a2181d91cf5c2bf1baa2f2bb",
    "inbox/IMG_0002.jpg": "25383f67996efdf1c7dba120dd46a55b3ded4620625641f259c3af9b2535a177",
    "inbox/img 0003.jpg": "34af8c988288f65daafba01634575579edc93e239d7a57ff5b87e46366ad65bc",
    "2024/family/dad.jpg": "bb843d5f7b89abda9a838c7345bf62269f40bfaa879a21efff2ea439a1b0023d",
    "Archive/beach.jpg": "9c034504588caf0cd572bf3572e1b92bf1dba0c2ec2981303c3f24575b89efb5"
}
UNIQUE = ["2024/family/dad.jpg", "inbox/IMG_0001.jpg", "inbox/IMG_0002.jpg", "inbox/img 0003.jpg"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_duplicates_are_relative_links_to_kept_file():
    for kept, dup in PAIRS:
        link = ROOT / dup
        assert link.is_symlink(), dup
        target = os.readlink(link)
        assert not target.startswith("/"), f"{dup} -> {target} is absolute"
        assert (link.parent / target).resolve() == (ROOT / kept).resolve(), dup


def test_kept_files_are_regular_and_intact():
    for kept in sorted({k for k, _ in PAIRS}):
        path = ROOT / kept
        assert path.is_file() and not path.is_symlink(), kept
        assert sha(path) == SHA256[kept]
    for kept, dup in PAIRS:
        assert sha(ROOT / dup) == SHA256[dup]
    assert any((ROOT / d).is_symlink() for _, d in PAIRS)


def test_unique_files_untouched():
    for rel in UNIQUE:
        path = ROOT / rel
        assert path.is_file() and not path.is_symlink(), rel
        assert sha(path) == SHA256[rel]
    regular = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not p.is_symlink())
    assert regular == sorted(UNIQUE + sorted({k for k, _ in PAIRS}))


def test_report():
    lines = Path("/app/dedupe_report.txt").read_text().splitlines()
    assert [l.split("\t") for l in lines if l] == [list(p) for p in PAIRS]
