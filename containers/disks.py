"""Size-limited writable layers: a strict disk limit for containers on overlay2 over ext4.

Docker's overlay2 driver keeps everything a container writes in the layer's *upper*
directory on the host's disk, with no limit unless that disk is XFS with project quotas
(``--storage-opt size=``). :func:`attach` moves a created, not yet started, container's
upper and work directories onto an ext4 file system of its own: a sparse image file of
the limit's size, loop-mounted on the host. A write past the limit then fails with
``ENOSPC`` inside the container, whatever the path, and the host loses at most the
image's size. (The file system's own metadata takes about 3% of a 2 GiB disk and 10% of
a 64 MiB one, so a little less than the limit is usable.)

It needs root, a local engine with the overlay2 driver, ``mkfs.ext4`` and loop devices;
where one is missing :func:`attach` raises :class:`DiskUnavailable` saying which, and
callers fall back to a watchdog.

Each disk is a folder ``DISK_ROOT/<container id>`` holding ``disk.img``, its mount point
``mnt`` and ``owner.json`` (the container's owner labels), so :func:`reap_disks` can
remove the disks of dead runs even after a SIGKILL, as :func:`containers.reap` does for
their containers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from nextstate.containers.engine import doomed

log = logging.getLogger(__name__)

DISK_ROOT = Path(os.environ.get("NEXTSTATE_DISK_DIR", "/var/lib/nextstate/disks"))
_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


class DiskUnavailable(RuntimeError):
    """This host cannot give a container a loop-mounted disk (the message says why)."""


def _run(*cmd: str) -> None:
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": _SBIN_PATH})
    except subprocess.CalledProcessError as e:
        raise DiskUnavailable(f"{cmd[0]} failed: {(e.stderr or e.stdout).strip()[:200]}") from None
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DiskUnavailable(f"{cmd[0]} failed: {e}") from None


def _mounted(path: Path) -> bool:
    target = str(path).replace(" ", "\\040")
    try:
        return any(line.split()[4] == target for line in open("/proc/self/mountinfo"))
    except OSError:
        return False


class LoopDisk:
    """A container's writable layer on a loop-mounted ext4 file system of ``size`` bytes."""

    def __init__(self, folder: Path, size: int):
        self.folder, self.size = folder, size
        self.mnt = folder / "mnt"

    def room(self) -> tuple[int, int, int]:
        """Bytes the container can still write, inodes (files) it can still create, and the file
        system's total inodes (one ``statvfs``: looked at after every command)."""
        st = os.statvfs(self.mnt)
        return st.f_bavail * st.f_frsize, st.f_favail, st.f_files

    def release(self) -> bool:
        """Unmount (which frees the loop device) and delete the image. False when the file
        system is still in use (its container not removed yet): then nothing is deleted."""
        if _mounted(self.mnt):
            try:
                _run("umount", str(self.mnt))
            except DiskUnavailable as e:
                log.debug("unmounting %s: %s", self.mnt, e)
                return False
        shutil.rmtree(self.folder, ignore_errors=True)
        return True


def attach(container_id: str, graph_driver: dict, size: int, labels: dict[str, str]) -> LoopDisk:
    """Put a created (not started) container's writable layer on a disk of ``size`` bytes.

    ``graph_driver`` is the container's ``GraphDriver`` as the engine inspects it.
    Raises :class:`DiskUnavailable` (and leaves nothing behind) where this host can't.
    """
    if os.geteuid() != 0:
        raise DiskUnavailable("mounting a disk needs root")
    data = graph_driver.get("Data") or {}
    upper, work = Path(data.get("UpperDir") or "-"), Path(data.get("WorkDir") or "-")
    if graph_driver.get("Name") != "overlay2" or not upper.is_dir() or not work.is_dir():
        raise DiskUnavailable(f"the engine's storage driver is {graph_driver.get('Name')!r} "
                              "with no upper directory on this host (a remote engine?), not overlay2")
    if not shutil.which("mkfs.ext4", path=_SBIN_PATH):
        raise DiskUnavailable("mkfs.ext4 is not installed (Debian: e2fsprogs)")
    folder = DISK_ROOT / container_id
    try:
        folder.mkdir(parents=True)
    except OSError as e:
        raise DiskUnavailable(f"cannot make {folder}: {e.strerror or e}") from None
    disk = LoopDisk(folder, size)
    swapped: list[tuple[Path, Path]] = []
    try:
        (folder / "owner.json").write_text(json.dumps(labels))
        disk.mnt.mkdir()
        image = folder / "disk.img"
        with open(image, "wb") as f:
            f.truncate(size)   # sparse: the host pays for what is written
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-L", "nextstate",
             "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0", str(image))
        _run("mount", "-o", "loop,noinit_itable", str(image), str(disk.mnt))
        (disk.mnt / "lost+found").rmdir()
        for old in (upper, work):
            new = disk.mnt / old.name
            new.mkdir(mode=0o700)
            st = old.stat()
            os.chown(new, st.st_uid, st.st_gid)
            os.chmod(new, st.st_mode & 0o7777)
            if old == upper and any(old.iterdir()):   # what the engine wrote at create (a workdir)
                _run("cp", "-a", f"{old}/.", f"{new}/")
            aside = old.with_name(old.name + ".nextstate-old")
            old.rename(aside)
            swapped.append((old, aside))
            old.symlink_to(new)
        for _, aside in swapped:
            shutil.rmtree(aside)
        return disk
    except BaseException as e:
        for old, aside in swapped:   # give the engine its own directories back
            if aside.exists():
                if old.is_symlink():
                    old.unlink()
                aside.rename(old)
        disk.release()
        if isinstance(e, OSError):
            raise DiskUnavailable(f"{e.strerror or e}: {e.filename or ''}") from None
        raise


def reap_disks(*, all_hosts: bool = False, run_id: str | None = None) -> int:
    """Remove leftover disks; return how many. The choice is :func:`containers.reap`'s:
    default, those whose owner died on this host; with ``run_id``, that run's. A disk whose
    container still uses it is kept (reap the container first)."""
    if not DISK_ROOT.is_dir():
        return 0
    removed = 0
    for folder in DISK_ROOT.iterdir():
        try:
            labels = dict(json.loads((folder / "owner.json").read_text()))
        except (OSError, ValueError, TypeError):   # half made: by a process killed then, or making it now
            try:
                if time.time() - folder.stat().st_mtime < 60:
                    continue
            except OSError:
                continue   # removed meanwhile
            labels = {}
        if labels and not doomed(labels, all_hosts=all_hosts, run_id=run_id):
            continue
        if LoopDisk(folder, 0).release():
            removed += 1
    return removed
