"""The per-sandbox disk limit on a real Docker engine (issue 15).

On overlay2 over ext4 (this machine and CI) the engine has no storage quota, so each
container's writable layer lives on a loop-mounted ext4 disk of the limit's size
(containers/disks.py): the bound is the kernel's, whatever the path or the write speed.
The host's free space is no measure on a machine others write to at the same time, so
what the host holds is read from the disk image's allocated blocks.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nextstate import containers
from nextstate.containers import disks
from nextstate.envs.pool import SandboxPool
from nextstate.containers.docker_sandbox import DockerSandbox
from nextstate.containers.protocol import SandboxSpec

pytestmark = pytest.mark.docker
LIMIT = 64 * 2 ** 20
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def box(docker_client, terminal_image):
    if not os.environ.get("CI") and (os.geteuid() != 0 or not Path("/dev/loop-control").exists()):
        pytest.skip("strict disks need root and loop devices (CI has both)")
    sb = DockerSandbox(SandboxSpec(image=terminal_image, user="root", disk="64m"), docker_client,
                       containers.owner_labels("pytest-disk"))
    yield sb
    sb.close()


def held_on_host(sb) -> int:
    """Bytes the host's disk holds for the sandbox's writable layer."""
    return os.stat(sb._disk.folder / "disk.img").st_blocks * 512


def loops_backed_by(image: Path) -> str:
    return subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout


def gone(path: Path, timeout: float = 5.0) -> bool:
    """Whether ``path`` is gone and no loop device is backed by it (the kernel detaches a
    loop device a moment after its last unmount)."""
    deadline = time.monotonic() + timeout
    while path.exists() or loops_backed_by(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_write_past_the_limit_is_enospc_and_the_host_keeps_only_the_limit(box):
    assert box._disk is not None, "this machine has root and loop devices: the disk must be strict"
    r = box.run("dd if=/dev/zero of=/app/big bs=1M count=1024", timeout=60)
    assert r.exit_code != 0 and "No space left on device" in r.stderr
    assert "[ENOSPC: the sandbox's disk limit of 64 MiB is used up" in r.stderr
    assert int(box.run("stat -c %s /app/big").stdout) <= LIMIT
    assert held_on_host(box) <= LIMIT
    # any other path shares the same limit: the image's /usr/local, root's home, /tmp
    for path in ("/usr/local/more", "/root/more", "/tmp/more"):
        r = box.run(f"head -c 1000000 /dev/zero > {path}")
        assert r.exit_code != 0 and "No space left on device" in r.stderr, path
    assert held_on_host(box) <= LIMIT
    # the episode goes on: deleting frees the space
    assert box.run("rm -f /app/big && echo freed").stdout == "freed\n"
    r = box.run("head -c 10000000 /dev/zero > /app/small && stat -c %s /app/small")
    assert (r.stdout, r.exit_code) == ("10000000\n", 0) and "ENOSPC" not in r.stderr


def test_running_out_of_inodes_says_so(box):
    r = box.run("mkdir /app/many && cd /app/many && seq 40000 | xargs touch", timeout=120)
    assert "No space left on device" in r.stderr
    assert "files (inodes) is used up" in r.stderr.splitlines()[-1], r.stderr[-500:]
    assert "files (inodes)" not in box.run("rm -rf /app/many && touch /app/one").stderr

def test_the_image_stays_visible_and_writable_as_the_agent(docker_client, terminal_image):
    sb = DockerSandbox(SandboxSpec(image=terminal_image, disk="64m"), docker_client,
                       containers.owner_labels("pytest-disk"))
    try:
        r = sb.run("id -un; stat -c '%U %a' /app /tmp; test -x /usr/bin/python3 && echo image; "
                   "echo a > /app/a && echo b > /tmp/b && echo c > ~/c && cat /app/a /tmp/b ~/c; "
                   "df -B1M --output=size / | tail -1")
        lines = r.stdout.split()
        assert lines[:6] == ["agent", "agent", "755", "root", "1777", "image"], r.output
        assert lines[6:9] == ["a", "b", "c"] and int(lines[9]) <= 64, r.output
    finally:
        sb.close()


def test_close_frees_the_mount_the_loop_device_and_the_image(box):
    box.run("head -c 1000000 /dev/zero > /app/f")
    folder = box._disk.folder
    image = folder / "disk.img"
    assert loops_backed_by(image)
    box.close()
    assert gone(image) and not folder.exists()


def test_without_loop_devices_one_warning_and_the_watchdog(docker_client, terminal_image, monkeypatch, caplog):
    """A host that can't mount a disk (here: pretend not to be root) still starts sandboxes,
    with one warning, and the watchdog still stops a write and reports ENOSPC."""
    monkeypatch.setattr(DockerSandbox, "_loop_support", {})
    monkeypatch.setattr(disks.os, "geteuid", lambda: 1000)
    boxes = []
    try:
        with caplog.at_level(logging.WARNING, logger="nextstate.containers.docker_sandbox"):
            for _ in range(2):
                boxes.append(DockerSandbox(SandboxSpec(image=terminal_image, disk="64m"), docker_client,
                                           containers.owner_labels("pytest-disk")))
        warned = [r for r in caplog.records if "watchdog" in r.getMessage()]
        assert len(warned) == 1 and "needs root" in warned[0].getMessage()
        assert all(sb._disk is None for sb in boxes)
        r = boxes[0].run("dd if=/dev/zero of=/app/big bs=1M count=1024 2>&1; echo done", timeout=60)
        assert "ENOSPC" in r.stderr and r.exit_code != 0
    finally:
        for sb in boxes:
            sb.close()


def test_a_pool_run_and_a_sigkilled_owner_leave_no_disk(terminal_image, docker_client):
    def leftovers(run_id: str) -> list[Path]:
        return [f for f in disks.DISK_ROOT.glob("*/owner.json")
                if json.loads(f.read_text()).get(containers.RUN_LABEL) == run_id]

    with SandboxPool(terminal_image, size=2, backend="docker", run_id="pytest-disk-pool", disk="64m") as pool:
        for _ in range(3):
            with pool.leased(timeout=60) as sb:
                assert sb.run("echo x > /app/x && cat /app/x").stdout == "x\n"
        images = [f.parent / "disk.img" for f in leftovers("pytest-disk-pool")]
        assert images
    assert leftovers("pytest-disk-pool") == [] and all(gone(i) for i in images)

    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from nextstate.envs.pool import SandboxPool
        pool = SandboxPool({terminal_image!r}, size=2, backend="docker", run_id="pytest-disk-kill", disk="64m")
        pool.wait_ready(120)
        print("ready", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        images = [f.parent / "disk.img" for f in leftovers("pytest-disk-kill")]
        assert len(images) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    containers.reap(docker_client)
    assert containers.project_containers(docker_client, "pytest-disk-kill") == []
    assert leftovers("pytest-disk-kill") == [] and all(gone(i) for i in images)


def test_reap_keeps_a_live_owners_disk_and_removes_a_half_made_one(tmp_path, monkeypatch):
    monkeypatch.setattr(disks, "DISK_ROOT", tmp_path)
    live = tmp_path / "live"
    live.mkdir()
    (live / "owner.json").write_text(json.dumps(containers.owner_labels("pytest-disk-reap")))
    half = tmp_path / "half"
    half.mkdir()
    os.utime(half, (time.time() - 120, time.time() - 120))   # a process killed while making it
    assert disks.reap_disks() == 1
    assert live.exists() and not half.exists()
    assert disks.reap_disks(run_id="pytest-disk-reap") == 1 and not live.exists()
