"""Benchmarks: each prints its figures (one JSON object with ``--json``); none is a timed test."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux ``/proc/stat``), else None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")   # less idle and iowait


def cgroup_cpu_s(directory: str | Path) -> float:
    """CPU seconds the cgroup at ``directory`` has used: cgroup v1's ``cpuacct.usage``, else v2's
    ``cpu.stat`` (``usage_usec``). Raises OSError, ValueError or IndexError where it has neither."""
    directory = Path(directory)
    try:
        return int((directory / "cpuacct.usage").read_text()) / 1e9
    except FileNotFoundError:
        stat = (directory / "cpu.stat").read_text()
        return int(stat.split("usage_usec", 1)[1].split()[0]) / 1e6


def containers_cpu_s() -> float | None:
    """CPU seconds every container of the local Docker engine has spent, removed ones included
    (their parent cgroup's count: ``docker`` under cgroup v1's ``cpuacct`` or v2 with the cgroupfs
    driver), else None (the systemd driver puts each container under ``system.slice``)."""
    for parent in ("cpuacct/docker", "cpu,cpuacct/docker", "docker"):
        try:
            return cgroup_cpu_s(f"/sys/fs/cgroup/{parent}")
        except (OSError, ValueError, IndexError):
            pass
    return None


def ms_percentile(seconds: list[float], q: float, digits: int = 3) -> float:
    """The ``q`` quantile (nearest rank) of durations in seconds, in milliseconds."""
    xs = sorted(seconds)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, digits)


def report(figures: dict[str, Any], as_json: bool) -> None:
    """Print the figures: one JSON object, or one aligned line per figure."""
    if as_json:
        print(json.dumps(figures))
        return
    width = max(map(len, figures), default=0)
    for key, value in figures.items():
        print(f"{key:>{width}}: {value}")


def finish(name: str, figures: Callable[[], dict[str, Any]], as_json: bool,
           errors: tuple[type[BaseException], ...] = (FileNotFoundError,), *, model: str | None = None) -> int:
    """A bench's exit: ``figures()`` printed by :func:`report` (0), or one of ``errors`` (or a
    ``model`` that cannot be loaded here, checked first) said in one line on stderr as
    ``name: why`` (1)."""
    from nextstate.train.config import ConfigError
    from nextstate.train.wiring import check_model

    try:
        if model is not None:
            check_model(model)
        result = figures()
    except (ConfigError, *errors) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    report(result, as_json)
    return 0


def outdir_runs(policy: Any, tasks: str, plan_of: Any, parallel: int = 4) -> list[list[Any]]:
    """The ``train.sft.Example``s (each with its action and next state) of ``plan_of(task)`` played on
    every ``outdir`` task of ``tasks``, in real sandboxes, one list per episode."""
    from nextstate.agents.chat import ChatConfig
    from nextstate.envs.terminal import TerminalEnv, outdir
    from nextstate.train.sft import oracle_runs

    pool = TerminalEnv.make_pool(parallel)
    try:
        return oracle_runs(lambda: TerminalEnv(tasks=tasks, pool=pool), outdir.load(tasks), policy, ChatConfig(),
                           parallel, plan_of=plan_of)
    finally:
        pool.close()
