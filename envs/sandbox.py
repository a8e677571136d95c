"""Sandboxes: one isolated machine an episode acts in.

A :class:`Sandbox` behaves like a terminal someone types into: one long-lived
``bash`` per sandbox receives every command, so the working directory,
environment variables and shell state persist between :meth:`Sandbox.run`
calls, and a command costs a round trip through a pipe instead of a
``docker exec`` (about 100x cheaper).

Two backends share the same wire protocol:

* :class:`DockerSandbox` -- a container with no network, a non-root user, all
  capabilities dropped, ``no-new-privileges`` and pids/memory/CPU limits. Its
  shell is one ``docker exec`` whose multiplexed stdout/stderr socket stays open.
* :class:`LocalSandbox` -- a ``bash`` on this machine in a scratch directory,
  inside bubblewrap when it is installed. It isolates far less; it exists for
  machines without Docker.

Protocol: each command's bytes follow a line that reads exactly that many
bytes (``read -N``, no fork) and ``eval``-s them with stdin from ``/dev/null``
(so a heredoc or an unbalanced quote cannot wedge the shell);
afterwards the shell prints an end marker with the exit code on stdout and a
second marker on stderr. Output beyond ``output_limit`` bytes per stream is
dropped (the flood is still drained) and a visible marker says how much. On
timeout the command's whole process tree is killed; if the shell itself does
not come back (a builtin busy loop), the shell is restarted and the result
says that its state was reset.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import selectors
import shlex
import shutil
import socket
import struct
import subprocess
import tarfile
import tempfile
import time
import uuid
import warnings
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "nextstate/terminal:latest"
STDOUT, STDERR = 1, 2

# Kills every descendant of the shell (pid $1) but not the shell itself:
# stop the tree first so nothing forks while we walk it, then kill it.
_KILL_TREE = r"""
tree() { for c in $(pgrep -P "$1" 2>/dev/null); do tree "$c"; echo "$c"; done; }
pids=$(tree "$1"); [ -n "$pids" ] && kill -STOP $pids 2>/dev/null
pids="$pids $(tree "$1")"; [ -n "${pids// }" ] && kill -KILL $pids 2>/dev/null
exit 0
"""


class SandboxError(RuntimeError):
    """The sandbox itself failed (its container died, its shell is gone).

    Environments turn this into an aborted step: it is an infrastructure
    fault, never something the agent did wrong.
    """


class SandboxConfigError(SandboxError):
    """The sandbox cannot start as specified (e.g. its image has no such user); retrying will not help."""


# Docker's default capabilities but NET_RAW: what a root user needs to act as root
# (write others' files, chown, apt-get's privilege drop); other users get none.
ROOT_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
             "NET_BIND_SERVICE", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP"]


@dataclass
class SandboxSpec:
    """How to make a sandbox. Safe by default: no network, no root, limits on.

    ``user`` is a name or uid in the image; ``root`` (or ``0``) keeps Docker's
    default capabilities, any other user has none.
    """

    image: str = DEFAULT_IMAGE
    network: bool = False
    user: str = "agent"
    workdir: str = "/app"
    env: dict[str, str] = field(default_factory=dict)
    memory: str = "1g"
    cpus: float = 1.0
    pids_limit: int = 256
    output_limit: int = 64 * 1024
    default_timeout: float = 30.0
    command: list[str] = field(default_factory=lambda: ["sleep", "infinity"])


@dataclass
class CommandResult:
    """What one command did."""

    stdout: str
    stderr: str
    exit_code: int
    elapsed: float
    timed_out: bool = False
    truncated: bool = False
    shell_restarted: bool = False

    @property
    def output(self) -> str:
        """stdout and stderr together, as a terminal would show them."""
        if self.stdout and self.stderr:
            return self.stdout.rstrip("\n") + "\n" + self.stderr
        return self.stdout or self.stderr

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Capped:
    """Keeps the first ``limit`` bytes of a stream and a short tail for the end marker."""

    def __init__(self, limit: int | None, marker: bytes):
        self.limit, self.marker = limit, marker
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        if self.limit is None or len(self.head) < self.limit:
            room = len(data) if self.limit is None else self.limit - len(self.head)
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            keep = len(self.marker) + 64
            if len(self.tail) > keep:
                self.dropped += len(self.tail) - keep
                del self.tail[:-keep]

    def done(self) -> bool:
        return self.marker in self.head or self.marker in self.tail

    def text(self) -> tuple[str, int | None, bool]:
        """Decoded text before the marker, the exit code after it, truncated?"""
        buf = bytes(self.head + self.tail)
        i = buf.rfind(self.marker)
        rc = None
        if i >= 0:
            rest = buf[i + len(self.marker):]
            end = rest.find(b"\x1e")
            try:
                rc = int(rest[:end]) if end > 0 else None
            except ValueError:
                rc = None
            buf = buf[:i]
        body = buf[: self.limit] if self.limit is not None else buf
        extra = len(buf) - len(body) + self.dropped
        text = body.decode("utf-8", errors="replace")
        if extra > 0:
            text += f"\n[... output truncated: {extra} more bytes not shown ...]\n"
        return text, rc, extra > 0


class Sandbox(ABC):
    """One isolated machine with a persistent shell.

    Subclasses provide the transport (:meth:`_open_shell`, :meth:`_send`,
    :meth:`_recv`, :meth:`_close_shell`, :meth:`_kill_tree`); the protocol,
    output capping, timeouts and file transfer live here once.
    """

    backend: str = "abstract"

    def __init__(self, spec: SandboxSpec):
        self.spec = spec
        self.id = uuid.uuid4().hex[:12]
        self._shell_pid: int | None = None
        self.closed = False

    # -- transport, per backend ------------------------------------------------
    @abstractmethod
    def _open_shell(self) -> None: ...

    @abstractmethod
    def _send(self, data: bytes) -> None: ...

    @abstractmethod
    def _recv(self, timeout: float) -> list[tuple[int, bytes]] | None:
        """Chunks ``(stream, bytes)`` read within ``timeout``; ``None`` at EOF."""

    @abstractmethod
    def _close_shell(self) -> None: ...

    @abstractmethod
    def _kill_tree(self, pid: int) -> None:
        """Kill every descendant of process ``pid`` (the shell), not ``pid`` itself."""

    @abstractmethod
    def _shell_exit_code(self) -> int | None:
        """The shell's exit status if it ended while the sandbox lives on, else None."""

    @abstractmethod
    def is_alive(self) -> bool: ...

    @abstractmethod
    def _dispose(self) -> None:
        """Remove what the backend made (the container, the scratch directory)."""

    def close(self) -> None:
        """End the shell and remove the sandbox. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        self._close_shell()
        self._dispose()

    # -- the protocol ----------------------------------------------------------
    def _start_shell(self) -> None:
        self._open_shell()
        res = self._exchange("echo $$", timeout=20, limit=None)
        try:
            self._shell_pid = int(res.stdout.strip())
        except ValueError as e:
            raise SandboxError(f"sandbox shell did not start: {res.output[:500]!r}") from e

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run ``command`` in the persistent shell, as if typed into a terminal.

        Never raises for anything the command does (errors, floods, hangs):
        those come back in the result. Raises :class:`SandboxError` only when
        the sandbox itself is gone.
        """
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        timeout = self.spec.default_timeout if timeout is None else timeout
        return self._exchange(command, timeout, self.spec.output_limit)

    def _exchange(self, command: str, timeout: float, limit: int | None) -> CommandResult:
        nonce = uuid.uuid4().hex[:10]
        out_m, err_m = f"\n\x1e{nonce}:".encode(), f"\x1e{nonce}!".encode()
        body = command.encode()
        # `read -N` takes the command's exact bytes off the stream: no fork needed,
        # so a sandbox whose pids are exhausted still answers.
        line = (
            f"IFS= LC_ALL=C read -r -d '' -N {len(body)} __ns_cmd; eval \"$__ns_cmd\" </dev/null; "
            f"printf '\\n\\036{nonce}:%d\\036' $?; printf '\\036{nonce}!' >&2\n"
        ).encode() + body
        out, err = _Capped(limit, out_m), _Capped(limit, err_m)
        start = time.monotonic()
        deadline = start + timeout
        timed_out = restarted = False
        rc_exit: int | None = None
        try:
            self._send(line)
        except OSError as e:
            raise self._gone(e) from e
        next_kill = float("inf")
        while not (out.done() and err.done()):
            now = time.monotonic()
            if now >= deadline:
                if timed_out:  # the shell itself is stuck (a builtin loop): restart it
                    self._restart_shell()
                    restarted = True
                    break
                timed_out = True
                deadline, next_kill = now + 3.0, now
            if now >= next_kill and self._shell_pid:
                # Kill the command's processes; repeat while the rest of its line runs.
                self._kill_tree(self._shell_pid)
                next_kill = time.monotonic() + 0.25
            chunks = self._recv(max(0.001, min(deadline, next_kill) - now, 0) if timed_out
                                else min(deadline - now, 1.0))
            if chunks is None:  # the shell ended: `exit` typed, or the sandbox died
                code = self._shell_exit_code()
                if code is None:
                    raise self._gone(None)
                self._close_shell()
                self._start_shell()
                restarted, rc_exit = True, code
                break
            for stream, data in chunks:
                (out if stream == STDOUT else err).feed(data)
        elapsed = time.monotonic() - start
        stdout, rc, t1 = out.text()
        stderr, _, t2 = err.text()
        if timed_out:
            stderr += f"\n[command timed out after {timeout:g}s and was killed]\n"
            rc = 124 if rc is None or rc == 0 else rc
        if rc_exit is not None:
            rc = rc_exit
            stderr += "[the shell exited; a new one was started: cwd and environment were reset]\n"
        elif restarted:
            stderr += "[the shell did not respond and was restarted: cwd and environment were reset]\n"
        return CommandResult(stdout, stderr, 124 if rc is None else rc, elapsed,
                             timed_out, t1 or t2, restarted)

    def _restart_shell(self) -> None:
        if self._shell_pid:
            self._kill_tree(self._shell_pid)
        self._close_shell()
        self._start_shell()

    def _gone(self, cause: BaseException | None) -> SandboxError:
        why = f": {cause}" if cause else ""
        return SandboxError(f"sandbox {self.id} ({self.backend}) stopped answering{why}")

    # -- files -----------------------------------------------------------------
    def _internal(self, command: str, timeout: float = 120) -> CommandResult:
        res = self._exchange(command, timeout, None)
        if res.exit_code != 0:
            raise SandboxError(f"sandbox {self.id}: {command.split()[0]} failed: {res.stderr[-500:]}")
        return res

    def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Create or replace ``path`` (relative paths are under the workdir)."""
        raw = data.encode() if isinstance(data, str) else data
        q = shlex.quote(path)
        b64 = base64.b64encode(raw).decode()
        self._internal(f"mkdir -p \"$(dirname {q})\" && printf %s {b64} | base64 -d > {q} "
                       f"&& chmod {mode:o} {q}")

    def read_file(self, path: str) -> bytes:
        """Bytes of ``path``; raises ``FileNotFoundError`` when it does not exist."""
        q = shlex.quote(path)
        res = self._exchange(f"test -f {q} && base64 -w0 {q}", 120, None)
        if res.exit_code != 0:
            raise FileNotFoundError(f"{path} (in sandbox {self.id})")
        return base64.b64decode(res.stdout.strip())

    def copy_in(self, host_path: str | os.PathLike, sandbox_path: str) -> None:
        """Copy a host file or directory's contents into ``sandbox_path``."""
        buf = io.BytesIO()
        src = Path(host_path)
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            if src.is_dir():
                for child in sorted(src.iterdir()):
                    tar.add(child, arcname=child.name)
            else:
                tar.add(src, arcname=src.name)
        q = shlex.quote(sandbox_path)
        b64 = base64.b64encode(buf.getvalue()).decode()
        self._internal(f"mkdir -p {q} && printf %s {b64} | base64 -d | tar -xz --no-same-owner -C {q}")

    def copy_out(self, sandbox_path: str, host_path: str | os.PathLike) -> None:
        """Copy ``sandbox_path`` (a directory's contents, or a file) to the host."""
        q = shlex.quote(sandbox_path)
        res = self._internal(
            f"if [ -d {q} ]; then tar -cz -C {q} . | base64 -w0; "
            f"else tar -cz -C \"$(dirname {q})\" \"$(basename {q})\" | base64 -w0; fi")
        dest = Path(host_path)
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(res.stdout.strip())), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} image={self.spec.image}>"


class DockerSandbox(Sandbox):
    """A container on a Docker engine, with its shell on one open exec socket."""

    backend = "docker"

    def __init__(self, spec: SandboxSpec, client: Any, labels: dict[str, str]):
        super().__init__(spec)
        self.client = client
        self.container = client.containers.create(
            spec.image, spec.command, detach=True, init=True,
            labels=labels, user=spec.user, working_dir=spec.workdir,
            environment=spec.env, network_mode="bridge" if spec.network else "none",
            cap_drop=["ALL"], cap_add=ROOT_CAPS if spec.user in ("root", "0") else None,
            security_opt=["no-new-privileges"],
            pids_limit=spec.pids_limit, mem_limit=spec.memory, memswap_limit=spec.memory,
            nano_cpus=int(spec.cpus * 1e9), auto_remove=False,
        )
        try:
            self.container.start()
        except Exception as e:
            self._dispose()
            if "unable to find user" in str(e) or "no matching entries in passwd" in str(e):
                raise SandboxConfigError(
                    f"image {spec.image} has no user {spec.user!r}: set `user` in the task file or "
                    "the config (e.g. root), or add the user to the image") from None
            raise
        self.id = self.container.id[:12]
        self._sock: socket.socket | None = None
        self._buf = b""
        try:
            self._start_shell()
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str | None:
        """The container's IP on the bridge network (None without network)."""
        self.container.reload()
        nets = self.container.attrs.get("NetworkSettings", {}).get("Networks", {})
        return next((n["IPAddress"] for n in nets.values() if n.get("IPAddress")), None)

    def _open_shell(self) -> None:
        api = self.client.api
        try:
            ex = api.exec_create(self.container.id, ["bash", "--noprofile", "--norc"], stdin=True,
                                 user=self.spec.user, workdir=self.spec.workdir, environment=self.spec.env)
            self._exec_id = ex["Id"]
            sock = api.exec_start(ex["Id"], socket=True)
        except Exception as e:  # docker.errors.APIError, connection errors
            raise SandboxError(f"cannot start a shell in container {self.id}: {e}") from e
        self._sock = getattr(sock, "_sock", sock)
        self._buf = b""

    def _send(self, data: bytes) -> None:
        assert self._sock is not None
        self._sock.settimeout(30)
        self._sock.sendall(data)

    def _recv(self, timeout: float) -> list[tuple[int, bytes]] | None:
        assert self._sock is not None
        self._sock.settimeout(max(timeout, 0.001))
        try:
            data = self._sock.recv(1 << 16)
        except (socket.timeout, BlockingIOError):
            return []
        except OSError:
            return None
        if not data:
            return None
        self._buf += data
        chunks = []
        while len(self._buf) >= 8:  # docker's stream framing: type, 0,0,0, big-endian size
            stream, size = self._buf[0], struct.unpack(">I", self._buf[4:8])[0]
            if len(self._buf) < 8 + size:
                break
            chunks.append((stream, self._buf[8:8 + size]))
            self._buf = self._buf[8 + size:]
        return chunks

    def _close_shell(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def _kill_tree(self, pid: int) -> None:
        try:
            self.container.exec_run(["bash", "-c", _KILL_TREE, "kill", str(pid)], user=self.spec.user)
        except Exception as e:
            log.warning("could not kill processes in %s: %s", self.id, e)

    def _shell_exit_code(self) -> int | None:
        try:
            for _ in range(20):  # the engine notes the exit a moment after the socket closes
                info = self.client.api.exec_inspect(self._exec_id)
                if not info.get("Running"):
                    break
                time.sleep(0.05)
            self.container.reload()
        except Exception:
            return None
        if self.container.status != "running" or info.get("Running"):
            return None
        return info.get("ExitCode")

    def is_alive(self) -> bool:
        if self.closed or self._sock is None:
            return False
        try:
            self.container.reload()
        except Exception:
            return False
        return self.container.status == "running"

    def _dispose(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception as e:  # already gone, or the engine went away
            log.debug("removing %s: %s", self.id, e)


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


def warn_local_backend() -> None:
    """The one warning users get when sandboxes fall back to the local backend."""
    warnings.warn(
        "Docker is not available: sandboxes run as local shells"
        + (" inside bubblewrap" if shutil.which("bwrap") else " WITHOUT isolation (install bubblewrap)")
        + ". They isolate far less than containers; do not run untrusted agents this way.",
        RuntimeWarning, stacklevel=3)
