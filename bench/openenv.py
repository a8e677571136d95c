"""Benchmark: what serving a family over OpenEnv adds, against the same family in process.

``python -m bench.openenv [--family terminal] [--sessions 1,32] [--steps 30] [--json]``.
At each level ``C``, ``C`` sessions run at once, each one episode of ``--steps`` steps of the
same cheap command (``bash: true``) on procedural terminal tasks, two ways:

* ``inprocess`` -- ``C`` threads, each stepping its own env, leasing from one pool of ``C``
  sandboxes (what the trainer does);
* ``served`` -- ``python -m envs serve`` in a subprocess (its own pool of ``C``), and ``C``
  threads each driving one WebSocket session through openenv-core's ``GenericEnvClient``.

Per way and level: steps/s (all sessions together, resets excluded), step latency p50/p99 (ms),
and for ``served`` ``added_p50_ms``/``added_p99_ms``: the latency over ``inprocess``'s at the
same level. Client, server and sandboxes share this machine's CPU; figures are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

from nextstate.envs import env_class

ROOT = Path(__file__).resolve().parent.parent
ACTION = {"name": "bash", "arguments": {"command": "true"}}
TASKS = "procedural:0:8"


def _sessions(n: int, steps: int, episode: Callable[..., None]) -> dict[str, Any]:
    """``n`` sessions of ``episode(i, steps, latencies, started)`` at once (``started()``: after
    the reset, when all are ready); steps/s and latency."""
    lat: list[list[float]] = [[] for _ in range(n)]
    barrier = threading.Barrier(n)
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * n

    def one(i: int) -> None:
        def started() -> None:
            barrier.wait()
            spans[i] = (time.perf_counter(), 0.0)
        episode(i, steps, lat[i], started)
        spans[i] = (spans[i][0], time.perf_counter())

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    flat = np.array([x for xs in lat for x in xs]) * 1000
    return {"steps_per_s": round(len(flat) / wall, 1), "p50_ms": round(float(np.percentile(flat, 50)), 2),
            "p99_ms": round(float(np.percentile(flat, 99)), 2), "steps": int(len(flat))}


def timed(step: Callable[[Any], Any], k: int, lat: list[float]) -> None:
    """``k`` calls of ``step(ACTION)``, each one's seconds appended to ``lat``."""
    for _ in range(k):
        t = time.perf_counter()
        step(ACTION)
        lat.append(time.perf_counter() - t)


def inprocess(family: str, n: int, steps: int) -> dict[str, Any]:
    cls = env_class(family)
    tasks = cls(tasks=TASKS).tasks
    pool = cls.make_pool(n, backend="docker")
    pool.wait_ready(timeout=600)
    try:
        def episode(i: int, k: int, lat: list[float], started: Callable[[], None]) -> None:
            env = cls(tasks=tasks, pool=pool, max_steps=k + 1)
            env.reset(seed=i)
            started()
            timed(env.step, k, lat)
            env.close()
        return _sessions(n, steps, episode)
    finally:
        pool.close()


def served(family: str, n: int, steps: int) -> dict[str, Any]:
    from openenv.core import GenericEnvClient

    from nextstate.envs.openenv import wait_healthy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "nextstate.envs", "serve", family, "--port", str(port),
                             "--tasks", TASKS, "--max-sessions", str(n), "--max-steps", str(steps + 1),
                             "--backend", "docker"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        if not wait_healthy(url, 600, alive=lambda: proc.poll() is None):
            raise RuntimeError("the server did not come up")
        warm = [GenericEnvClient(url, message_timeout_s=600).sync() for _ in range(n)]
        for c in warm:            # every session leases once, so the pool is started before timing
            c.connect()
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda c: c.reset(seed=0), warm))
        for c in warm:
            c.close()

        def episode(i: int, k: int, lat: list[float], started: Callable[[], None]) -> None:
            with GenericEnvClient(url, message_timeout_s=600).sync() as c:
                c.reset(seed=i)
                started()
                timed(c.step, k, lat)
        return _sessions(n, steps, episode)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)


def run(family: str, levels: list[int], steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"family": family, "steps_per_session": steps, "cpus": os.cpu_count(),
                           "load_before": round(os.getloadavg()[0], 2), "levels": {}}
    for n in levels:
        local = inprocess(family, n, steps)
        remote = served(family, n, steps)
        remote["added_p50_ms"] = round(remote["p50_ms"] - local["p50_ms"], 2)
        remote["added_p99_ms"] = round(remote["p99_ms"] - local["p99_ms"], 2)
        out["levels"][str(n)] = {"inprocess": local, "served": remote}
    out["load_after"] = round(os.getloadavg()[0], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="terminal", help="a family whose tasks take procedural:0:8")
    ap.add_argument("--sessions", default="1,32", help="concurrency levels, comma-separated")
    ap.add_argument("--steps", type=int, default=30, help="steps per session")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    result = run(args.family, [int(x) for x in args.sessions.split(",")], args.steps)
    if args.json:
        print(json.dumps(result))
        return
    for n, ways in result["levels"].items():
        for way, r in ways.items():
            extra = f"  +p50 {r['added_p50_ms']} ms, +p99 {r['added_p99_ms']} ms" if way == "served" else ""
            print(f"{n:>3} sessions  {way:<9} {r['steps_per_s']:>8} steps/s  p50 {r['p50_ms']} ms  "
                  f"p99 {r['p99_ms']} ms{extra}")


if __name__ == "__main__":
    main()
