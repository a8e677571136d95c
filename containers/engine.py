"""The Docker engine side of the runtime: the labels every project container carries,
whether a container's owner still lives (what :mod:`containers.reap` and
:mod:`containers.disks` decide removal by), and how a container is removed."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import docker
import requests

log = logging.getLogger(__name__)

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


_REMOVING: dict[str, threading.Lock] = {}   # engine URL -> held while this process removes a container there
_UNANSWERED: dict[str, float] = {}           # engine URL -> when a removal there last went unanswered
UNANSWERED_PAUSE = 300.0                      # seconds no removal is sent to such an engine


def remove_container(client: docker.DockerClient, container_id: str) -> None:
    """Force-remove a container and its anonymous volumes, one removal at a time per engine in
    this process. dockerd 20.10 (Debian bookworm's docker.io) can deadlock for good when two
    containers leave a network at once (moby/moby#46661, fixed in 23.0): removals side by side
    made that likely, and gain little (32 containers here: 1.2 s one at a time, 0.7 s sixteen at
    a time). After a removal goes unanswered (the client's timeout), none is sent to that engine
    for ``UNANSWERED_PAUSE`` s: each would wait out the whole timeout, the containers stay for
    :func:`containers.reap`, and one warning says so. Raises what docker raises (``NotFound``,
    ``APIError``, ``requests``' ``Timeout``/``ConnectionError``), and ``Timeout`` at once
    during the pause."""
    url = str(client.api.base_url)
    with _REMOVING.setdefault(url, threading.Lock()):
        since = _UNANSWERED.get(url)
        if since is not None and time.monotonic() - since < UNANSWERED_PAUSE:
            raise requests.exceptions.Timeout(f"the engine at {url} left a removal unanswered "
                                              f"{time.monotonic() - since:.0f} s ago")
        try:
            client.api.remove_container(container_id, force=True, v=True)
        except requests.exceptions.Timeout:
            _UNANSWERED[url] = time.monotonic()
            log.warning("the Docker engine at %s did not answer the removal of container %s in time: no "
                        "removal is sent there for %.0f s, and what is left goes with `python -m "
                        "containers reap`. dockerd 20.10 can deadlock removing containers "
                        "(moby/moby#46661): restart it if this recurs", url, container_id[:12],
                        UNANSWERED_PAUSE)
            raise
        _UNANSWERED.pop(url, None)


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
