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
from collections import Counter, OrderedDict
from typing import Callable

from nextstate.containers.pool import SandboxPool
from nextstate.containers.protocol import Sandbox


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
        self._waiting: Counter[SandboxPool] = Counter()   # leases under way, per pool
        self._lock = threading.Lock()
        self._closed = False

    def lease(self, key: str, make: Callable[[int], SandboxPool],
              timeout: float | None = None) -> tuple[SandboxPool, Sandbox]:
        """A sandbox of the pool for ``key`` (``make(size)`` builds the pool the first time), and
        that pool; the other pools are trimmed first. Waits up to ``timeout`` s, as
        :meth:`SandboxPool.lease <containers.pool.SandboxPool.lease>` does."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the shared image pools are closed")
            pool = self._pools.pop(key, None) or make(self.size)
            self._pools[key] = pool   # most recently used last
            self._waiting[pool] += 1   # never closed while a lease of it is under way
            empty = self._trim()
        for p in empty:
            p.close()
        try:
            return pool, pool.lease(timeout=timeout)
        finally:
            with self._lock:
                self._waiting[pool] -= 1
                if not self._waiting[pool]:
                    del self._waiting[pool]

    def _trim(self) -> list[SandboxPool]:
        """(Lock held.) Drop idle sandboxes past ``max_idle``, oldest pools first; take out the pools
        left with none and no lease under way (returned, to be closed outside the lock)."""
        idle = sum(p.stats()["ready"] for p in self._pools.values())
        for p in self._pools.values():
            if idle <= self.max_idle:
                break
            if not self._waiting[p]:
                idle -= p.drop_idle(idle - self.max_idle)
        empty = [k for k, p in self._pools.items() if not self._waiting[p] and not any(
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
