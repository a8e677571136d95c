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

from nextstate.containers.protocol import _KILL_TREE, STDERR, STDOUT, Sandbox, SandboxError, SandboxSpec

_BWRAP_TRIES = 3


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
        self._use_gate("local", os.cpu_count() or 1)
        self._disk_limit = None   # not enforced: the scratch directory is on the host's disk
        self.root = Path(tempfile.mkdtemp(prefix="nextstate-sbx-"))
        self.bwrap = shutil.which("bwrap")
        self._proc: subprocess.Popen | None = None
        self._sel: selectors.BaseSelector | None = None
        try:
            self._start_shell()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _open_shell(self) -> None:
        cmd = ["bash", "--noprofile", "--norc"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root),
               "LANG": "C.UTF-8", **self.spec.env}
        if not self.bwrap:
            return self._popen(cmd, env)
        for attempt in range(_BWRAP_TRIES):
            info_r, info_w = os.pipe()
            try:
                self._popen([self.bwrap, "--info-fd", str(info_w), "--ro-bind", "/", "/", "--dev", "/dev",
                             "--proc", "/proc", "--tmpfs", "/tmp", "--bind", str(self.root), str(self.root),
                             "--die-with-parent", "--chdir", str(self.root),
                             *([] if self.spec.network else ["--unshare-net"]), *cmd], env, pass_fds=(info_w,))
            finally:
                os.close(info_w)
            with os.fdopen(info_r, "rb") as info:
                if info.read():   # bubblewrap writes its child's pid once the sandbox is set up
                    return
            why = self._bwrap_error()
            # binding / recursively can meet a mount that goes away meanwhile (a container engine's
            # overlay): bubblewrap fails with "Unable to apply mount flags"; a second try binds what is left
            if "mount" not in why or attempt == _BWRAP_TRIES - 1:
                raise SandboxError(f"bubblewrap could not start the sandbox: {why}")

    def _popen(self, cmd: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> None:
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, cwd=self.root, env=env,
                                      start_new_session=True, pass_fds=pass_fds)
        self._sel = selectors.DefaultSelector()
        for f, stream in ((self._proc.stdout, STDOUT), (self._proc.stderr, STDERR)):
            os.set_blocking(f.fileno(), False)
            self._sel.register(f, selectors.EVENT_READ, stream)

    def _bwrap_error(self) -> str:
        """The last line bubblewrap wrote before it exited without starting the shell (the shell is closed)."""
        assert self._proc is not None and self._proc.stderr is not None
        self._proc.wait()
        os.set_blocking(self._proc.stderr.fileno(), True)
        lines = self._proc.stderr.read().decode(errors="replace").strip().splitlines()
        self._close_shell()
        return lines[-1] if lines else "it exited without a message"

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
