"""How the bytes of a :class:`~containers.docker_sandbox.DockerSandbox`'s shell travel.

:class:`ShellTransport` is what the sandbox calls: ``bind`` (the mounts its container is created
with), ``open`` (a new shell, started by one ``docker exec``), ``send``, ``recv``, ``close``,
``is_open`` and ``remove``. Two implement it: :class:`ExecStream` here (``transport="exec"``: the
exec's multiplexed socket, wherever the engine is) and :class:`~containers.fifo_shell.FifoShell`
(FIFOs in a read-only bind mount, around ``dockerd``'s relay: ``"fifo"``, and ``"auto"``, the
default, where the container is seen to get them).
"""

from __future__ import annotations

import socket
import struct
from abc import ABC, abstractmethod
from typing import Any

from nextstate.containers.protocol import SandboxSpec


class ShellTransport(ABC):
    """One sandbox's shell streams: its stdin in, its stdout (1) and stderr (2) out."""

    def bind(self) -> dict[str, dict[str, str]] | None:
        """The bind mounts the container is created with (``volumes=``); None: none."""
        return None

    @abstractmethod
    def open(self, api: Any, container_id: str, spec: SandboxSpec) -> str:
        """Start a new shell in the container by ``docker exec`` (``api``: docker's low-level
        client) and connect to it; returns the exec's id. Raises what the engine or the host raised."""

    @abstractmethod
    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the shell's stdin (``OSError`` when it cannot)."""

    @abstractmethod
    def recv(self, timeout: float) -> list[tuple[int, bytes]] | None:
        """Chunks ``(stream, bytes)`` read within ``timeout`` (0: without waiting); None at end of file."""

    @abstractmethod
    def close(self) -> None:
        """Let go of the shell's streams (the shell sees its end of them closed). Safe to call twice."""

    @property
    @abstractmethod
    def is_open(self) -> bool:
        """Whether the streams are open (and were not closed under this object)."""

    def remove(self) -> None:
        """Close, and delete what :meth:`bind` made (after the container is gone)."""
        self.close()


class ExecStream(ShellTransport):
    """The shell's stdin and output on the exec's own socket, in docker's stream framing."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self._buf = b""

    def open(self, api: Any, container_id: str, spec: SandboxSpec) -> str:
        ex = api.exec_create(container_id, ["bash", "--noprofile", "--norc"], stdin=True,
                             user=spec.user, workdir=spec.workdir, environment=spec.env)
        sock = api.exec_start(ex["Id"], socket=True)
        self.sock = getattr(sock, "_sock", sock)
        self._buf = b""
        return ex["Id"]

    def send(self, data: bytes) -> None:
        assert self.sock is not None
        self.sock.settimeout(30)
        self.sock.sendall(data)

    def recv(self, timeout: float) -> list[tuple[int, bytes]] | None:
        assert self.sock is not None
        try:
            self.sock.settimeout(timeout if timeout > 0 else 0.0)   # 0: a look without waiting
            data = self.sock.recv(1 << 16)
        except (socket.timeout, BlockingIOError):
            return []
        except OSError:   # the connection is gone (closed under us: EBADF), like an ended shell
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

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    @property
    def is_open(self) -> bool:
        return self.sock is not None and self.sock.fileno() >= 0
