"""Per-image sandbox pools shared by every env of one env factory, bounded.

Tasks with an image of their own (terminal-bench tasks with a Dockerfile) lease from a pool for
that image. Kept by each env, such a pool serves only that env's later episodes on the same
image, and an env lives for one ``collect``: with many images a verified reset is mostly paid
for a sandbox nobody leases again. :class:`ImagePools` keeps one pool per sandbox spec for all
the envs of a factory (``train.wiring.make_envs``), so an episode on an image any env used
before finds its reset sandbox waiting.

Bounded: at most ``max_idle`` idle sandboxes over all its pools (the least recently used
pools give theirs up first), and a pool left with no sandbox is closed. :meth:`close` removes
everything; the pools are also closed at exit like any :class:`~containers.pool.SandboxPool`,
and ``python -m containers reap`` removes what a dead process left.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

from nextstate.containers.pool import SandboxPool


class ImagePools:
    """Pools keyed by their sandboxes' spec (a task's ``sandbox_overrides``), made on first use.

    Args:
        size: each pool's bound on leases at once (the factory's parallel episodes).
        max_idle: idle sandboxes kept over all pools.
    """

    def __init__(self, size: int, max_idle: int):
        if size < 1 or max_idle < 0:
            raise ValueError(f"size must be at least 1 and max_idle at least 0, got {size} and {max_idle}")
        self.size, self.max_idle = size, max_idle
        self._pools: OrderedDict[str, SandboxPool] = OrderedDict()   # least recently used first
        self._lock = threading.Lock()
        self._closed = False

    def get(self, key: str, make: Callable[[int], SandboxPool]) -> SandboxPool:
        """The pool for ``key`` (``make(size)`` builds it the first time), after trimming the others."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the shared image pools are closed")
            pool = self._pools.pop(key, None)
            if pool is None:
                pool = make(self.size)
            self._pools[key] = pool   # most recently used last
            empty = self._trim(keep=pool)
        for p in empty:
            p.close()
        return pool

    def _trim(self, keep: SandboxPool) -> list[SandboxPool]:
        """(Lock held.) Drop idle sandboxes past ``max_idle``, oldest pools first; take out the pools
        left with none (returned, to be closed outside the lock)."""
        idle = sum(p.stats()["ready"] for p in self._pools.values())
        for p in self._pools.values():
            if idle <= self.max_idle:
                break
            if p is not keep:
                idle -= p.drop_idle(idle - self.max_idle)
        empty = [k for k, p in self._pools.items() if p is not keep and not any(
            p.stats()[s] for s in ("ready", "leased", "starting"))]
        return [self._pools.pop(k) for k in empty]

    def stats(self) -> dict[str, int]:
        """Pools open, and their sandboxes ready, leased and starting (or resetting)."""
        with self._lock:
            pools = list(self._pools.values())
        counts = {"pools": len(pools), "ready": 0, "leased": 0, "starting": 0}
        for p in pools:
            s = p.stats()
            for k in ("ready", "leased", "starting"):
                counts[k] += s[k]
        return counts

    def close(self) -> None:
        """Close every pool (leased sandboxes included). Safe to call twice."""
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), OrderedDict()
        for p in pools:
            p.close()
