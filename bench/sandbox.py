"""Sandbox and pool costs, measured side by side in one run.

``python -m bench.sandbox --json`` prints one JSON object:

- ``step_ms_p50/p99``: ``true`` through a sandbox's persistent shell;
- ``docker_exec_ms_p50``: the same by plain ``docker exec`` (the CLI), and
  ``docker_exec_api_ms_p50`` through the engine API without the CLI;
- ``lease_ms_p50``: leasing from a warm pool; ``cold_start_ms_p50``: a plain
  ``docker run`` of the same image until the command has run;
- ``parallel`` sandboxes alive at once, all stepping back to back (a
  saturation test: ``parallel_steps_per_s``, ``parallel_step_ms_p99``), and
  each stepping once per ``--pace`` seconds as agents waiting on a model do
  (``paced_step_ms_p99``);
- ``parallel_cpu_ms_per_step``: the CPU per saturated step spent by this process (``client``),
  ``dockerd``, the pool's containerd shims and everything in its containers (``sandboxes``: their
  cgroups, i.e. the shells), with the load average around each saturated run;
- ``--transports exec fifo``: the pool's figures above once per shell transport
  (``SandboxSpec.transport``: the ``docker exec`` stream, or FIFOs around ``dockerd``), in
  ``by_transport`` (the first's also at the top level), each with ``transport_step_ms_p50`` (one
  sandbox of the pool, steps back to back). The pools are alive at once and step in turn,
  ``--repeats`` times, so load that drifts meanwhile falls on every transport alike;
- ``idle_rss_mb_per_sandbox``: resident memory of an idle sandbox's processes
  on the host (its container's processes and its containerd shim);
- ``reset``: what a pool pays per episode to hand out a clean sandbox, after an episode that
  left a few files and background processes: a verified reset (``reset="verified"``,
  :meth:`DockerSandbox.reset`) against a new sandbox and the removal of the old one
  (``reset="replace"``), each ``--resets`` times: wall ms (p50) and the machine's CPU
  seconds (all processes: Docker's included) per reset.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import docker

from bench import busy_cpu_s, cgroup_cpu_s, ms_percentile, report
from nextstate import containers
from nextstate.containers.pool import SandboxPool
from nextstate.containers.docker_sandbox import DockerSandbox
from nextstate.containers.protocol import SandboxSpec


def ms(seconds: list[float], q: float) -> float:
    return ms_percentile(seconds, q, digits=4)


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        out.append(cur)
        todo.extend(children.get(cur, []))
    return out


def sandbox_rss_mb(sb: DockerSandbox) -> float:
    """Host RSS of a container's processes plus its shim (shared pages counted in each)."""
    sb.container.reload()
    init = sb.container.attrs["State"]["Pid"]
    return sum(rss_kb(p) for p in descendants(init)) / 1024 + rss_kb(parent_pid(init)) / 1024


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (``state`` first)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` (a container's init: its containerd shim)."""
    return int(_stat(pid)[1])


# An episode's leftovers: files in the writable places, a full-ish /dev/shm, background processes.
EPISODE = ("mkdir -p /tmp/build ~/cache && seq 1000 > /tmp/build/out && touch /app/result ~/cache/f; "
           "head -c 8M /dev/zero > /dev/shm/blob; sleep 600 & nohup sleep 601 >/dev/null 2>&1 &")


def reset_costs(image: str, client: docker.DockerClient, n: int) -> dict[str, float | int | bool]:
    """Wall ms (p50) and machine CPU-s per clean sandbox, ``n`` times each: a verified reset of
    one sandbox vs a new sandbox and the removal of the used one."""
    labels = containers.owner_labels("bench-sandbox")
    sb = DockerSandbox(SandboxSpec(image=image), client, labels, baseline=True)
    walls, verified = [], True
    try:
        cpu0 = busy_cpu_s() or 0.0
        for _ in range(n):
            sb.run(EPISODE)
            t = time.perf_counter()
            verified = sb.reset().verified and verified
            walls.append(time.perf_counter() - t)
        reset_cpu = ((busy_cpu_s() or 0.0) - cpu0) / n
    finally:
        sb.close()
    fresh = []
    old = DockerSandbox(SandboxSpec(image=image), client, labels)
    cpu0 = busy_cpu_s() or 0.0
    try:
        for _ in range(n):
            old.run(EPISODE)
            t = time.perf_counter()
            old.close()
            old = DockerSandbox(SandboxSpec(image=image), client, labels)
            fresh.append(time.perf_counter() - t)
    finally:
        old.close()
    return {"verified_ms_p50": ms(walls, .5), "verified_cpu_s": round(reset_cpu, 3), "all_verified": verified,
            "replace_ms_p50": ms(fresh, .5), "replace_cpu_s": round(((busy_cpu_s() or 0.0) - cpu0) / n, 3),
            "times": n}


def _cgroup_cpu_s(init_pid: int) -> float:
    """CPU seconds the cgroup of the container whose init is ``init_pid`` has used (v1 or v2)."""
    for line in Path(f"/proc/{init_pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return cgroup_cpu_s(f"/sys/fs/cgroup/cpuacct{path}")
        if not controllers:
            return cgroup_cpu_s(f"/sys/fs/cgroup{path}")
    raise OSError(f"no cpu cgroup for pid {init_pid}")


def _proc_cpu_s(pid: int) -> float:
    """User and system CPU seconds ``pid`` has used."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_part(boxes: list[DockerSandbox]) -> dict[str, float]:
    """CPU seconds spent so far by this process (``client``), ``dockerd``, the containerd shims of
    ``boxes`` (``shim``) and everything in their containers (``sandboxes``: their cgroups)."""
    inits = [b._init_pid for b in boxes]
    shims = {parent_pid(p) for p in inits}
    dockerd = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
               and (p / "comm").exists() and (p / "comm").read_text().strip() == "dockerd"]
    return {"client": time.process_time(), "dockerd": sum(_proc_cpu_s(p) for p in dockerd),
            "shim": sum(_proc_cpu_s(p) for p in shims), "sandboxes": sum(_cgroup_cpu_s(p) for p in inits)}


def stepping(boxes: list[DockerSandbox], rounds: int, pace: float) -> tuple[list[float], float]:
    """Every sandbox steps ``rounds`` times, back to back (pace 0) or once per ``pace`` seconds
    from a random phase, as agents waiting on a model do: the latencies and the wall time."""
    lat: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(boxes) + 1)

    def worker(b, phase: float) -> None:
        mine = []
        barrier.wait()
        start = time.perf_counter() + phase
        for i in range(rounds):
            if pace:
                time.sleep(max(0.0, start + i * pace - time.perf_counter()))
            t = time.perf_counter()
            b.run("true")
            mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker, args=(b, random.random() * pace)) for b in boxes]
    for th in threads:
        th.start()
    barrier.wait()
    t = time.perf_counter()
    for th in threads:
        th.join()
    return lat, time.perf_counter() - t


def transport_figures(image: str, args: argparse.Namespace, say) -> dict[str, dict[str, Any]]:
    """A pool of ``args.parallel`` sandboxes per shell transport, all alive at once, stepped in
    turn (``--repeats`` times each, so the machine's load drifts over all of them alike): lease
    times, idle memory, one sandbox's steps, steps back to back (saturated, with the machine CPU
    per step by part) and paced. With several transports the pools' sandboxes have no disk limit
    (twice ``--parallel`` loop disks could be more than a host has)."""
    spec = {} if len(args.transports) == 1 else {"disk": None}
    figures: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        boxes: dict[str, list[DockerSandbox]] = {}
        for transport in args.transports:
            say(f"pool of {args.parallel} ({transport}): warming up ...")
            t0 = time.perf_counter()
            pool = stack.enter_context(SandboxPool(image, size=args.parallel, backend="docker", reset="reuse",
                                                   transport=transport, **spec))
            pool.wait_ready(1800)
            res = figures[transport] = {"transport": transport, "pool_fill_s": round(time.perf_counter() - t0, 1)}
            leases = []
            for _ in range(3):
                held = []
                for _ in range(args.parallel):
                    t = time.perf_counter()
                    held.append(pool.lease())
                    leases.append(time.perf_counter() - t)
                for b in held:
                    pool.release(b)
            res["lease_ms_p50"] = ms(leases, .5)
            boxes[transport] = [pool.lease() for _ in range(args.parallel)]
            res["idle_rss_mb_per_sandbox"] = round(statistics.mean(sandbox_rss_mb(b) for b in boxes[transport][:16]), 2)
        runs: dict[str, dict[str, Any]] = {t: {"single": [], "lat": [], "wall": 0.0, "paced": [], "load": [],
                                               "cpu": collections.Counter()} for t in args.transports}
        for rep in range(args.repeats):
            for transport in args.transports:
                mine, run = boxes[transport], runs[transport]
                say(f"{transport}, round {rep + 1}: one sandbox, then {args.parallel} back to back, then paced ...")
                run["single"] += timed(lambda: mine[0].run("true"), args.steps)
                cpu0, load0 = cpu_by_part(mine), os.getloadavg()[0]
                lat, wall = stepping(mine, args.parallel_rounds, 0.0)
                cpu1 = cpu_by_part(mine)
                run["lat"] += lat
                run["wall"] += wall
                run["cpu"].update({k: cpu1[k] - cpu0[k] for k in cpu0})
                run["load"] += [round(load0, 2), round(os.getloadavg()[0], 2)]
                run["paced"] += stepping(mine, args.parallel_rounds, args.pace)[0]
    for transport, run in runs.items():
        n = len(run["lat"])
        figures[transport].update(
            transport_step_ms_p50=ms(run["single"], .5), parallel=args.parallel, repeats=args.repeats,
            parallel_steps_per_s=round(n / run["wall"], 1),
            parallel_step_ms_p50=ms(run["lat"], .5), parallel_step_ms_p99=ms(run["lat"], .99),
            parallel_cpu_ms_per_step={k: round(v / n * 1000, 3) for k, v in run["cpu"].items()},
            parallel_load_avg=run["load"], paced_interval_s=args.pace,
            paced_step_ms_p50=ms(run["paced"], .5), paced_step_ms_p99=ms(run["paced"], .99))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--parallel", type=int, default=128)
    ap.add_argument("--steps", type=int, default=300, help="sequential steps timed")
    ap.add_argument("--parallel-rounds", type=int, default=20)
    ap.add_argument("--pace", type=float, default=0.5,
                    help="seconds between one sandbox's steps in the paced run")
    ap.add_argument("--image", default="nextstate/terminal:latest")
    ap.add_argument("--transports", nargs="+", default=["exec"], choices=["exec", "fifo"],
                    help="shell transports (SandboxSpec.transport) to run the pool's stepping with, one after the other")
    ap.add_argument("--repeats", type=int, default=1,
                    help="times each transport's pool steps (saturated, then paced), in turn with the others'")
    ap.add_argument("--resets", type=int, default=10, help="verified resets timed, and as many new sandboxes")
    args = ap.parse_args()
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    client = docker.from_env()
    image = containers.ensure_image("terminal", client=client) if args.image.startswith("nextstate/terminal") else args.image
    res: dict[str, float | int] = {}

    say("single sandbox: persistent shell vs docker exec ...")
    sb = DockerSandbox(SandboxSpec(image=image), client, containers.owner_labels("bench-sandbox"))
    try:
        timed(lambda: sb.run("true"), 20)
        steps = timed(lambda: sb.run("true"), args.steps)
        cli = timed(lambda: subprocess.run(["docker", "exec", sb.container.id, "true"], check=True), 40)
        api = timed(lambda: sb.container.exec_run(["true"]), 40)
    finally:
        sb.close()
    res.update(step_ms_p50=ms(steps, .5), step_ms_p99=ms(steps, .99),
               docker_exec_ms_p50=ms(cli, .5), docker_exec_api_ms_p50=ms(api, .5))

    say("verified reset vs a new sandbox ...")
    res["reset"] = reset_costs(image, client, args.resets)

    say("cold starts ...")
    cold = timed(lambda: client.containers.run(image, ["true"], remove=True, network_mode="none",
                                               labels=containers.owner_labels("bench-cold")), 10)
    res["cold_start_ms_p50"] = ms(cold, .5)

    by_transport = transport_figures(image, args, say)
    res.update(by_transport[args.transports[0]])
    if len(args.transports) > 1:
        res["by_transport"] = by_transport
    res["step_vs_docker_exec"] = round(res["docker_exec_ms_p50"] / res["step_ms_p50"], 1)
    res["lease_vs_cold_start"] = round(res["cold_start_ms_p50"] / max(res["lease_ms_p50"], 1e-4), 1)
    report(res, args.json)


if __name__ == "__main__":
    main()
