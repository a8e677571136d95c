"""A sandbox shell's streams through FIFOs, around ``dockerd``'s stream relay (``transport="fifo"``,
and ``"auto"``, the default, where the container is seen to get them: :meth:`FifoShell.unseen_by`).

With the exec stream (``transport="exec"``) every byte of a command and of its output is copied
twice on the host: by ``containerd-shim`` between the shell's pipes and its FIFOs, and by
``dockerd`` between those FIFOs and the client's socket. Here the shell reads and writes
three FIFOs itself: they sit in a host directory of their own (``SHELL_ROOT/<pid>.<run>.<id>``,
``NEXTSTATE_SHELL_DIR``; its parent is ``0700``), bind-mounted **read-only** at ``MOUNT`` in
the container, so nothing can be written there but the FIFOs' streams (a FIFO on a read-only
mount stays writable; no regular file can be made). The shell is still started by one
``docker exec`` (detached), so the engine knows its pid and exit code as before.
:class:`FifoShell` is a :class:`~containers.shell_transport.ShellTransport`, as
:class:`~containers.shell_transport.ExecStream` is.

Only for a local engine (the FIFOs must be on the engine's host). Every FIFO is opened
non-blocking; a stream at end of file is one whose every writer closed it (a FIFO nobody has
opened for writing yet does not poll readable, so a shell still starting is not taken for one
that ended). :func:`reap_shell_dirs` removes the directories of dead owners, as
:func:`containers.reap` removes their containers.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import select
import shutil
import uuid
from pathlib import Path
from typing import Any

from nextstate.containers.engine import pid_alive
from nextstate.containers.protocol import SandboxSpec
from nextstate.containers.shell_transport import ShellTransport

log = logging.getLogger(__name__)

def _shell_root() -> Path:
    """``NEXTSTATE_SHELL_DIR``; else /run/nextstate/shells for root, and for another user its
    ``XDG_RUNTIME_DIR`` (a rootless engine's own), where there is one."""
    if "NEXTSTATE_SHELL_DIR" in os.environ:
        return Path(os.environ["NEXTSTATE_SHELL_DIR"])
    if os.geteuid() != 0 and os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "nextstate" / "shells"
    return Path("/run/nextstate/shells")


SHELL_ROOT = _shell_root()
MOUNT = "/.nextstate-shell"   # where the container sees its FIFOs (read-only)
STDOUT, STDERR = 1, 2
PIPE_SIZE = 1 << 20   # bytes each output FIFO holds unread


class FifoUnavailable(RuntimeError):
    """This host cannot give a sandbox FIFOs (the message says why)."""


class FifoShell(ShellTransport):
    """The host side of one sandbox's FIFOs: make them, open them, move bytes, remove them."""

    def __init__(self, run_id: str):
        try:
            SHELL_ROOT.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.dir = SHELL_ROOT / f"{os.getpid()}.{run_id.replace('/', '_')}.{uuid.uuid4().hex[:12]}"
            self.dir.mkdir(mode=0o755)
            os.chmod(self.dir, 0o755)   # past the umask: the container's user must look in
        except OSError as e:
            raise FifoUnavailable(f"cannot make a directory for FIFOs under {SHELL_ROOT}: {e}") from None
        self.generation = 0
        self._in: int | None = None
        self._out: dict[int, int] = {}   # stream -> fd, while that stream has writers
        self._poller = select.poll()      # those fds

    def bind(self) -> dict[str, dict[str, str]]:
        """The read-only bind mount the container is created with."""
        return {str(self.dir): {"bind": MOUNT, "mode": "ro"}}

    def unseen_by(self, pid: int) -> str | None:
        """Why the container whose process ``pid`` is (a pid of this host) does not see this
        directory at ``MOUNT``, or cannot be looked into; None when it sees it. An engine on a
        unix socket may still be elsewhere: in a VM, or the host of a container given its socket."""
        elsewhere = "(is the engine on another host or in a VM?)"
        try:
            here = os.stat(self.dir)
            inside = os.stat(f"/proc/{pid}/root{MOUNT}")
        except FileNotFoundError:
            return f"the container has no process of this host with the FIFOs mounted {elsewhere}"
        except OSError as e:
            return f"cannot look into the container: {e.strerror}"
        if (inside.st_dev, inside.st_ino) != (here.st_dev, here.st_ino):
            return f"the container's mount is another directory {elsewhere}"
        return None

    def open(self, api: Any, container_id: str, spec: SandboxSpec) -> str:
        """New FIFOs, and a new shell on them started by a detached ``docker exec``; returns its id.
        On failure the host's ends are closed."""
        try:
            ex = api.exec_create(container_id, self._new_fifos(), user=spec.user, workdir=spec.workdir,
                                 environment=spec.env)
            api.exec_start(ex["Id"], detach=True)
        except Exception:   # docker.errors.APIError, connection errors, OSError (the FIFOs)
            self.close()
            raise
        return ex["Id"]

    def _new_fifos(self) -> list[str]:
        """New FIFOs for a new shell (the old ones are unlinked), opened on the host; returns the
        command the ``docker exec`` starts that shell with."""
        self.close()
        old, self.generation = self.generation, self.generation + 1
        names = {s: f"{s}.{self.generation}" for s in ("in", "out", "err")}
        for name in names.values():
            path = self.dir / name
            os.mkfifo(path, 0o666)
            os.chmod(path, 0o666)   # the container's user may be any uid
        # O_RDWR: the writer end never blocks to open and the shell never sees EOF on its stdin.
        self._in = os.open(self.dir / names["in"], os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._out = {stream: os.open(self.dir / names[n], os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                     for stream, n in ((STDOUT, "out"), (STDERR, "err"))}
        self._poller = select.poll()
        for fd in self._out.values():   # as roomy as the engine's relay: a background flood between commands
            self._poller.register(fd, select.POLLIN)
            try:                          # does not block its writer
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            except OSError:
                pass   # above /proc/sys/fs/pipe-max-size: the default 64 KiB
        for kind in ("in", "out", "err"):
            (self.dir / f"{kind}.{old}").unlink(missing_ok=True)
        inside = {k: f"{MOUNT}/{n}" for k, n in names.items()}
        return ["bash", "--noprofile", "--norc", "-c",
                f"exec bash --noprofile --norc <{inside['in']} >{inside['out']} 2>{inside['err']}"]

    @property
    def is_open(self) -> bool:
        """Whether the host's ends are open (and were not closed under this object)."""
        try:
            return self._in is not None and os.fstat(self._in) is not None
        except OSError:
            return False

    def send(self, data: bytes, timeout: float = 30.0) -> None:
        """Write all of ``data`` to the shell's stdin; ``OSError`` when it takes no byte for ``timeout`` s."""
        if self._in is None:
            raise OSError(errno.EBADF, "the shell's FIFOs are closed")
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._in, view):]
                continue
            except BlockingIOError:
                pass
            if not select.select([], [self._in], [], timeout)[1]:
                raise OSError(errno.ETIMEDOUT, f"the shell took no input for {timeout:g}s")

    def recv(self, timeout: float) -> list[tuple[int, bytes]] | None:
        """Chunks ``(stream, bytes)`` read within ``timeout``; None once both streams ended."""
        if not self._out:
            return None
        ready = {fd for fd, _ in self._poller.poll(max(0.0, timeout) * 1000)}
        chunks = []
        for stream, fd in list(self._out.items()):
            if fd not in ready:
                continue
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:   # closed under us (EBADF): as good as ended
                data = b""
            if data:
                chunks.append((stream, data))
            else:   # every writer closed it
                self._poller.unregister(fd)
                try:
                    os.close(fd)
                except OSError:
                    pass
                del self._out[stream]
        return chunks if chunks or self._out else None

    def close(self) -> None:
        """Close the host's ends (the shell's next write gets EPIPE). Safe to call twice."""
        for fd in [self._in, *self._out.values()]:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._in, self._out = None, {}

    def remove(self) -> None:
        """Close, and delete the directory (after its container is gone)."""
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def reap_shell_dirs(run_id: str | None = None) -> int:
    """Remove FIFO directories whose owning process is gone (with ``run_id``: every one of that
    run); returns how many. Directories are named ``<pid>.<run id>.<id>``."""
    removed = 0
    try:
        dirs = list(SHELL_ROOT.iterdir())
    except OSError:
        return 0
    for d in dirs:
        pid, _, rest = d.name.partition(".")
        run = rest.rpartition(".")[0]
        mine = run == run_id.replace("/", "_") if run_id is not None else not (pid.isdigit() and pid_alive(int(pid)))
        if mine:
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
    return removed

