"""The sandbox protocol: what every backend speaks over its shell's streams, once.

:class:`Sandbox` is the abstract sandbox (a backend supplies the transport),
:class:`SandboxSpec` how to make one, :class:`CommandResult` what one command
did, :class:`SandboxError` / :class:`SandboxConfigError` how a sandbox fails.
The backends are :mod:`containers.docker_sandbox` and :mod:`containers.local_sandbox`.

Protocol: a new shell is sent one loop (``_LOOP``), parsed once, which per
command reads exactly the command's bytes (``read -N``, no fork) and ``eval``-s
them with stdin from ``/dev/null`` (so a heredoc or an unbalanced quote cannot
wedge the shell), calling its builtins as ``\builtin`` (so the agent's functions
and aliases named ``eval``, ``read`` or ``printf`` do not reach it; a function
named ``builtin`` costs one timeout and a restarted shell) and keeping its own
lines out of a ``set -x`` trace; after each command it prints an end marker with
the exit code on stdout and a second marker on stderr. Output beyond
``output_limit`` bytes per stream is dropped (the flood is still drained) and a
visible marker says how much; the end marker is found however much comes before
or after it. On timeout the command's whole process tree is killed; if the shell
itself does not come back (a builtin busy loop), the shell is restarted and the
result says that its state was reset. A command bash cannot take (a NUL byte,
text that is not UTF-8) is not sent: its result says why, with exit code 2.

Background jobs (``cmd &``) share the shell's output streams. What they print
between two commands is reported apart, in :attr:`CommandResult.background`
(and first in :attr:`CommandResult.output`, labelled); what they print while a
command runs (or what one printing without pause has not finished printing after a
quarter of a second) cannot be told apart from the command's own output.
"""

from __future__ import annotations

import base64
import io
import logging
import math
import os
import random
import re
import shlex
import tarfile
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from nextstate.containers.gate import StepGate, Ticket, engine_gate

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


def parse_size(size: str | int | None) -> int | None:
    """Bytes in ``"2g"``, ``"64m"``, ``"512k"``, ``"1.5g"`` or an int; None stays None."""
    if size is None or isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(size).lower())
    if not m:
        raise ValueError(f"bad size {size!r}: use bytes or a number with k, m, g or t (e.g. '2g')")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def _mib(n: int | None) -> str:
    return f"{(n or 0) / 2 ** 20:.0f} MiB"


def _size(n: int) -> str:
    """``n`` bytes in GiB when whole, else MiB: "1 GiB", "512 MiB"."""
    return f"{n // 2 ** 30} GiB" if n >= 2 ** 30 and n % 2 ** 30 == 0 else _mib(n)


def unsendable(command: str) -> str | None:
    """Why bash cannot be given ``command`` (a NUL byte, text that is not UTF-8), or None."""
    if "\x00" in command:
        return ("the command contains a NUL byte, which bash cannot hold in a command line "
                "(write one with printf '\\0')")
    try:
        command.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"the command contains text that is not UTF-8 ({command[e.start]!r} at index {e.start})"
    return None


class SandboxError(RuntimeError):
    """The sandbox itself failed (its container died, its shell is gone).

    Environments turn this into an aborted step: it is an infrastructure
    fault, never something the agent did wrong.
    """


class SandboxConfigError(SandboxError):
    """The sandbox cannot start as specified (e.g. its image has no such user); retrying will not help."""


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
    disk: str | int | None = "2g"     # the writable layer's size limit; None: no limit
    command: list[str] = field(default_factory=lambda: ["sleep", "infinity"])
    #: How the shell's streams reach this process: "exec" (a ``docker exec`` socket, relayed by
    #: the engine), "fifo" (FIFOs in a read-only bind mount, local engines only:
    #: :mod:`containers.fifo_shell`; elsewhere "exec", with a warning) or "auto" (FIFOs where the
    #: container is seen to get them, else "exec"). Default: ``NEXTSTATE_SHELL_TRANSPORT``, else "auto".
    transport: str = field(default_factory=lambda: os.environ.get("NEXTSTATE_SHELL_TRANSPORT", "auto"))


@dataclass
class ResetResult:
    """What :meth:`Sandbox.reset` did: ``verified`` when the sandbox is as a fresh one, else
    ``problems`` says why not (the sandbox must then be discarded)."""

    verified: bool
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


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
    background: str = ""   # what background jobs printed since the previous command ended

    @property
    def output(self) -> str:
        """stdout and stderr together, as a terminal would show them (background output first)."""
        text = self.stdout.rstrip("\n") + "\n" + self.stderr if self.stdout and self.stderr \
            else self.stdout or self.stderr
        if self.background:
            text = f"[background jobs printed:]\n{self.background.rstrip(chr(10))}\n[end of background output]\n" + text
        return text

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_EXIT_CODE = re.compile(rb"-?\d+")
# Each command's end markers carry a nonce from here: a generator of the module's own (seeding
# `random` does not repeat them) that needs no syscall per command, as uuid4's random bytes do.
_NONCES = random.Random()


class _Capped:
    """One stream of one command: the first ``limit`` bytes before its end marker, the code
    after it (stdout's: the exit code; stderr's: 1 where a `break` left the shell's loop), and
    whatever came after that (output of background jobs).

    The marker is looked for in every chunk plus the few bytes kept back from the one
    before, so no flood before or after it can push it out of sight.
    """

    def __init__(self, limit: int | None, marker: bytes):
        self.limit = limit
        self.marker = marker
        self.keep = len(marker) + 8   # the longest end that can straddle two chunks
        self.body = bytearray()
        self.pending = b""
        self.late = bytearray()       # after the end marker
        self.dropped = 0
        self.code: int | None = None
        self.finished = False

    def feed(self, data: bytes) -> None:
        if self.finished:
            self.late += data
            return
        data = self.pending + data
        end = self._end(data)
        if end:
            start, stop, self.code = end
            self._keep(data[:start])
            self.late += data[stop:]
            self.pending, self.finished = b"", True
        else:
            cut = max(0, len(data) - self.keep)
            self._keep(data[:cut])
            self.pending = data[cut:]

    def _end(self, data: bytes) -> tuple[int, int, int] | None:
        """Where the first whole end marker in ``data`` starts and stops, and the exit code in it
        (a plain search: a pattern compiled per command, its nonce in it, cost more than the rest)."""
        at = data.find(self.marker)
        while at >= 0:
            code_at = at + len(self.marker)
            stop = data.find(b"\x1e", code_at, code_at + 12)
            if stop > code_at and _EXIT_CODE.fullmatch(data, code_at, stop):
                return at, stop + 1, int(data[code_at:stop])
            at = data.find(self.marker, at + 1)
        return None

    def _keep(self, data: bytes) -> None:
        room = len(data) if self.limit is None else max(0, self.limit - len(self.body))
        self.body += data[:room]
        self.dropped += len(data) - min(room, len(data))

    def done(self) -> bool:
        return self.finished

    def text(self) -> tuple[str, int | None, bool]:
        """Decoded text before the marker, the code after it (None: no marker seen), truncated?"""
        if not self.finished:  # timed out or restarted: what was kept back is output too
            self._keep(self.pending)
            self.pending = b""
        text = bytes(self.body).decode("utf-8", errors="replace")
        if self.dropped > 0:
            text += f"\n[... output truncated: {self.dropped} more bytes not shown ...]\n"
        return text, self.code, self.dropped > 0


# The shell's side of the protocol: one loop, parsed once when the shell starts (bash parses what
# it reads from a pipe one byte a `read` call, but `read -N` takes a count in one call). Each turn
# takes a command's frame (``_frame``) and `eval`s its bytes, stdin from /dev/null, with the agent's
# -x/-v (kept in __ns_x) turned back on; the next turn captures the exit code, turns -x/-v off
# (its own trace sent to /dev/null) and prints the end markers ``_exchange`` looks for:
# ``\n\x1e<nonce>:<exit code>\x1e`` on stdout, ``\x1e<nonce>!0\x1e`` on stderr. The nonce comes
# after the command's bytes and the code is captured after it ran, so nothing the command sets
# reaches the protocol. A `continue` of the agent's starts the next turn, which prints the markers
# as usual; a `break` leaves the loop, and the lines after it print them with a 1 (``!1``), so the
# loop is sent again with the next command. TMOUT is emptied for the reads that wait for a command
# and the command's bytes are counted as bytes (LC_ALL=C); `\builtin` passes by the agent's
# functions and aliases named read, eval, printf or set. The loop is parsed with alias expansion
# off (an alias of the agent's named `while` or `case` would change it), and the loop turns it
# back on where the agent had it (``_ALIASES_OFF``, a line of its own: bash runs a line before it
# parses the next).
_ALIASES_OFF = "\\builtin shopt -q expand_aliases && __ns_a=1 || __ns_a=; \\builtin shopt -u expand_aliases\n"
_CAPTURE = r"{ __ns_rc=$?; __ns_x=${-//[!xv]/}; \builtin set +xv; } 2>/dev/null"
_READ = r"TMOUT= \builtin read -r -N"


def _markers(broken: int) -> str:
    return (r"""\builtin printf '\n\036%s:%d\036' "${__ns_h:1}" "$__ns_rc"; """
            rf"""\builtin printf '\036%s!{broken}\036' "${{__ns_h:1}}" >&2""")


_LOOP = (f"{_ALIASES_OFF}case $__ns_a in 1) \\builtin shopt -s expand_aliases;; esac; "
         f"while {_CAPTURE}; do {_READ} 11 __ns_h || \\builtin exit; "
         f"case $__ns_h in N*) {_markers(0)}; {_READ} 11 __ns_h || \\builtin exit;; esac; "
         f"LC_ALL=C {_READ} $((10#${{__ns_h:1}})) __ns_cmd; "
         f'\\builtin eval "${{__ns_x:+\\\\builtin set -$__ns_x;}}$__ns_cmd" </dev/null; done; '
         f"{_CAPTURE}; {_READ} 11 __ns_h; {_markers(1)}\n").encode()


def _frame(nonce: str, body: bytes) -> bytes:
    """What the loop is sent for one command: ``H`` and the body's length in 10 digits, the body,
    then ``N`` and the 10-character nonce its end markers carry."""
    return b"H%010d" % len(body) + body + b"N" + nonce.encode()


@dataclass(slots=True)
class _Wait:
    """Where the wait for one command's end stands, and what happened on the way."""

    deadline: float
    next_kill: float = math.inf
    next_disk: float = math.inf
    timed_out: bool = False
    restarted: bool = False
    rc_exit: int | None = None     # the shell exited (``exit``) with this status
    disk_full: int | None = None   # bytes written when the watchdog found the disk limit passed


class Sandbox(ABC):
    """One isolated machine with a persistent shell.

    Subclasses provide the transport (:meth:`_open_shell`, :meth:`_send`,
    :meth:`_recv`, :meth:`_close_shell`, :meth:`_kill_tree`); the protocol,
    output capping, timeouts and file transfer live here once.
    """

    backend: str = "abstract"
    disk_check_every: float = 2.0   # seconds between disk measurements when commands are short
    disk_check_running: float = 0.2  # seconds between disk measurements while a command runs
    kill_grace: float = 1.5         # after a timeout's kill, seconds before the shell is restarted

    def __init__(self, spec: SandboxSpec):
        self.spec = spec
        self.id = uuid.uuid4().hex[:12]
        self._shell_pid: int | None = None
        self._shell_loops = False                  # the shell runs the protocol's loop (``_LOOP``)
        self._starting = False                     # in _start_shell: no second start from within
        self.closed = False
        self._in_flight = False                    # a command was sent and not seen to end
        self._late: list[bytes] = []               # background output after the last end marker
        self._disk_limit = parse_size(spec.disk)
        self._disk_checked = 0.0
        self.gate: StepGate | None = None          # where the agent's commands queue when many step at once

    def _use_gate(self, engine: str, cpus: int | Callable[[], int]) -> None:
        """Queue the agent's commands at the step gate of ``engine`` (:mod:`containers.gate`);
        a ``NEXTSTATE_STEP_GATE`` that is not a number is a :class:`SandboxConfigError`."""
        try:
            self.gate = engine_gate(engine, cpus)
        except ValueError as e:
            raise SandboxConfigError(str(e)) from None

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
    def _kill_tree(self, pid: int) -> bool | None:
        """Kill every descendant of process ``pid`` (the shell), not ``pid`` itself.

        True: the sandbox was out of pids (a fork bomb), so the shell may be stuck retrying a
        fork and is best restarted at once."""

    def _kill_others(self, keep_shell: bool = True) -> None:
        """Kill every process of the sandbox but its init (and its shell when ``keep_shell``).

        Default: the shell's descendants (a backend that sees more kills more).
        """
        if self._shell_pid:
            self._kill_tree(self._shell_pid)

    def _disk_used(self) -> int | None:
        """Bytes written to the sandbox's disk, when a watchdog must measure them; else None."""
        return None

    def _disk_full(self) -> str | None:
        """What a disk whose limits the kernel enforces has used up (its space or its inodes:
        writers got ENOSPC), as a sentence for the result; None while it has room."""
        return None

    def _oom_killed(self, exit_code: int | None) -> bool:
        """Whether the kernel's OOM killer killed a process of the sandbox since the last look."""
        return False

    @abstractmethod
    def _shell_exit_code(self) -> int | None:
        """The shell's exit status if it ended while the sandbox lives on, else None."""

    @abstractmethod
    def is_alive(self) -> bool: ...

    @abstractmethod
    def _dispose(self) -> None:
        """Remove what the backend made (the container, the scratch directory)."""

    def reset(self) -> ResetResult:
        """Bring the sandbox back to the state it started in, and check that it is so.

        The default cannot check: unverified, the sandbox must be discarded. A backend that
        can (:meth:`DockerSandbox.reset <containers.docker_sandbox.DockerSandbox.reset>`) overrides it.
        """
        return ResetResult(False, [f"the {self.backend} backend cannot verify a reset"])

    def close(self) -> None:
        """End the shell and remove the sandbox. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        self._close_shell()
        self._dispose()

    # -- the protocol ----------------------------------------------------------
    def _start_shell(self) -> None:
        """A new shell that answers; ``SandboxError`` when it exits or stays silent instead (an
        image without bash, streams that do not reach it) rather than another start."""
        self._open_shell()
        self._in_flight = self._shell_loops = False
        self._starting = True
        try:
            res = self._exchange("echo $$", timeout=20, limit=None)
        finally:
            self._starting = False
        try:
            self._shell_pid = int(res.stdout.strip())
        except ValueError as e:
            raise SandboxError(f"sandbox shell did not start: {res.output[:500]!r}") from e

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run ``command`` in the persistent shell, as if typed into a terminal.

        Never raises for anything the command does (errors, floods, hangs):
        those come back in the result. Raises :class:`SandboxError` only when
        the sandbox itself is gone, and ``ValueError`` for a ``timeout`` that
        is not a positive finite number.
        """
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        timeout = self.spec.default_timeout if timeout is None else timeout
        try:
            seconds = float(timeout)
        except (TypeError, ValueError, OverflowError):
            seconds = math.nan
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"timeout must be a positive finite number of seconds, got {timeout!r}")
        problem = unsendable(command)
        if problem:
            return CommandResult("", f"nextstate: {problem}; the command was not run.\n", 2, 0.0)
        if self._in_flight:  # an earlier exchange was cut short: its output would leak into this one
            log.warning("sandbox %s: the previous command did not finish cleanly; restarting its shell",
                        self.id)
            self._restart_shell()
        return self._exchange(command, seconds, self.spec.output_limit, gated=True)

    def _background_output(self, limit: int | None) -> str:
        """What background jobs printed since the last end marker (read without waiting)."""
        parts, self._late = self._late, []
        stop = time.monotonic() + 0.25   # a job printing without pause cannot hold the next command up
        wait, quiet = 0.0, 0                # a quiet shell costs one look; a talking one, until it pauses
        while time.monotonic() < stop and quiet < 2:
            chunks = self._recv(wait)
            if chunks is None or (not chunks and wait == 0.0):
                break
            quiet = 0 if chunks else quiet + 1
            parts += [data for _, data in chunks]
            wait = 0.01
        late = b"".join(parts)
        if limit is not None and len(late) > limit:
            return late[:limit].decode("utf-8", errors="replace") + \
                f"\n[... {len(late) - limit} more bytes not shown ...]"
        return late.decode("utf-8", errors="replace")

    def _exchange(self, command: str, timeout: float, limit: int | None, gated: bool = False) -> CommandResult:
        """One round trip: send ``command``, read both streams up to their end markers and say
        what cut it short. ``limit`` caps each stream (None: the sandbox's own commands, the
        shell's start and file transfers: uncapped, no disk watchdog, no disk or memory notes).
        ``gated``: the command waits its turn at :attr:`gate` (the agent's commands)."""
        nonce = f"{_NONCES.getrandbits(40):010x}"
        frame = _frame(nonce, command.encode())
        if not self._shell_loops:   # a new shell, or one whose loop a `break` ended: the loop first
            frame, self._shell_loops = _LOOP + frame, True
        background = self._background_output(limit)
        out = _Capped(limit, f"\n\x1e{nonce}:".encode())
        err = _Capped(limit, f"\x1e{nonce}!".encode())
        ticket = self.gate.enter() if gated and self.gate is not None else None
        try:
            start = time.monotonic()
            self._in_flight = True
            try:
                self._send(frame)
            except OSError as e:
                raise self._gone(e) from e
            wait = self._await_end(out, err, start, timeout, self._disk_limit is not None and limit is not None,
                                   ticket)
        finally:
            if ticket is not None:
                ticket.leave()
        if not wait.restarted:
            self._in_flight = False
            self._late = [bytes(out.late), bytes(err.late)]
        elapsed = time.monotonic() - start
        stdout, rc, t1 = out.text()
        stderr, broke, t2 = err.text()
        if broke:
            self._shell_loops = False
        notes, rc = self._notes(wait, rc, timeout, limit)
        return CommandResult(stdout, stderr + notes, 124 if rc is None else rc, elapsed,
                             wait.timed_out, t1 or t2, wait.restarted, background)

    def _await_end(self, out: _Capped, err: _Capped, start: float, timeout: float, watch: bool,
                   ticket: Ticket | None = None) -> _Wait:
        """Feed ``out`` and ``err`` until both saw their end marker, killing the command past its
        deadline and, with ``watch``, measuring the disk meanwhile; what happened comes back. The
        command's place at the gate (``ticket``) is given back once it is due."""
        wait = _Wait(start + timeout)
        if watch:
            wait.next_disk = (start if start - self._disk_checked >= self.disk_check_every else
                              start + self.disk_check_running)
        while not (out.done() and err.done()):
            now = time.monotonic()
            if now >= wait.deadline and self._overdue(wait, now):
                break
            if now >= wait.next_kill and self._shell_pid and self._kill_command(wait, self._shell_pid):
                break
            if now >= wait.next_disk:
                self._check_disk(wait)
            if ticket is not None and now >= ticket.due:
                ticket.leave()
                ticket = None
            wake = min(wait.deadline, wait.next_kill, wait.next_disk, ticket.due if ticket else math.inf)
            chunks = self._recv(max(0.001, wake - now) if wait.timed_out else max(0.001, min(wake - now, 1.0)))
            if chunks is None:  # the shell ended: `exit` typed, or the sandbox died
                self._shell_ended(wait)
                break
            for stream, data in chunks:
                (out if stream == STDOUT else err).feed(data)
        return wait

    def _overdue(self, wait: _Wait, now: float) -> bool:
        """The deadline passed: the first time, the command timed out (kill it, allow
        ``kill_grace``); the second, the shell itself is stuck (a builtin loop): restart it
        and stop waiting (True)."""
        if wait.timed_out:
            self._restart_shell()
            wait.restarted = True
            return True
        wait.timed_out = True
        wait.deadline, wait.next_kill = now + self.kill_grace, now
        return False

    def _kill_command(self, wait: _Wait, shell: int) -> bool:
        """Kill the command's processes (the descendants of ``shell``); repeated while the rest of
        its line runs. True: the sandbox was out of pids, so the shell was restarted (stop waiting)."""
        if self._kill_tree(shell):
            self._restart_shell()
            wait.restarted = True
            return True
        wait.next_kill = time.monotonic() + 0.25
        return False

    def _check_disk(self, wait: _Wait) -> None:
        """The watchdog's look at the disk: past the limit, kill the writers."""
        used = self._disk_used()
        self._disk_checked = time.monotonic()
        wait.next_disk = self._disk_checked + self.disk_check_running
        if used is not None and used > self._disk_limit:  # type: ignore[operator]
            wait.disk_full = used
            self._kill_others()

    def _shell_ended(self, wait: _Wait) -> None:
        """The shell's streams ended: after ``exit`` a new shell starts; a dead sandbox raises."""
        code = self._shell_exit_code()
        if code is None:
            raise self._gone(None)
        if self._starting:
            raise SandboxError(f"sandbox {self.id}: its shell exited as it started (exit code {code}: "
                               "has the image bash?)")
        self._close_shell()
        self._start_shell()
        wait.restarted, wait.rc_exit = True, code

    def _notes(self, wait: _Wait, rc: int | None, timeout: float, limit: int | None) -> tuple[str, int | None]:
        """The lines stderr gets for what cut the command short or what it ran into (its timeout,
        the disk or memory limit, a new shell), and the exit code that makes it."""
        notes = ""
        if wait.timed_out:
            notes += f"\n[command timed out after {timeout:g}s and was killed]\n"
            rc = 124 if rc is None or rc == 0 else rc
        if wait.disk_full is not None:
            notes += (f"\n[ENOSPC: the sandbox's disk limit of {_mib(self._disk_limit)} is used up "
                      f"({_mib(wait.disk_full)} written); the processes writing were killed. "
                      "Delete files to free space.]\n")
            rc = 28 if rc is None or rc == 0 else rc   # 28: ENOSPC
        elif limit is not None and (full := self._disk_full()):
            notes += f"\n[ENOSPC: {full}. Delete files to free space.]\n"
        if limit is not None and self._oom_killed(rc):
            notes += (f"\n[out of memory (limit {_size(parse_size(self.spec.memory) or 0)}): the kernel "
                      "killed a process of the sandbox. Use less memory.]\n")
        if wait.rc_exit is not None:
            rc = wait.rc_exit
            notes += "[the shell exited; a new one was started: cwd and environment were reset]\n"
        elif wait.restarted:
            notes += "[the shell did not respond and was restarted: cwd and environment were reset]\n"
        return notes, rc

    def _restart_shell(self) -> None:
        """A new shell; every other process (background jobs included) is killed."""
        if self._starting:
            raise SandboxError(f"sandbox {self.id}: its new shell did not answer")
        self._kill_others(keep_shell=False)
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

    @staticmethod
    def _quoted(path: str) -> str:
        """``path`` quoted for the shell; ``ValueError`` for one bash cannot hold (a NUL byte)."""
        path = str(path)
        problem = "a path cannot hold a NUL byte" if "\x00" in path else unsendable(path)
        if problem:
            raise ValueError(f"bad path {path[:200]!r}: {problem.replace('the command', 'it')}")
        return shlex.quote(path)

    def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Create or replace ``path`` (relative paths are under the workdir); ``ValueError``
        for a path holding a NUL byte."""
        raw = data.encode() if isinstance(data, str) else data
        q = self._quoted(path)
        b64 = base64.b64encode(raw).decode()
        self._internal(f"mkdir -p \"$(dirname {q})\" && printf %s {b64} | base64 -d > {q} "
                       f"&& chmod {mode:o} {q}")

    def read_file(self, path: str) -> bytes:
        """Bytes of ``path``; raises ``FileNotFoundError`` when it does not exist."""
        q = self._quoted(path)
        res = self._exchange(f"test -f {q} && base64 -w0 {q}", 120, None)
        if res.exit_code != 0:
            raise FileNotFoundError(f"{path} (in sandbox {self.id})")
        return base64.b64decode(res.stdout.strip())

    def copy_in(self, host_path: str | os.PathLike, sandbox_path: str) -> None:
        """Copy a host file or directory's contents into ``sandbox_path``."""
        q = self._quoted(sandbox_path)
        buf = io.BytesIO()
        src = Path(host_path)
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            if src.is_dir():
                for child in sorted(src.iterdir()):
                    tar.add(child, arcname=child.name)
            else:
                tar.add(src, arcname=src.name)
        b64 = base64.b64encode(buf.getvalue()).decode()
        self._internal(f"mkdir -p {q} && printf %s {b64} | base64 -d | tar -xz --no-same-owner -C {q}")

    def copy_out(self, sandbox_path: str, host_path: str | os.PathLike) -> None:
        """Copy ``sandbox_path`` (a directory's contents, or a file) to the host."""
        q = self._quoted(sandbox_path)
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
