"""Removal of project containers whose owner is gone."""

from __future__ import annotations

import logging
import time
from typing import Any

import docker
import requests

from nextstate.containers.disks import reap_disks
from nextstate.containers.engine import PROJECT, PROJECT_LABEL, RUN_LABEL, connect, doomed, remove_container
from nextstate.containers.fifo_shell import reap_shell_dirs

log = logging.getLogger(__name__)


def project_containers(client: docker.DockerClient, run_id: str | None = None, *,
                       running: bool = False) -> list[dict[str, Any]]:
    """The project's containers (of one run, with `run_id`), stopped ones too unless
    `running`, as the engine lists them: one low-level call, so a container removed
    meanwhile is simply absent (the high-level ``containers.list`` inspects each one in
    turn and raises ``NotFound`` for it)."""
    label = f"{RUN_LABEL}={run_id}" if run_id else f"{PROJECT_LABEL}={PROJECT}"
    filters: dict[str, Any] = {"label": label}
    if running:
        filters["status"] = "running"
    return client.api.containers(all=not running, filters=filters)


def _wait_removed(client: docker.DockerClient, container_id: str, timeout: float = 30.0) -> None:
    """Wait (bounded) until a container another caller is removing is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return
        time.sleep(0.1)


def reap(
    client: docker.DockerClient | None = None,
    *,
    all_hosts: bool = False,
    run_id: str | None = None,
    disks: bool = True,
) -> int:
    """Force-remove leftover project containers; return how many were removed.

    Default: those on this host whose owner pid is dead.  With `run_id`: every
    container of that run on this host, whatever its owner's state.
    `all_hosts` widens either choice to containers owned by other hosts
    (whose owners cannot be checked, so all of them match the liveness test).
    With `disks`, the same choice of their loop-mounted disks (:mod:`containers.disks`)
    goes too, after the containers that used them, and so do the directories of their shells'
    FIFOs (:mod:`containers.fifo_shell`; on this host only, by their owner's pid or `run_id`).

    An engine that does not answer a removal in time (a hung or overloaded ``dockerd``) does not
    fail the caller: that container is left for the next reap, with a warning, and so are the
    disks this time (one of them may still be in use by it).
    """
    client = client or connect()
    removed = 0
    pending = []
    for info in project_containers(client):
        if not doomed(info.get("Labels") or {}, all_hosts=all_hosts, run_id=run_id):
            continue
        try:
            remove_container(client, info["Id"])
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # removal already in progress elsewhere: its disk goes once it ends
                _wait_removed(client, info["Id"])
                continue
            raise
        except (requests.exceptions.Timeout, requests.exceptions.ConnectionError) as exc:
            pending.append(info["Id"][:12])
            if len(pending) == 1:
                log.warning("reap: the engine did not remove container %s (%s); what it does not "
                            "remove is left for the next reap", info["Id"][:12], exc)
            continue
        removed += 1
    if disks and not pending:
        reap_disks(all_hosts=all_hosts, run_id=run_id)
        reap_shell_dirs(run_id)
    return removed
