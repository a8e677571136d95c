"""The sandbox pool on a real Docker engine: leasing, replacement, reaping."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nextstate import containers
from nextstate.envs.pool import EnvCache, PoolClosed, PoolTimeout, SandboxPool
from nextstate.containers.fifo_shell import FifoShell
from nextstate.containers.protocol import SandboxError

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[1]


def test_lease_release_replaces_with_a_fresh_sandbox(terminal_image, docker_client):
    with SandboxPool(terminal_image, size=2, backend="docker") as pool:
        pool.wait_ready(120)
        sb = pool.lease()
        sb.run("echo secret > /app/leak")
        first = sb.id
        pool.release(sb)
        pool.wait_ready(120)
        seen = set()
        for _ in range(2):
            with pool.leased() as other:
                seen.add(other.id)
                assert other.run("cat /app/leak").exit_code != 0  # nothing leaks
        assert first not in seen
        labels = containers.project_containers(docker_client, pool.run_id)[0]["Labels"]
        assert labels[containers.PID_LABEL] == str(os.getpid())
    assert containers.project_containers(docker_client, pool.run_id) == []


def test_lease_timeout_and_close_wake_waiters(terminal_image):
    pool = SandboxPool(terminal_image, size=1, backend="docker")
    held = pool.lease(timeout=120)
    with pytest.raises(PoolTimeout, match="no sandbox became free"):
        pool.lease(timeout=0.2)
    with ThreadPoolExecutor(1) as ex:
        waiting = ex.submit(pool.lease)
        time.sleep(0.2)
        pool.close()
        with pytest.raises(PoolClosed):
            waiting.result(timeout=30)
    pool.release(held)  # after close: harmless


def test_killed_container_is_replaced_and_holder_gets_an_error(terminal_image, docker_client):
    with SandboxPool(terminal_image, size=2, backend="docker") as pool:
        pool.wait_ready(120)
        held = pool.lease()
        docker_client.containers.get(held.id).kill()
        with pytest.raises(SandboxError):
            held.run("echo hi", timeout=5)
        pool.release(held)
        # an idle one killed from outside is noticed by the monitor and replaced
        idle = pool._ready[0]
        docker_client.containers.get(idle.id).kill()
        deadline = time.monotonic() + 60
        while idle in pool._ready and time.monotonic() < deadline:
            time.sleep(0.2)
        assert idle not in pool._ready
        for _ in range(2):
            with pool.leased(timeout=120) as sb:
                assert sb.run("echo ok").stdout == "ok\n"


def test_a_pool_not_kept_warm_starts_sandboxes_on_demand_and_keeps_none(terminal_image, docker_client):
    with SandboxPool(terminal_image, size=2, backend="docker", warm=False) as pool:
        pool.wait_ready(1)   # returns at once: nothing to wait for
        assert containers.project_containers(docker_client, pool.run_id) == []
        a, b = pool.lease(timeout=120), pool.lease(timeout=120)
        assert a.id != b.id and a.run("echo hi").stdout == "hi\n"
        with ThreadPoolExecutor(1) as ex:   # a third lease waits for a release, then gets a fresh one
            third = ex.submit(pool.lease, 120)
            time.sleep(0.5)
            assert not third.done()
            pool.release(a)
            c = third.result(timeout=120)
        assert c.id not in (a.id, b.id)
        pool.release(b)
        pool.release(c)
        deadline = time.monotonic() + 60    # released sandboxes go, and none is started in their place
        while containers.project_containers(docker_client, pool.run_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert containers.project_containers(docker_client, pool.run_id) == []
        assert pool.stats() == {"ready": 0, "leased": 0, "starting": 0, "size": 2,
                                "reset_verified": 0, "reset_discarded": 0}


def test_32_concurrent_leases_from_threads(terminal_image):
    with SandboxPool(terminal_image, size=8, backend="docker") as pool:
        def episode(i: int) -> str:
            with pool.leased(timeout=300) as sb:
                return sb.run(f"echo {i}").stdout.strip()
        with ThreadPoolExecutor(32) as ex:
            assert sorted(ex.map(episode, range(32)), key=int) == [str(i) for i in range(32)]


async def test_32_concurrent_leases_from_asyncio(terminal_image):
    with SandboxPool(terminal_image, size=8, backend="docker") as pool:
        async def episode(i: int) -> str:
            async with pool.aleased(timeout=300) as sb:
                r = await asyncio.to_thread(sb.run, f"echo {i}")
                return r.stdout.strip()
        got = await asyncio.gather(*(episode(i) for i in range(32)))
        assert got == [str(i) for i in range(32)]
        # a cancelled waiter does not lose a sandbox
        held = [await pool.alease() for _ in range(8)]
        waiter = asyncio.create_task(pool.alease())
        await asyncio.sleep(0.1)
        waiter.cancel()
        for sb in held:
            pool.release(sb)
        pool.wait_ready(120)
        assert pool.stats()["ready"] == 8


def spawn_pool_owner(image: str, run_id: str, then: str = "time.sleep(600)") -> subprocess.Popen:
    """A separate Python process holding a warm pool of 2 under ``run_id``, then doing ``then``."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from nextstate.envs.pool import SandboxPool
        pool = SandboxPool({image!r}, size=2, backend="docker", run_id={run_id!r})
        pool.wait_ready(120)
        print("ready", flush=True)
        {then}
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_sigkilled_owner_leaves_nothing_after_reap(terminal_image, docker_client):
    proc = spawn_pool_owner(terminal_image, "sigkill-test")
    try:
        assert len(containers.project_containers(docker_client, "sigkill-test")) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    removed = containers.reap(docker_client)
    assert removed >= 2
    assert containers.project_containers(docker_client, "sigkill-test") == []


def test_sigterm_closes_the_pool(terminal_image, docker_client):
    proc = spawn_pool_owner(terminal_image, "sigterm-test")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) != 0
    assert containers.project_containers(docker_client, "sigterm-test") == []


def test_a_pool_left_open_is_closed_when_its_process_ends(terminal_image, docker_client):
    """The atexit hook removes its containers, though the interpreter takes no new executor work by
    then (it used to log "cannot schedule new futures after interpreter shutdown" and leave them)."""
    proc = spawn_pool_owner(terminal_image, "exit-test", then="pass")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "ERROR" not in err, err
    assert containers.project_containers(docker_client, "exit-test") == []


def test_pool_spans_several_engine_urls(terminal_image):
    sock = "unix:///var/run/docker.sock"
    with SandboxPool(terminal_image, size=2, backend="docker", hosts=[sock, sock]) as pool:
        pool.wait_ready(120)
        assert len(pool._clients) == 2
        assert sorted(pool._per_client.values()) == [1, 1]  # spread over both


def test_local_backend_pool_warns_and_works():
    with pytest.warns(RuntimeWarning, match="isolate far less"):
        pool = SandboxPool(size=1, backend="local")
    with pool, pool.leased(timeout=30) as sb:
        assert sb.run("echo hi").stdout == "hi\n"


def test_work_is_handed_to_the_workers_under_the_lock():
    """release() and the respawn check ``closed`` and submit in one critical section, so a
    close() racing them can't shut the executor down in between (RuntimeError: cannot
    schedule new futures after shutdown)."""
    with pytest.warns(RuntimeWarning):
        pool = SandboxPool(size=1, backend="local")
    real = pool._workers

    class Checked:
        def submit(self, fn, *args):
            assert pool._lock.locked() and not pool._closed, "submitted outside the lock"
            return real.submit(fn, *args)

        def shutdown(self, **kw):
            real.shutdown(**kw)

    with pool:
        pool._workers = Checked()
        with pool.leased(timeout=30) as sb:
            sb.run("true")
        pool.wait_ready(30)


class _CountedEnv:
    made = 0

    def __init__(self):
        type(self).made += 1
        self.closed = False

    def close(self):
        self.closed = True


def test_env_cache_reuses_idle_envs_and_closes_every_env_it_made():
    cache = EnvCache(_CountedEnv)
    with ThreadPoolExecutor(3) as ex:   # three at once: three envs, then only reuse
        def hold(_):
            with cache.env():
                time.sleep(0.05)
        list(ex.map(hold, range(3)))
        list(ex.map(hold, range(9)))
    assert len(cache.made) <= 3 and _CountedEnv.made == len(cache.made)

    async def episodes():
        env = await cache.atake(None)
        cache.give_back(env)
        return env is await cache.atake(None)   # the idle one comes back

    assert asyncio.run(episodes())
    made = list(cache.made)
    cache.close()
    assert all(env.closed for env in made) and cache.made == []


def test_a_forced_exit_waits_for_every_start_it_began(terminal_image, docker_client, monkeypatch):
    """The exit path of a Ctrl-C (``reap_live_pools``) waits for the starts under way, skips the
    queued ones and then reaps: nothing is left, however long a start takes. A wrapper slows each
    start past the 5 s the exit path used to wait (a stand-in for a loaded engine)."""
    import threading

    from nextstate.containers import pool as pool_module

    began = threading.Event()
    real = SandboxPool._new_sandbox

    def slow(self):
        began.set()
        time.sleep(6)
        return real(self)

    monkeypatch.setattr(SandboxPool, "_new_sandbox", slow)
    monkeypatch.setattr(pool_module, "_exiting", False)   # set by the exit path: restored afterwards
    pool = SandboxPool(terminal_image, size=3, backend="docker", start_workers=1, run_id="pytest-exit-starts")
    try:
        assert began.wait(60)
        pool_module.reap_live_pools()
        deadline = time.monotonic() + 90
        while pool._starting and time.monotonic() < deadline:   # starts that outlived the exit path
            time.sleep(0.1)
        assert containers.project_containers(docker_client, "pytest-exit-starts") == []
    finally:
        containers.reap(docker_client, run_id="pytest-exit-starts")


class EngineDoor:
    """A Unix socket that forwards to the host's Docker engine, bytes both ways: a pool on it sees
    the real engine, and :meth:`close` makes that engine vanish for it (refused connections,
    broken streams) the way a dead ``dockerd`` does, without touching the engine itself."""

    def __init__(self, path: Path, engine: str = "/var/run/docker.sock"):
        import socket
        import threading
        self.path, self.engine = path, engine
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.conns: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.engine)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(2)

    def close(self) -> None:
        self.listener.close()
        for s in self.conns:
            with contextlib.suppress(OSError):
                s.shutdown(2)


@pytest.mark.parametrize("transport", ["exec", "auto"])
def test_engine_that_stops_answering_fails_leases_at_once_and_the_pool_recovers(terminal_image, tmp_path, transport):
    """While no engine of the pool answers, a lease raises SandboxError at once (not after its
    timeout); a leased sandbox's command raises too on the exec stream, and is answered on FIFOs
    (the default here: its streams do not pass through the engine, and its container still runs).
    When the engine answers again, so does the pool."""
    if not Path("/var/run/docker.sock").exists() or os.environ.get("DOCKER_HOST"):
        pytest.skip("forwards to the local engine's socket")
    sock = tmp_path / "engine.sock"
    door = EngineDoor(sock)
    pool = SandboxPool(terminal_image, size=1, backend="docker", hosts=[f"unix://{sock}"], transport=transport)
    try:
        pool.wait_ready(120)
        held = pool.lease(timeout=5)
        door.close()
        if transport == "exec":
            with pytest.raises(SandboxError):
                held.run("echo hi")
        else:
            assert isinstance(held._shell, FifoShell) and held.run("echo hi").stdout == "hi\n"
        pool.release(held)
        started = time.monotonic()
        with pytest.raises(SandboxError, match="no Docker engine of the pool answers"):
            pool.lease(timeout=120)
        assert time.monotonic() - started < 60      # the failed start's ping, not the 120 s timeout
        sock.unlink()
        door = EngineDoor(sock)                     # the engine is back
        with pool.leased(timeout=120) as sb:
            assert sb.run("echo back").output.strip() == "back"
    finally:
        pool.close()
        door.close()
        containers.reap(run_id=pool.run_id)


def test_the_local_backend_asked_for_by_name_is_not_called_a_missing_docker():
    with pytest.warns(RuntimeWarning, match="^The local backend: sandboxes run as local shells"):
        pool = SandboxPool("nextstate/terminal:latest", size=1, backend="local", warm=False)
    pool.close()
