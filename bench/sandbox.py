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
- ``--transports exec fifo``: the pool's figures above once per shell transport
  (``SandboxSpec.transport``: the ``docker exec`` stream, or FIFOs around ``dockerd``), in
  ``by_transport`` (the first's also at the top level), each with ``transport_step_ms_p50`` (one
  sandbox, steps back to back) and ``parallel_cpu_ms_per_step``: the machine CPU per saturated
  step spent by this process (``client``), ``dockerd``, the containerd shims and the sandboxes'
  own processes (their shells), with the load average around it;
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
import os
import random
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import docker

from bench import busy_cpu_s, ms_percentile, report
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
    shim = int(Path(f"/proc/{init}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return sum(rss_kb(p) for p in descendants(init)) / 1024 + rss_kb(shim) / 1024


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


def cpu_by_part() -> dict[str, float]:
    """CPU seconds spent so far by this process (``client``), ``dockerd``, the containerd shims
    (``shim``) and the processes they started (``sandboxes``: the containers' shells)."""
    hz = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[str, int, float]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            text = (p / "stat").read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        stats[int(p.name)] = (text[text.index("(") + 1:text.rindex(")")], int(fields[1]),
                              (int(fields[11]) + int(fields[12])) / hz)
    parts = {"client": time.process_time(), "dockerd": 0.0, "shim": 0.0, "sandboxes": 0.0}
    shims = {pid for pid, (comm, _, _) in stats.items() if comm.startswith("containerd-shim")}

    def under_shim(pid: int) -> bool:
        for _ in range(64):
            pid = stats[pid][1] if pid in stats else 0
            if pid in shims:
                return True
            if pid <= 1:
                return False
        return False
    for pid, (comm, _, cpu) in stats.items():
        part = "dockerd" if comm == "dockerd" else "shim" if pid in shims else \
            "sandboxes" if under_shim(pid) else None
        if part:
            parts[part] += cpu
    return parts


def stepping_figures(image: str, transport: str, args: argparse.Namespace, say) -> dict[str, Any]:
    """A pool of ``args.parallel`` sandboxes whose shells use ``transport``: lease times, idle
    memory, steps back to back (saturated, with the machine CPU per step by part) and paced."""
    res: dict[str, Any] = {}
    say(f"pool of {args.parallel} ({transport}): warming up ...")
    t0 = time.perf_counter()
    with SandboxPool(image, size=args.parallel, backend="docker", reset="reuse", transport=transport) as pool:
        pool.wait_ready(1800)
        res["pool_fill_s"] = round(time.perf_counter() - t0, 1)
        leases = []
        for _ in range(3):
            boxes = []
            for _ in range(args.parallel):
                t = time.perf_counter()
                boxes.append(pool.lease())
                leases.append(time.perf_counter() - t)
            for b in boxes:
                pool.release(b)
        res["lease_ms_p50"] = ms(leases, .5)
        boxes = [pool.lease() for _ in range(args.parallel)]
        res["idle_rss_mb_per_sandbox"] = round(statistics.mean(sandbox_rss_mb(b) for b in boxes[:16]), 2)
        single = timed(lambda: boxes[0].run("true"), args.steps)

        def stepping(pace: float) -> tuple[list[float], float]:
            """Every sandbox steps ``parallel_rounds`` times, back to back (pace 0)
            or once per ``pace`` seconds from a random phase, as agents waiting
            on a model do."""
            lat: list[float] = []
            lock = threading.Lock()
            barrier = threading.Barrier(len(boxes) + 1)

            def worker(b, phase: float) -> None:
                mine = []
                barrier.wait()
                start = time.perf_counter() + phase
                for i in range(args.parallel_rounds):
                    if pace:
                        time.sleep(max(0.0, start + i * pace - time.perf_counter()))
                    t = time.perf_counter()
                    b.run("true")
                    mine.append(time.perf_counter() - t)
                with lock:
                    lat.extend(mine)

            threads = [threading.Thread(target=worker, args=(b, random.random() * pace))
                       for b in boxes]
            for th in threads:
                th.start()
            barrier.wait()
            t = time.perf_counter()
            for th in threads:
                th.join()
            return lat, time.perf_counter() - t

        say(f"{args.parallel} sandboxes stepping back to back ...")
        cpu0, load0 = cpu_by_part(), os.getloadavg()[0]
        lat, wall = stepping(0.0)
        cpu1, load1 = cpu_by_part(), os.getloadavg()[0]
        say(f"{args.parallel} sandboxes stepping once per {args.pace}s each ...")
        paced, _ = stepping(args.pace)
        for b in boxes:
            pool.release(b)
    res.update(transport=transport, transport_step_ms_p50=ms(single, .5),
               parallel=args.parallel, parallel_steps_per_s=round(len(lat) / wall, 1),
               parallel_step_ms_p50=ms(lat, .5), parallel_step_ms_p99=ms(lat, .99),
               parallel_cpu_ms_per_step={k: round((cpu1[k] - cpu0[k]) / len(lat) * 1000, 3) for k in cpu0},
               parallel_load_avg=[round(load0, 2), round(load1, 2)],
               paced_interval_s=args.pace, paced_step_ms_p50=ms(paced, .5),
               paced_step_ms_p99=ms(paced, .99))
    return res


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

    by_transport = {t: stepping_figures(image, t, args, say) for t in args.transports}
    res.update(by_transport[args.transports[0]])
    if len(args.transports) > 1:
        res["by_transport"] = by_transport
    res["step_vs_docker_exec"] = round(res["docker_exec_ms_p50"] / res["step_ms_p50"], 1)
    res["lease_vs_cold_start"] = round(res["cold_start_ms_p50"] / max(res["lease_ms_p50"], 1e-4), 1)
    report(res, args.json)


if __name__ == "__main__":
    main()
