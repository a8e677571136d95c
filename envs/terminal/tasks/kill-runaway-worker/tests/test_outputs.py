"""Checks that exactly the busy worker (id 2) was killed and the others still run."""
from pathlib import Path

RUN = Path("/app/workers/run")


def alive(pid: int) -> bool:
    """True when the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def worker_pid(worker_id: int) -> int:
    return int((RUN / f"worker-{worker_id}.pid").read_text().strip())


def test_busy_worker_killed_and_recorded():
    busy = worker_pid(2)
    assert not alive(busy)
    assert int(Path("/app/killed.pid").read_text().strip()) == busy


def test_healthy_workers_running():
    for worker_id in (1, 3):
        pid = worker_pid(worker_id)
        assert alive(pid), f"worker {worker_id} (pid {pid}) is not running"
        args = cmdline(pid)
        assert any(a.endswith("worker.py") for a in args) and args[-2] == str(worker_id)


def test_no_busy_worker_left():
    busy = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and alive(int(proc.name)):
            try:
                args = cmdline(int(proc.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
            if any(a.endswith("worker.py") for a in args) and "2" in args:
                busy.append(proc.name)
    assert busy == []
    assert (RUN / "worker-2.pid").is_file()
