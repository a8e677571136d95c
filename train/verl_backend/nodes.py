"""A run's clean-up on every node of its Ray cluster: its leftover processes and sandboxes.

veRL spreads agent-loop workers over the nodes, and each worker starts its sandboxes on its
own node's Docker engine (``DOCKER_HOST`` in the environment ``ray start`` ran in on that
node, else the local socket). So what the launcher does on one machine happens on every
node: before the run, the sandboxes of dead runs on that node are removed
(:func:`containers.reap`); after it, the run's processes still alive there are stopped
(the leftover scan: processes whose environment carries the run id) and then its sandboxes
removed. On a cluster (``RAY_ADDRESS``) :func:`clean_cluster` runs :func:`clean_node` as a
Ray task pinned to each alive node; a one-machine run calls :func:`clean_node` itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable

from nextstate.train.verl_backend import RUN_ENV


def run_processes(run_id: str) -> list[int]:
    """Pids (other than this one) on this host whose environment carries the run id."""
    return processes_with(f"{RUN_ENV}={run_id}")


def processes_with(variable: str) -> list[int]:
    """Pids (other than this one) on this host whose environment holds ``NAME=value``."""
    marker = variable.encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int(entry.name) != os.getpid() and marker in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def stop_leftovers(run_id: str, grace: float = 30.0) -> list[int]:
    """Wait up to ``grace`` seconds for the run's processes on this host to exit (after
    ``ray.shutdown()`` they are on their way out); kill those still there. Returns their pids."""
    deadline = time.monotonic() + grace
    while (left := run_processes(run_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


def clean_node(run_id: str | None, grace: float | None = 30.0) -> dict[str, Any]:
    """This node's part of the clean-up, on its Docker engine.

    Without ``run_id`` (before a run): remove the sandboxes of dead runs. With it (after the
    run): stop the run's processes left here (:func:`stop_leftovers`; ``grace=None`` leaves
    them alone), then remove every sandbox of the run. Never raises: an engine that does not
    answer is reported under ``error``.
    """
    from nextstate import containers

    stopped = stop_leftovers(run_id, grace) if run_id and grace is not None else []
    done: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "stopped": stopped,
                            "engine": os.environ.get("DOCKER_HOST") or "local socket", "removed": 0, "error": None}
    try:
        done["removed"] = containers.reap(run_id=run_id)
    except Exception as e:  # noqa: BLE001 - no engine here (or it died): nothing to remove from it
        done["error"] = f"{type(e).__name__}: {e}"
    return done


def on_every_node(fn: Callable[..., Any], *args: Any, timeout: float = 600.0) -> dict[str, Any]:
    """``fn(*args)`` once on every alive node of the connected Ray cluster (a zero-CPU task pinned
    to each node), keyed by node id."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    refs = {node["NodeID"]: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
            .remote(*args) for node in ray.nodes() if node["Alive"]}
    return dict(zip(refs, ray.get(list(refs.values()), timeout=timeout)))


def clean_cluster(run_id: str | None, *, address: str, env_vars: dict[str, str],
                  grace: float | None = 30.0) -> dict[str, Any]:
    """:func:`clean_node` on every node of the Ray cluster at ``address``, as a short job of its
    own (``env_vars``: what its workers need to import this package; never the run id, or the
    leftover scan would stop the clean-up itself). Uses the connection when one is open."""
    import ray

    connected = ray.is_initialized()
    if not connected:
        ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=False)
    try:
        return on_every_node(clean_node, run_id, grace, timeout=(grace or 0.0) + 600.0)
    finally:
        if not connected:
            ray.shutdown()
