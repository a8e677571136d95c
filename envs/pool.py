"""Pools at the env level: :class:`EnvCache`, the env instances episodes reuse.

The sandbox pool itself is the runtime's (:mod:`containers.pool`); it is re-exported here
because ``from envs.pool import SandboxPool`` is how users have always imported it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from nextstate.containers.pool import PoolClosed, PoolTimeout, SandboxPool, docker_available

__all__ = ["EnvCache", "PoolClosed", "PoolTimeout", "SandboxPool", "docker_available"]

log = logging.getLogger(__name__)


class EnvCache:
    """Env instances reused between episodes: :meth:`take` gives an idle one or makes one with
    ``factory``, :meth:`give_back` returns it, :meth:`close` closes every env it made.

    The rollout loop, the veRL agent loop, the validator and the evaluator keep their envs
    here, so an episode never pays for a new env (and its tool setup) when an idle one exists.
    Thread-safe; :meth:`atake` makes the env in ``executor`` so the event loop never blocks.
    """

    def __init__(self, factory: Callable[[], Any]):
        self.factory = factory
        self.made: list[Any] = []
        self._free: list[Any] = []
        self._lock = threading.Lock()

    def _idle(self) -> Any | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def _new(self) -> Any:
        env = self.factory()
        with self._lock:
            self.made.append(env)
        return env

    def take(self) -> Any:
        """An idle env, or a new one."""
        env = self._idle()
        return env if env is not None else self._new()

    async def atake(self, executor: ThreadPoolExecutor | None = None) -> Any:
        """:meth:`take` for coroutines: a new env is made in ``executor``."""
        env = self._idle()
        if env is not None:
            return env
        return await asyncio.get_running_loop().run_in_executor(executor, self._new)

    def give_back(self, env: Any) -> None:
        with self._lock:
            self._free.append(env)

    @contextmanager
    def env(self) -> Iterator[Any]:
        """``with cache.env() as env:`` -- :meth:`take`, then :meth:`give_back`."""
        env = self.take()
        try:
            yield env
        finally:
            self.give_back(env)

    def close(self) -> None:
        """Close every env made here (an env whose close fails is logged, the others still close)."""
        with self._lock:
            made, self.made, self._free = self.made, [], []
        for env in made:
            try:
                env.close()
            except Exception as e:  # noqa: BLE001 -- closing the rest matters more
                log.warning("closing %s failed: %s", type(env).__name__, e)
