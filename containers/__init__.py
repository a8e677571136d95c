"""Sandbox images and container ownership for nextstate.

Every container the project starts carries :func:`owner_labels`, so that
:func:`reap` can find and remove the ones whose owner process died.
Images live in ``containers/<name>/`` (a ``Dockerfile`` plus an optional
``packages.txt`` of Debian packages); :func:`ensure_image` builds them on
demand and :func:`build_image` builds any other Dockerfile directory on top
of them.  ``python -m containers --help`` is the command-line face of this.
"""

from __future__ import annotations

import os
import socket

import docker
import requests

PROJECT = "nextstate"
PROJECT_LABEL = "io.nextstate.project"
RUN_LABEL = "io.nextstate.run-id"
PID_LABEL = "io.nextstate.owner-pid"
HOST_LABEL = "io.nextstate.owner-host"
ROLE_LABEL = "io.nextstate.role"


def owner_labels(run_id: str, role: str = "sandbox") -> dict[str, str]:
    """Labels that tie a container to this process, host and run."""
    return {
        PROJECT_LABEL: PROJECT,
        RUN_LABEL: run_id,
        PID_LABEL: str(os.getpid()),
        HOST_LABEL: socket.gethostname(),
        ROLE_LABEL: role,
    }


def connect(host: str | None = None) -> docker.DockerClient:
    """A client for `host` (default: DOCKER_HOST or the local socket) that answers ping."""
    where = host or os.environ.get("DOCKER_HOST") or "the local socket"
    try:
        client = docker.DockerClient(base_url=host) if host else docker.from_env()
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise RuntimeError(
            f"Docker engine not reachable at {where}: start dockerd or set DOCKER_HOST ({exc})"
        ) from exc
    return client


from .build import build_image, ensure_image  # noqa: E402
from .reap import project_containers, reap  # noqa: E402

__all__ = [
    "PROJECT_LABEL", "RUN_LABEL", "PID_LABEL", "HOST_LABEL", "ROLE_LABEL",
    "owner_labels", "connect", "project_containers", "reap", "ensure_image", "build_image",
]
