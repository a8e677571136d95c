"""The local backend, for machines without Docker: a :class:`LocalSandbox` is a ``bash`` on
this machine in a scratch directory, inside bubblewrap when it is installed. It isolates far
less than a container; it speaks the protocol of :mod:`containers.protocol`.
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from nextstate.containers.protocol import _KILL_TREE, STDERR, STDOUT, Sandbox, SandboxSpec


class LocalSandbox(Sandbox):
    """A shell on this machine in a scratch directory: for hosts without Docker.

    It isolates much less than a container: inside bubblewrap (when installed)
    the file system outside the scratch directory is read-only and, unless the
    spec asks for network, the network is unshared; without bubblewrap it is
    only a separate directory and process group.
    """

    backend = "local"

    def __init__(self, spec: SandboxSpec):
        super().__init__(spec)
        self._disk_limit = None   # not enforced: the scratch directory is on the host's disk
        self.root = Path(tempfile.mkdtemp(prefix="nextstate-sbx-"))
        self.bwrap = shutil.which("bwrap")
        self._proc: subprocess.Popen | None = None
        self._sel: selectors.BaseSelector | None = None
        self._start_shell()

    def _open_shell(self) -> None:
        cmd = ["bash", "--noprofile", "--norc"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root),
               "LANG": "C.UTF-8", **self.spec.env}
        if self.bwrap:
            cmd = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                   "--tmpfs", "/tmp", "--bind", str(self.root), str(self.root),
                   "--die-with-parent", "--chdir", str(self.root),
                   *([] if self.spec.network else ["--unshare-net"]), *cmd]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, cwd=self.root, env=env,
                                      start_new_session=True)
        self._sel = selectors.DefaultSelector()
        for f, stream in ((self._proc.stdout, STDOUT), (self._proc.stderr, STDERR)):
            os.set_blocking(f.fileno(), False)
            self._sel.register(f, selectors.EVENT_READ, stream)

    def _send(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def _recv(self, timeout: float) -> list[tuple[int, bytes]] | None:
        assert self._sel is not None
        chunks = []
        for key, _ in self._sel.select(timeout):
            data = os.read(key.fd, 1 << 16)
            if not data:
                return None
            chunks.append((key.data, data))
        return chunks

    def _close_shell(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, 9)
            except ProcessLookupError:
                pass
            self._proc.wait()
            for f in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
                if f:
                    f.close()
            self._proc = None
        if self._sel is not None:
            self._sel.close()
            self._sel = None

    def _kill_tree(self, pid: int) -> None:
        subprocess.run(["bash", "-c", _KILL_TREE, "kill", str(pid)], check=False)

    def _shell_exit_code(self) -> int | None:
        return None if self._proc is None else self._proc.wait()

    def is_alive(self) -> bool:
        return not self.closed and self._proc is not None and self._proc.poll() is None

    def _dispose(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def warn_local_backend(asked: bool = False) -> None:
    """The one warning users get when sandboxes run on the local backend: ``asked`` for it by name,
    or fallen back to because no Docker engine answers."""
    warnings.warn(
        ("The local backend: " if asked else "Docker is not available: ") + "sandboxes run as local shells"
        + (" inside bubblewrap" if shutil.which("bwrap") else " WITHOUT isolation (install bubblewrap)")
        + ". They isolate far less than containers; do not run untrusted agents this way.",
        RuntimeWarning, stacklevel=3)
