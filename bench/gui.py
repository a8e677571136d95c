"""Desktop (GUI env) costs on this machine.

``python -m bench.gui --json`` prints one JSON object:

- ``screenshot_ms_p50/p99``: one screenshot, controller to host (PNG bytes);
- ``step_ms_p50/p99``: one ``env.step`` of a click: the action, the settle
  wait (``settle_s``), the screenshot and the accessibility tree;
- ``reset_ms_p50``: ``env.reset`` on a built-in task with a sandbox leased from
  a warm pool (the desktop and Chromium start inside the reset);
- ``parallel``: for 1, 2, 4, ... desktops side by side, each stepping in its
  own thread: ``step_ms_p99`` and ``steps_per_s``; ``max_parallel_under_1s``
  is the largest count whose p99 step stayed under one second (the search
  stops at the first count that fails).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from bench import ms_percentile, report
from nextstate.envs.gui import GUIEnv
from nextstate.containers.pool import SandboxPool

IMAGE = "nextstate/desktop:latest"
TASK = "counter"


def click_action(env: GUIEnv) -> dict[str, Any]:
    """A harmless click on the page (the heading)."""
    box = env.desktop.client.locate("h1")
    return {"action_type": "CLICK", "x": box["cx"], "y": box["cy"]}


def episode_steps(env: GUIEnv, steps: int, out: list[float]) -> None:
    """Resets on the benchmark task, then times ``steps`` clicks."""
    env.reset(options={"task": TASK})
    action = click_action(env)
    for _ in range(steps):
        t = time.perf_counter()
        env.step(action)
        out.append(time.perf_counter() - t)


def run(steps: int, max_parallel: int, settle: float) -> dict[str, Any]:
    res: dict[str, Any] = {"settle_s": settle}
    with SandboxPool(IMAGE, size=2, memory="2g", pids_limit=1024) as pool:
        pool.wait_ready()
        env = GUIEnv(pool=pool, settle=settle, max_steps=steps + 5)
        resets = []
        for _ in range(3):
            t = time.perf_counter()
            env.reset(options={"task": TASK})
            resets.append(time.perf_counter() - t)
            time.sleep(3)  # let the pool replace the used desktop
        res["reset_ms_p50"] = round(statistics.median(resets) * 1000, 1)
        shots = []
        for _ in range(steps):
            t = time.perf_counter()
            env.desktop.screenshot()
            shots.append(time.perf_counter() - t)
        res["screenshot_ms_p50"], res["screenshot_ms_p99"] = ms_percentile(shots, 0.5), ms_percentile(shots, 0.99)
        step_times: list[float] = []
        episode_steps(env, steps, step_times)
        res["step_ms_p50"], res["step_ms_p99"] = ms_percentile(step_times, 0.5), ms_percentile(step_times, 0.99)
        env.close()
    res["parallel"], res["max_parallel_under_1s"] = [], 0
    n = 1
    while n <= max_parallel:
        with SandboxPool(IMAGE, size=n, memory="2g", pids_limit=1024) as pool:
            pool.wait_ready()
            envs = [GUIEnv(pool=pool, settle=settle, max_steps=steps + 5) for _ in range(n)]
            times: list[list[float]] = [[] for _ in range(n)]
            threads = [threading.Thread(target=episode_steps, args=(e, steps, t)) for e, t in zip(envs, times)]
            t0 = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            wall = time.perf_counter() - t0
            for e in envs:
                e.close()
        flat = [x for t in times for x in t]
        row = {"desktops": n, "step_ms_p50": ms_percentile(flat, 0.5), "step_ms_p99": ms_percentile(flat, 0.99),
               "steps_per_s": round(len(flat) / sum(flat) * n, 2), "wall_s_with_resets": round(wall, 1)}
        res["parallel"].append(row)
        if row["step_ms_p99"] >= 1000:
            break
        res["max_parallel_under_1s"] = n
        n *= 2
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    ap.add_argument("--max-parallel", type=int, default=8)
    ap.add_argument("--settle", type=float, default=0.3, help="seconds between an action and its screenshot")
    ap.add_argument("--json", action="store_true", help="print JSON only")
    args = ap.parse_args()
    res = run(args.steps, args.max_parallel, args.settle)
    report(res, args.json)


if __name__ == "__main__":
    main()
