"""The Docker engine side of the runtime: the labels every project container carries, and
whether a container's owner still lives (what :mod:`containers.reap` and
:mod:`containers.disks` decide removal by)."""

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


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive(labels: dict[str, str]) -> bool | None:
    """True/False for a container owned on this host, None when owned elsewhere."""
    if labels.get(HOST_LABEL) != socket.gethostname():
        return None
    try:
        return pid_alive(int(labels.get(PID_LABEL, "")))
    except ValueError:
        return False


def doomed(labels: dict[str, str], *, all_hosts: bool, run_id: str | None) -> bool:
    """Whether `reap` should remove a container with these labels."""
    alive = owner_alive(labels)
    if alive is None and not all_hosts:
        return False
    if run_id is not None:
        return labels.get(RUN_LABEL) == run_id
    return alive is None or not alive
