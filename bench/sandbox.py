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
  (``paced_step_ms_p99``); ``parallel_step_ms_max``: the worst saturated step;
  ``parallel_slowest_1pct``: where the slowest 1% of saturated steps waited, before the shell ran
  the command (``before_ms``: the step gate's queue, then the shells' turn) or after (``after_ms``:
  this process's turn);
- ``parallel_cpu_ms_per_step``: the CPU per saturated step spent by this process (``client``),
  ``dockerd``, the pool's containerd shims and everything in its containers (``sandboxes``: their
  cgroups, i.e. the shells), with the load average around each saturated run;
- ``--gates default off``: the same per step gate (:mod:`containers.gate`), keyed
  ``"<transport>, gate <setting>"`` in ``by_transport``, each with ``gate`` (its places);
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
from nextstate.containers.gate import StepGate
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


def stepping(boxes: list[DockerSandbox], rounds: int, pace: float) -> tuple[list[float], list[tuple[float, float]], float]:
    """Every sandbox steps ``rounds`` times, back to back (pace 0) or once per ``pace`` seconds
    from a random phase, as agents waiting on a model do: the latencies, each split in two, and
    the wall time. The step is ``echo $EPOCHREALTIME`` (a builtin, like ``true``): the shell's
    clock when it ran the command splits a step into the part before (the frame written, the shell
    woken, the command read) and the part after (the markers written, this process woken, the
    output read). The engine is local, so both clocks are this kernel's."""
    lat: list[float] = []
    split: list[tuple[float, float]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(boxes) + 1)

    def worker(b, phase: float) -> None:
        mine, halves = [], []
        barrier.wait()
        start = time.perf_counter() + phase
        for i in range(rounds):
            if pace:
                time.sleep(max(0.0, start + i * pace - time.perf_counter()))
            t, sent = time.perf_counter(), time.time()
            out = b.run("echo $EPOCHREALTIME").stdout
            mine.append(time.perf_counter() - t)
            ran = float(out)
            halves.append((ran - sent, time.time() - ran))
        with lock:
            lat.extend(mine)
            split.extend(halves)

    threads = [threading.Thread(target=worker, args=(b, random.random() * pace)) for b in boxes]
    for th in threads:
        th.start()
    barrier.wait()
    t = time.perf_counter()
    for th in threads:
        th.join()
    return lat, split, time.perf_counter() - t


def slowest_split(lat: list[float], split: list[tuple[float, float]]) -> dict[str, float]:
    """Where the slowest 1% of steps waited: the mean ms before the shell ran the command and
    after it."""
    worst = sorted(range(len(lat)), key=lat.__getitem__)[-max(1, len(lat) // 100):]
    return {"before_ms": round(statistics.mean(split[i][0] for i in worst) * 1000, 1),
            "after_ms": round(statistics.mean(split[i][1] for i in worst) * 1000, 1)}


def _gate_for(setting: str, boxes: list[DockerSandbox]) -> StepGate | None:
    """The gate a ``--gates`` setting gives a pool's sandboxes: ``default`` (what a sandbox gets:
    its engine's gate, or none under ``NEXTSTATE_STEP_GATE=0``), ``off``, or a number of places."""
    if setting == "default":
        return boxes[0].gate
    return None if setting == "off" else StepGate(int(setting))


def transport_figures(image: str, args: argparse.Namespace, say) -> dict[str, dict[str, Any]]:
    """A pool of ``args.parallel`` sandboxes per shell transport, all alive at once, stepped in
    turn (``--repeats`` times each, so the machine's load drifts over all of them alike): lease
    times, idle memory, one sandbox's steps, steps back to back (saturated, with the machine CPU
    per step by part) and paced. With several ``--gates`` each pool steps once per gate setting, in
    turn; the figures are keyed ``"<transport>, gate <setting>"``. With several transports the
    pools' sandboxes have no disk limit (twice ``--parallel`` loop disks could be more than a host
    has)."""
    spec = {} if len(args.transports) == 1 else {"disk": None}
    labels = {(t, g): t if len(args.gates) == 1 else f"{t}, gate {g}" for t in args.transports for g in args.gates}
    figures: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        boxes: dict[str, list[DockerSandbox]] = {}
        gates: dict[tuple[str, str], StepGate | None] = {}
        for transport in args.transports:
            say(f"pool of {args.parallel} ({transport}): warming up ...")
            t0 = time.perf_counter()
            pool = stack.enter_context(SandboxPool(image, size=args.parallel, backend="docker", reset="reuse",
                                                   transport=transport, **spec))
            pool.wait_ready(1800)
            res = {"transport": transport, "pool_fill_s": round(time.perf_counter() - t0, 1)}
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
            for g in args.gates:
                gates[transport, g] = gate = _gate_for(g, boxes[transport])
                figures[labels[transport, g]] = dict(res, gate=gate.size if gate else None)
        runs: dict[tuple[str, str], dict[str, Any]] = {
            key: {"single": [], "lat": [], "split": [], "wall": 0.0, "paced": [], "load": [],
                  "cpu": collections.Counter()} for key in labels}
        for rep in range(args.repeats):
            for (transport, g), run in runs.items():
                mine = boxes[transport]
                for b in mine:
                    b.gate = gates[transport, g]
                say(f"{labels[transport, g]}, round {rep + 1}: one sandbox, then {args.parallel} back to back, "
                    "then paced ...")
                run["single"] += timed(lambda: mine[0].run("true"), args.steps)
                cpu0, load0 = cpu_by_part(mine), os.getloadavg()[0]
                lat, split, wall = stepping(mine, args.parallel_rounds, 0.0)
                cpu1 = cpu_by_part(mine)
                run["lat"] += lat
                run["split"] += split
                run["wall"] += wall
                run["cpu"].update({k: cpu1[k] - cpu0[k] for k in cpu0})
                run["load"] += [round(load0, 2), round(os.getloadavg()[0], 2)]
                run["paced"] += stepping(mine, args.parallel_rounds, args.pace)[0]
    for key, run in runs.items():
        n = len(run["lat"])
        figures[labels[key]].update(
            transport_step_ms_p50=ms(run["single"], .5), parallel=args.parallel, repeats=args.repeats,
            parallel_steps_per_s=round(n / run["wall"], 1),
            parallel_step_ms_p50=ms(run["lat"], .5), parallel_step_ms_p99=ms(run["lat"], .99),
            parallel_step_ms_max=ms(run["lat"], 1.0),
            parallel_slowest_1pct=slowest_split(run["lat"], run["split"]),
            parallel_cpu_ms_per_step={k: round(v / n * 1000, 3) for k, v in run["cpu"].items()},
            parallel_load_avg=run["load"], paced_interval_s=args.pace,
            paced_step_ms_p50=ms(run["paced"], .5), paced_step_ms_p99=ms(run["paced"], .99))
    return figures


def _gate_setting(text: str) -> str:
    if text in ("default", "off") or text.isdigit() and int(text) > 0:
        return text
    raise argparse.ArgumentTypeError(f"a gate is default, off or a number of places, not {text!r}")


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
    ap.add_argument("--gates", nargs="+", default=["default"], type=_gate_setting,
                    help="step gates (containers.gate) to step each pool with, in turn: default (the "
                         "engine's, as a sandbox gets it), off, or a number of places")
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
    res.update(next(iter(by_transport.values())))
    if len(by_transport) > 1:
        res["by_transport"] = by_transport
    res["step_vs_docker_exec"] = round(res["docker_exec_ms_p50"] / res["step_ms_p50"], 1)
    res["lease_vs_cold_start"] = round(res["cold_start_ms_p50"] / max(res["lease_ms_p50"], 1e-4), 1)
    report(res, args.json)


if __name__ == "__main__":
    main()
