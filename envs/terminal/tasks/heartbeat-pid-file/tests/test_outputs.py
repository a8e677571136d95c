"""Checks the heartbeat process named by the pid file and the log it writes."""
import os
import re
import time
from pathlib import Path

LOG = Path("/app/heartbeat.log")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def test_script_executable():
    assert os.access("/app/heartbeat.sh", os.X_OK)


def test_pid_file_names_running_heartbeat():
    pid = int(Path("/app/heartbeat.pid").read_text().strip())
    assert alive(pid), f"process {pid} is not running"
    assert "heartbeat.sh" in cmdline(pid)


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0


def test_single_instance():
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    running = [p for p in pids if alive(p) and "heartbeat.sh" in cmdline(p)
               and not cmdline(p).startswith(("python", "pytest"))]
    # the script's own subshells ($(date ...)) share its command line for a moment: count roots only
    roots = [p for p in running if parent(p) not in running]
    assert len(roots) == 1, running


def test_log_keeps_growing():
    before = LOG.read_text().splitlines()
    time.sleep(2.5)
    after = LOG.read_text().splitlines()
    assert len(after) >= len(before) + 2
    last = after[-1]
    match = re.fullmatch(r"beat (\d+)", last)
    assert match, last
    assert abs(int(match.group(1)) - time.time()) < 5
