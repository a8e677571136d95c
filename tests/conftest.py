"""Shared fixtures: a Docker engine and the terminal image.

Docker tests are skipped on a machine without an engine, except in CI
(``CI=true``), where a missing engine is a failure: `.ci/run` starts one.
"""

from __future__ import annotations

import os

import pytest

from nextstate.containers.pool import docker_available

# Task directories under fixtures/ hold their own test_outputs.py files: task data, not tests.
collect_ignore = ["fixtures"]

TERMINAL_IMAGE = "nextstate/terminal:latest"


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
