"""A pool of warm sandboxes that episodes lease and give back.

``SandboxPool(image, size)`` keeps ``size`` sandboxes ready. :meth:`lease`
(or ``await`` :meth:`alease`) hands one out in well under a millisecond when
one is warm; :meth:`release` gives it back, and by default the pool throws it
away and starts a fresh one in the background, so nothing an episode did can
leak into the next. With ``reset="verified"`` it resets the sandbox instead
(:meth:`~containers.protocol.Sandbox.reset`) and hands it out again only when the
reset is verified; one that is not is thrown away and replaced. A monitor thread
replaces sandboxes that die while idle (a container killed from outside); a leased sandbox that dies raises
:class:`~containers.protocol.SandboxError` in its holder's ``run`` instead of hanging.
While no engine of the pool answers (its ``dockerd`` died), leases fail at once with
:class:`~containers.protocol.SandboxError` rather than wait out their timeout; the pool keeps
trying to start sandboxes and serves leases again when an engine is back.

Every container carries the project's labels (run id, owner pid, host), so the
leftovers of a run that died, even by SIGKILL, are removed by
``python -m containers reap``, which the first pool a process starts on an engine also runs.
The pool closes everything on ``close()``, at interpreter exit (a Ctrl-C's
KeyboardInterrupt included), and on SIGTERM. Several Docker engines can back one
pool (``hosts=[...]``): new sandboxes go to the engine with the fewest.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import os
import signal
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

from nextstate.containers.docker_sandbox import DockerSandbox
from nextstate.containers.local_sandbox import LocalSandbox, warn_local_backend
from nextstate.containers.protocol import Sandbox, SandboxConfigError, SandboxError, SandboxSpec

log = logging.getLogger(__name__)
_LIVE_POOLS: "weakref.WeakSet[SandboxPool]" = weakref.WeakSet()
_REAPED: set[str | None] = set()   # engines this process has reaped leftovers on
_exiting = False   # set by reap_live_pools: the process is about to exit, no sandbox may start
START_GRACE = 120.0   # seconds a forced exit waits for the sandbox starts under way (each engine call is bounded)


RESETS = ("replace", "verified", "reuse")


class PoolTimeout(TimeoutError):
    """No sandbox became free within the lease timeout."""


class PoolClosed(RuntimeError):
    """The pool was closed (or its process is being interrupted)."""


def docker_available(host: str | None = None) -> bool:
    """Whether a Docker engine answers at ``host`` (default: the environment's)."""
    try:
        import docker
        client = docker.DockerClient(base_url=host) if host else docker.from_env()
        client.ping()
        client.close()
        return True
    except Exception:
        return False


class SandboxPool:
    """Keeps ``size`` sandboxes warm and leases them out, thread- and asyncio-safe.

    Args:
        image: image name, or a full :class:`SandboxSpec`.
        size: sandboxes kept ready (also the bound on concurrent leases).
        backend: ``"docker"``, ``"local"`` or ``"auto"`` (Docker when an engine
            answers, else the local backend with a warning).
        hosts: Docker engine URLs (``unix://...``, ``tcp://...``); default the
            environment's engine (``DOCKER_HOST``).
        reset: ``"replace"`` (default; a fresh sandbox after every lease), ``"verified"``
            (the same one again after a verified reset, else a fresh one) or ``"reuse"``
            (the same one again as it is; leaks state, for a caller that cleans up itself).
        start_workers: sandboxes created at once while filling the pool.
        warm: keep ``size`` sandboxes started ahead of leases (default). False: start one
            only when a lease finds none ready, and keep none waiting after a release
            (a pool for one task's image, which the next episode may not use).
    """

    #: Resets ``"verified"`` and ``"discarded"`` by every pool of this process (``resets``: this pool's).
    all_resets: "collections.Counter[str]" = collections.Counter()

    def __init__(self, image: str | SandboxSpec = "nextstate/terminal:latest", size: int = 4, *,
                 backend: str = "auto", hosts: list[str] | None = None, reset: str = "replace",
                 start_workers: int = 8, run_id: str | None = None, build_missing: bool = True,
                 warm: bool = True, **spec_overrides: Any):
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        if reset not in RESETS:
            raise ValueError(f"reset must be one of {', '.join(RESETS)}, got {reset!r}")
        spec = image if isinstance(image, SandboxSpec) else SandboxSpec(image=image)
        self.spec = replace(spec, **spec_overrides)
        self.size, self.reset, self.warm = size, reset, warm
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.backend = self._pick_backend(backend, hosts)
        self._lock = threading.Lock()
        self._ready: collections.deque[Sandbox] = collections.deque()
        # A waiter takes a sandbox (True: accepted) or None when the pool closes.
        self._waiters: collections.deque[Callable[[Sandbox | None], bool]] = collections.deque()
        self._leased: set[Sandbox] = set()
        self._starting = 0
        self._resetting: set[Sandbox] = set()   # of those starting, the released sandboxes being reset
        self._failures: collections.deque[str] = collections.deque(maxlen=5)
        self.resets: collections.Counter[str] = collections.Counter()   # "verified" / "discarded" resets
        self.discard_reasons: collections.deque[str] = collections.deque(maxlen=5)   # the latest unverified resets'
        self._closed = False
        self._fatal: SandboxConfigError | None = None  # set when sandboxes cannot start as specified
        self._unreachable: str | None = None  # why no engine answers, while none does
        self._clients: list[Any] = []
        self._per_client: collections.Counter[int] = collections.Counter()
        if self.backend == "docker":
            self._connect(hosts or [None], build_missing)
        else:
            warn_local_backend(asked=backend == "local")
        self._workers = ThreadPoolExecutor(max_workers=max(1, start_workers),
                                           thread_name_prefix="sandbox-pool")
        _install_exit_handlers()
        _LIVE_POOLS.add(self)
        for _ in range(size if warm else 0):
            self._spawn()
        self._monitor = threading.Thread(target=self._watch, daemon=True, name="sandbox-monitor")
        self._monitor.start()

    # -- setup -----------------------------------------------------------------
    @staticmethod
    def _pick_backend(backend: str, hosts: list[str] | None) -> str:
        if backend not in ("auto", "docker", "local"):
            raise ValueError(f"backend must be auto, docker or local, got {backend!r}")
        if backend == "auto":
            return "docker" if docker_available(hosts[0] if hosts else None) else "local"
        return backend

    def _connect(self, hosts: list[str | None], build_missing: bool) -> None:
        import docker
        from nextstate import containers
        for host in hosts:
            try:
                client = docker.DockerClient(base_url=host) if host else docker.from_env()
                client.ping()
            except Exception as e:
                raise SandboxError(
                    f"Docker engine not reachable at {host or 'DOCKER_HOST/default socket'}: {e}. "
                    "Start dockerd, or use backend='local'.") from e
            if host not in _REAPED:  # once per engine and process: a dead run's leftovers stay dead
                _REAPED.add(host)
                removed = containers.reap(client)
                if removed:
                    log.info("removed %d leftover containers of dead runs on %s", removed, host or "default")
            self._ensure_image(client, build_missing)
            self._clients.append(client)

    def _ensure_image(self, client: Any, build_missing: bool) -> None:
        """Project images are (re)built when missing or stale; others must exist."""
        import docker
        from nextstate import containers
        name = self.spec.image.split("/")[-1].split(":")[0]
        known = (Path(containers.__file__).parent / name / "Dockerfile").exists()
        if build_missing and self.spec.image == f"nextstate/{name}:latest" and known:
            containers.ensure_image(name, client=client)  # a hash check when current
            return
        try:
            client.images.get(self.spec.image)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {self.spec.image} not found; build it with "
                               f"`python -m containers build` or `docker build`") from None

    # -- making and dropping sandboxes -------------------------------------------
    def _new_sandbox(self) -> Sandbox:
        if self.backend == "local":
            return LocalSandbox(self.spec)
        from nextstate import containers
        with self._lock:
            idx = min(range(len(self._clients)), key=lambda i: self._per_client[i])
            self._per_client[idx] += 1
        try:
            sb = DockerSandbox(self.spec, self._clients[idx], containers.owner_labels(self.run_id),
                               baseline=self.reset == "verified")
        except BaseException:
            with self._lock:
                self._per_client[idx] -= 1
            raise
        sb._pool_client = idx  # type: ignore[attr-defined]
        return sb

    def _submit(self, fn: Callable[..., object], *args: object) -> bool:
        """Run ``fn`` on the pool's workers unless the pool is closed (checked under the lock,
        so a racing :meth:`close` can't shut the executor down in between)."""
        with self._lock:
            if self._closed:
                return False
            self._workers.submit(fn, *args)
            return True

    def _spawn(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._starting += 1
            self._workers.submit(self._start_one)

    def _start_one(self) -> None:
        if self._closed or _exiting:   # queued before the pool closed (or the process began to exit)
            with self._lock:
                self._starting -= 1
            return
        try:
            sb = self._new_sandbox()
        except Exception as e:
            log.error("could not start a sandbox: %s", e)
            self._failures.append(str(e))
            fatal = isinstance(e, SandboxConfigError)
            down = not fatal and not self._engine_answers()
            with self._lock:
                self._starting -= 1
                if fatal:  # no retry can help: fail the waiting leases now
                    self._fatal = e
                if down:   # fail the waiting leases now, keep trying to start below
                    self._unreachable = f"no Docker engine of the pool answers: {e}"
                waiters = list(self._waiters) if fatal or down else []
                if waiters:
                    self._waiters.clear()
            for w in waiters:
                w(None)
            if fatal:
                return
            if not self._closed:
                time.sleep(min(5.0, 0.5 * len(self._failures)))
                self._spawn()
            return
        with self._lock:
            self._starting -= 1
            self._unreachable = None
        self._failures.clear()
        self._put_ready(sb)

    def _engine_answers(self) -> bool:
        """Whether some engine of the pool answers a ping (always, for the local backend)."""
        if self.backend == "local":
            return True
        for client in self._clients:
            try:
                client.ping()
                return True
            except Exception:  # noqa: BLE001 - refused, timed out, gone: no answer
                continue
        return False

    def _no_sandbox(self) -> Exception:
        """Why a waiting lease got none: a config error, no engine answering, or the pool closed."""
        if self._fatal is not None:
            return SandboxConfigError(str(self._fatal))
        if self._unreachable is not None:
            return SandboxError(self._unreachable)
        return PoolClosed("the sandbox pool was closed while waiting")

    def _put_ready(self, sb: Sandbox) -> None:
        with self._lock:
            if self._closed:
                closing = True
            else:
                closing = False
                while self._waiters:
                    if self._waiters.popleft()(sb):
                        self._leased.add(sb)
                        return
                self._ready.append(sb)
        if closing:
            self._destroy(sb)

    def _destroy(self, sb: Sandbox) -> None:
        try:
            sb.close()
        finally:
            idx = getattr(sb, "_pool_client", None)
            if idx is not None:
                with self._lock:
                    self._per_client[idx] -= 1

    # -- leasing ----------------------------------------------------------------
    def _take_ready(self) -> Sandbox | None:
        down = self._unreachable is not None and not self._engine_answers()   # back: wait for a start
        with self._lock:
            if self._closed:
                raise PoolClosed("the sandbox pool is closed")
            if self._fatal is not None and not self._ready:
                raise SandboxConfigError(str(self._fatal))
            if down and self._unreachable is not None and not self._ready:
                raise SandboxError(self._unreachable)
            if self._ready:
                sb = self._ready.popleft()
                self._leased.add(sb)
                return sb
        return None

    def lease(self, timeout: float | None = None) -> Sandbox:
        """A ready sandbox; waits for one up to ``timeout`` seconds (None: forever)."""
        sb = self._take_ready()
        if sb is not None:
            return sb
        got: list[Sandbox] = []
        event = threading.Event()

        def waiter(s: Sandbox | None) -> bool:
            if event.is_set():  # caller gave up
                return False
            if s is not None:
                got.append(s)
            event.set()
            return True

        with self._lock:
            if self._ready:  # filled between the two looks
                sb = self._ready.popleft()
                self._leased.add(sb)
                return sb
            self._waiters.append(waiter)
            self._start_on_demand()
        if not event.wait(timeout):
            with self._lock:
                if not got:
                    event.set()
                    raise PoolTimeout(self._timeout_message(timeout))
        if not got:
            raise self._no_sandbox()
        return got[0]

    async def alease(self, timeout: float | None = None) -> Sandbox:
        """Asyncio version of :meth:`lease`; never blocks the event loop."""
        sb = self._take_ready()
        if sb is not None:
            return sb
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Sandbox] = loop.create_future()

        def deliver(s: Sandbox | None) -> None:
            if s is None:
                if not fut.done():
                    fut.set_exception(self._no_sandbox())
            elif fut.done():  # cancelled meanwhile: give it back
                with self._lock:
                    self._leased.discard(s)
                self._put_ready(s)
            else:
                fut.set_result(s)

        def waiter(s: Sandbox | None) -> bool:
            if fut.done():
                return False
            loop.call_soon_threadsafe(deliver, s)
            return True

        with self._lock:
            if self._ready:
                sb = self._ready.popleft()
                self._leased.add(sb)
                return sb
            self._waiters.append(waiter)
            self._start_on_demand()
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise PoolTimeout(self._timeout_message(timeout)) from None

    def _start_on_demand(self) -> None:
        """(Lock held.) A pool that is not kept warm starts a sandbox for a waiting lease, while
        fewer than ``size`` are leased or starting and no reset under way will serve that lease."""
        if not self.warm and not self._closed and len(self._leased) + self._starting < self.size \
                and len(self._waiters) > len(self._resetting):
            self._starting += 1
            self._workers.submit(self._start_one)

    def _timeout_message(self, timeout: float | None) -> str:
        msg = f"no sandbox became free within {timeout}s (pool size {self.size}, {len(self._leased)} leased)"
        if self._failures:
            msg += f"; recent start failures: {self._failures[-1]}"
        return msg

    def release(self, sb: Sandbox) -> None:
        """Give a leased sandbox back. Safe to call twice or after the pool closed."""
        with self._lock:
            if sb not in self._leased:
                return
            self._leased.discard(sb)
            reuse = self.reset == "reuse" and not self._closed
            if self.reset == "verified" and not self._closed:
                self._starting += 1   # counted as starting while it resets
                self._resetting.add(sb)
                self._workers.submit(self._reset_one, sb)
                return
        if reuse and sb.is_alive():
            self._put_ready(sb)
            return
        self._replace(sb)

    def _reset_one(self, sb: Sandbox) -> None:
        """Reset a released sandbox; ready again when verified, else replaced."""
        result = sb.reset() if not self._closed else None
        outcome = None if result is None else "verified" if result.verified else "discarded"
        with self._lock:
            self._starting -= 1
            self._resetting.discard(sb)
            if outcome:
                self.resets[outcome] += 1
                SandboxPool.all_resets[outcome] += 1
        if result is not None and result.verified:
            self._put_ready(sb)
            return
        if result is not None:
            self.discard_reasons.append("; ".join(result.problems))
            log.info("sandbox %s not reused: %s", sb.id, "; ".join(result.problems))
        self._replace(sb)

    def _replace(self, sb: Sandbox) -> None:
        """Remove ``sb`` in the background and start another (for a waiting lease only, when not warm)."""
        if not self._submit(self._destroy, sb):
            self._destroy(sb)
        if self.warm:
            self._spawn()
        else:
            with self._lock:
                if self._waiters:
                    self._start_on_demand()

    @contextmanager
    def leased(self, timeout: float | None = None) -> Iterator[Sandbox]:
        """``with pool.leased() as sb:`` -- lease, and always give back."""
        sb = self.lease(timeout)
        try:
            yield sb
        finally:
            self.release(sb)

    @asynccontextmanager
    async def aleased(self, timeout: float | None = None) -> AsyncIterator[Sandbox]:
        """``async with pool.aleased() as sb:``"""
        sb = await self.alease(timeout)
        try:
            yield sb
        finally:
            self.release(sb)

    # -- health --------------------------------------------------------------------
    def _watch(self, every: float = 2.0) -> None:
        """Replace idle sandboxes whose container or shell died."""
        while not self._closed:
            time.sleep(every)
            with self._lock:
                idle = list(self._ready)
            for sb in self._dead(idle):
                with self._lock:
                    try:
                        self._ready.remove(sb)
                    except ValueError:
                        continue  # leased meanwhile; its holder will see the error
                log.warning("sandbox %s died while idle; replacing it", sb.id)
                self._destroy(sb)
                if self.warm:
                    self._spawn()

    def _dead(self, idle: list[Sandbox]) -> list[Sandbox]:
        """The sandboxes of ``idle`` that are gone: one container listing per engine per sweep.

        An engine that cannot be listed right now marks none of its sandboxes dead.
        """
        if not idle:
            return []
        if self.backend == "local":
            return [sb for sb in idle if not sb.is_alive()]
        from nextstate import containers
        running: dict[int, set[str]] = {}
        for idx, client in enumerate(self._clients):
            try:
                listed = containers.project_containers(client, self.run_id, running=True)
            except Exception as e:
                log.debug("listing containers: %s", e)
                continue
            running[idx] = {c["Id"][:12] for c in listed}
        return [sb for sb in idle if getattr(sb, "_pool_client", None) in running
                and sb.id not in running[sb._pool_client]]  # type: ignore[attr-defined]

    def drop_idle(self, n: int) -> int:
        """Remove up to ``n`` idle sandboxes (in the background; a warm pool starts as many again);
        returns how many."""
        with self._lock:
            dropped = [self._ready.pop() for _ in range(min(n, len(self._ready)))]
        for sb in dropped:
            self._replace(sb)
        return len(dropped)

    def stats(self) -> dict[str, int]:
        """Counts of ready, leased and starting (or resetting) sandboxes, and of resets verified
        and discarded."""
        with self._lock:
            return {"ready": len(self._ready), "leased": len(self._leased), "starting": self._starting,
                    "size": self.size, "reset_verified": self.resets["verified"],
                    "reset_discarded": self.resets["discarded"]}

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until all ``size`` sandboxes are warm (useful before timing); at once for a
        pool not kept warm."""
        if not self.warm:
            return
        deadline = time.monotonic() + timeout
        while len(self._ready) + len(self._leased) < self.size:
            if time.monotonic() > deadline:
                raise PoolTimeout(self._timeout_message(timeout))
            time.sleep(0.05)

    # -- shutdown ----------------------------------------------------------------
    def close(self) -> None:
        """Remove every sandbox of this pool, leased ones included."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            boxes = list(self._ready) + list(self._leased)
            self._ready.clear()
            self._leased.clear()
            waiters = list(self._waiters)
            self._waiters.clear()
        for w in waiters:  # wake everyone still waiting: they raise PoolClosed
            w(None)
        self._workers.shutdown(wait=True, cancel_futures=True)
        boxes += self._resetting   # their resets were cancelled before they ran: nothing else removes them
        _each_at_once(self._destroy, boxes, width=16)
        if self.backend == "docker":
            from nextstate import containers
            for client in self._clients:
                containers.reap(client, run_id=self.run_id)
        _LIVE_POOLS.discard(self)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.size


def _each_at_once(fn: Callable[[Any], object], items: list[Any], width: int) -> None:
    """``fn(item)`` for every item, ``width`` at a time, in plain threads: an executor refuses new
    work once the interpreter is shutting down, which is when the atexit hook closes the pools left
    open. This thread is one of the ``width``. An item that raises is logged and the others go on;
    where no thread can be started, they run one after another here."""
    todo = collections.deque(items)

    def work() -> None:
        while True:
            try:
                item = todo.popleft()
            except IndexError:
                return
            try:
                fn(item)
            except Exception as e:  # one sandbox that fails to go must not keep the rest
                log.warning("closing %s: %s", getattr(item, "id", item), e)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(width, len(items)) - 1)]
    try:
        for t in threads:
            t.start()
    except RuntimeError:   # no new threads at this point of the shutdown
        pass
    work()
    for t in threads:
        if t.ident is not None:
            t.join()


_handlers_installed = False


def _close_all_pools() -> None:
    for pool in list(_LIVE_POOLS):
        try:
            pool.close()
        except Exception as e:  # never mask the exit
            log.error("closing pool %s: %s", pool.run_id, e)


def reap_live_pools() -> None:
    """Remove every live pool's sandboxes (and their disks) straight from the engines, taking no
    pool's lock: for a process about to exit at once (the pools are unusable afterwards)."""
    from nextstate import containers
    global _exiting
    _exiting = True   # a pool made from now on (an episode's retry) starts nothing
    pools = list(_LIVE_POOLS)
    for pool in pools:
        pool._closed = True   # no new sandboxes (a plain flag: the lock may be held for good)
    # Every start under way ends (each engine call is bounded) before the one reap that removes
    # what it made; starts still queued see the flag and never begin.
    deadline = time.monotonic() + START_GRACE
    while any(pool._starting for pool in pools) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pool in pools:
        for client in pool._clients:
            try:
                containers.reap(client, run_id=pool.run_id)
            except Exception as e:  # never mask the exit
                log.error("reaping pool %s: %s", pool.run_id, e)


def _install_exit_handlers() -> None:
    """Close every live pool at exit and on SIGTERM (then defer to the old handler).

    SIGINT needs no handler: its KeyboardInterrupt unwinds to the exit, where the atexit hook
    closes the pools (and a program that catches it to carry on keeps them). The SIGTERM
    handler closes the pools in a thread of its own: the interrupted frame may hold a lock
    that closing needs. A signal the process ignores (``nohup``, ``&``) stays ignored.
    """
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_close_all_pools)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_IGN, None):
        return

    def closing(signum: int) -> None:
        _close_all_pools()
        if previous == signal.SIG_DFL:   # then die of the signal, as without this handler
            os.kill(os.getpid(), signum)

    def handler(signum: int, frame: Any) -> None:
        if previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)   # a second SIGTERM ends the process at once
        threading.Thread(target=closing, args=(signum,), name="pool-closer").start()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
