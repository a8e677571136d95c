"""Steps admitted in arrival order: a gate per engine that lets a few short commands run at once.

When more sandboxes step than the machine has cores, the kernel and the interpreter's lock decide
which shell and which waiting thread go next, and some sandboxes wait while the others go on:
with 128 sandboxes stepping ``true`` back to back on 2 cores, a step's p50 was 7 to 12 ms and its
p99 43 to 55 ms (max 134 to 218). A :class:`StepGate` lets ``size`` steps at a time reach an
engine's sandboxes and queues the rest first come, first served, so a step waits about as long
as any other (p99 24 to 29 ms in the same runs, max 29 to 44). A step leaves the gate when its
command ends or has run for ``hold`` seconds, whichever comes first, so a long command (a build,
``sleep``) holds no one up for longer than that. Without contention a step pays one uncontended
lock.

``NEXTSTATE_STEP_GATE`` sets the size: a number of steps, or ``0`` for no gate. By default it is
:data:`PER_CPU` steps per CPU of the engine's host.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from typing import Callable

PER_CPU = 4          # default steps at once per CPU of the engine's host
HOLD = 0.005         # seconds a step may hold its place before it leaves the gate running


class StepGate:
    """At most ``size`` holders at once; the others wait in arrival order."""

    def __init__(self, size: int, hold: float = HOLD):
        if size < 1:
            raise ValueError(f"a step gate needs room for at least one step, got {size}")
        self.size, self.hold = size, hold
        self._reset()
        _GATES.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._free = self.size
        self._queue: collections.deque[threading.Lock] = collections.deque()

    def enter(self) -> "Ticket":
        """Wait for a place (first come, first served) and take it."""
        with self._lock:
            if self._free and not self._queue:
                self._free -= 1
                return Ticket(self)
            turn = threading.Lock()
            turn.acquire()
            self._queue.append(turn)
        try:
            turn.acquire()   # released by the step that hands its place over
        except BaseException:   # interrupted while queued: give the place back, or leave the queue
            with self._lock:
                try:
                    self._queue.remove(turn)
                    handed = False
                except ValueError:
                    handed = True
            if handed:
                self._leave()
            raise
        return Ticket(self)

    def _leave(self) -> None:
        with self._lock:
            if self._queue:
                self._queue.popleft().release()   # the place goes straight to the first in line
            else:
                self._free += 1

    def __repr__(self) -> str:
        return f"StepGate(size={self.size}, free={self._free}, queued={len(self._queue)})"


class Ticket:
    """A place in a :class:`StepGate`: given back by :meth:`leave` (once; later calls do nothing)
    and due back by :attr:`due` (``time.monotonic()``)."""

    __slots__ = ("_gate", "due")

    def __init__(self, gate: StepGate):
        self._gate: StepGate | None = gate
        self.due = time.monotonic() + gate.hold

    def leave(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._leave()


_GATES: "weakref.WeakSet[StepGate]" = weakref.WeakSet()
_BY_ENGINE: dict[str, StepGate | None] = {}
_BY_ENGINE_LOCK = threading.Lock()


def engine_gate(engine: str, cpus: int | Callable[[], int]) -> StepGate | None:
    """The gate of the sandboxes of ``engine`` (a URL, or ``"local"``) in this process, made on
    first use; None where ``NEXTSTATE_STEP_GATE`` is ``0``, and ``ValueError`` where it is not a
    number. ``cpus``: the engine host's CPU count, or a function that asks for it
    (called once)."""
    with _BY_ENGINE_LOCK:
        if engine not in _BY_ENGINE:
            _BY_ENGINE[engine] = _make(cpus)
        return _BY_ENGINE[engine]


def _make(cpus: int | Callable[[], int]) -> StepGate | None:
    text = os.environ.get("NEXTSTATE_STEP_GATE", "").strip()
    if text:
        if not text.isdigit():
            raise ValueError(f"NEXTSTATE_STEP_GATE must be a number of steps (0: no gate), got {text!r}")
        size = int(text)
        return StepGate(size) if size else None
    return StepGate(PER_CPU * max(1, cpus() if callable(cpus) else cpus))


def _after_fork() -> None:
    """A child has only the forking thread: the places its parent's other threads held are free."""
    global _BY_ENGINE_LOCK
    _BY_ENGINE_LOCK = threading.Lock()
    for gate in list(_GATES):
        gate._reset()


os.register_at_fork(after_in_child=_after_fork)
