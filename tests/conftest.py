"""Shared fixtures: a Docker engine, the terminal image, and the project's wheel.

Docker tests are skipped on a machine without an engine, except in CI
(``CI=true``), where a missing engine is a failure: `.ci/run` starts one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nextstate.containers.pool import docker_available

# Task directories under fixtures/ hold their own test_outputs.py files: task data, not tests.
collect_ignore = ["fixtures"]

TERMINAL_IMAGE = "nextstate/terminal:latest"
ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", "runs", ".pytest_cache")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if docker_available():
        return
    if os.environ.get("CI"):
        raise pytest.UsageError("CI=true but no Docker engine answers: .ci/run must start dockerd")
    skip = pytest.mark.skip(reason="no Docker engine answers on this machine")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def docker_client():
    import docker
    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture(scope="session")
def terminal_image(docker_client) -> str:
    """The general terminal image, built (offline if need be) when missing."""
    from nextstate import containers
    return containers.ensure_image("terminal", client=docker_client)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """nextstate's wheel, built offline with the machine's setuptools (``--no-build-isolation``)
    from a copy of the source tree, so the checkout stays clean."""
    base = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, base / "src", ignore=IGNORE)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(base / "dist"), str(base / "src")], check=True, cwd=base)
    [built] = (base / "dist").glob("nextstate-*.whl")
    return built
