"""Builds the offline SWE task repositories: git history from plain source files.

``SRC/<owner>__<name>/history.json`` names the repository's author and its
commits, oldest first; each commit's directory holds the files that commit
adds or changes. Every source directory becomes a bare repository
``DEST/<owner>__<name>.git``. Identities, dates, messages and file modes are
fixed, so the commit hashes are the same wherever and whenever it is built.

Standard library and the git CLI only: it runs on the host and inside
``docker build``.  Usage: ``python3 make_repos.py SRC DEST``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def git(cwd: Path, *args: str, env: dict[str, str]) -> str:
    """Runs one git command; returns its stripped stdout."""
    done = subprocess.run(["git", *args], cwd=cwd, env=env, check=True,
                          capture_output=True, text=True)
    return done.stdout.strip()


def overlay(source: Path, work: Path) -> None:
    """Copies the files under ``source`` into ``work`` with mode 0644."""
    for path in sorted(source.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            target = work / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            os.chmod(target, 0o644)


def build_repo(source: Path, dest: Path) -> list[str]:
    """Builds ``dest/<source name>.git`` from ``source``; returns the commit hashes, oldest first."""
    history = json.loads((source / "history.json").read_text())
    name, _, email = history["author"].partition(" <")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.devnull, "TZ": "UTC",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email.rstrip(">"),
           "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email.rstrip(">")}
    hashes = []
    target = dest / f"{source.name}.git"
    with tempfile.TemporaryDirectory(prefix="swe-repo-") as tmp:
        work = Path(tmp)
        git(work, "init", "-q", "-b", "main", env=env)
        for commit in history["commits"]:
            overlay(source / commit["dir"], work)
            git(work, "add", "-A", env=env)
            dated = {**env, "GIT_AUTHOR_DATE": commit["date"], "GIT_COMMITTER_DATE": commit["date"]}
            git(work, "commit", "-q", "--no-gpg-sign", "-m", commit["message"], env=dated)
            hashes.append(git(work, "rev-parse", "HEAD", env=env))
        shutil.rmtree(target, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        git(dest, "clone", "-q", "--bare", str(work), str(target), env=env)
        git(target, "remote", "remove", "origin", env=env)
    return hashes


def build_all(src: Path, dest: Path) -> dict[str, list[str]]:
    """Builds every repository under ``src``; returns each one's commit hashes."""
    return {d.name: build_repo(d, dest) for d in sorted(src.iterdir())
            if (d / "history.json").is_file()}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    for repo, commits in build_all(Path(sys.argv[1]), Path(sys.argv[2])).items():
        print(repo, *commits)
