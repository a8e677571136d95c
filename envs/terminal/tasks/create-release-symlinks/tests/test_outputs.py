"""Checks the release symlinks: relative targets that resolve to the right releases."""
import os
import subprocess
from pathlib import Path


def link_ok(link: str, target: str, resolves_to: str) -> None:
    path = Path(link)
    assert path.is_symlink(), f"{link} is not a symlink"
    stored = os.readlink(path)
    assert not stored.startswith("/"), f"{link} stores an absolute target {stored}"
    assert os.path.normpath(stored) == os.path.normpath(target)
    assert os.path.realpath(path) == resolves_to


def test_current_link():
    link_ok("/app/current", "releases/v2.0", "/app/releases/v2.0")


def test_previous_link():
    link_ok("/app/previous", "releases/v1.1", "/app/releases/v1.1")


def test_bin_app_link_runs_current_release():
    link_ok("/app/bin/app", "../current/bin/app", "/app/releases/v2.0/bin/app")
    out = subprocess.run(["/app/bin/app"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0
    assert out.stdout.strip() == "app 2.0"


def test_releases_are_real_directories():
    for v in ("v1.0", "v1.1", "v2.0"):
        release = Path("/app/releases") / v
        assert release.is_dir() and not release.is_symlink()
        assert (release / "config.yaml").read_text() == f"version: {v[1:]}\n"
    assert Path("/app/current").is_symlink()
