"""The step gate: places taken in arrival order, never more than its size, a long command leaves
it, an interrupted waiter gives its place back, and a forked child starts with every place free."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from nextstate.containers import gate as gates
from nextstate.containers.gate import StepGate
from nextstate.containers.local_sandbox import LocalSandbox
from nextstate.containers.pool import SandboxPool
from nextstate.containers.protocol import SandboxConfigError, SandboxSpec


def _queued(gate: StepGate, n: int) -> None:
    """Wait until ``n`` threads are queued at ``gate``."""
    for _ in range(10_000):
        if len(gate._queue) >= n:
            return
        threading.Event().wait(0.001)
    raise AssertionError(f"{n} waiters never queued: {gate}")


def test_places_go_in_arrival_order():
    gate = StepGate(1)
    first = gate.enter()
    order: list[int] = []

    def step(i: int) -> None:
        t = gate.enter()
        order.append(i)
        t.leave()

    threads = []
    for i in range(6):
        th = threading.Thread(target=step, args=(i,))
        th.start()
        _queued(gate, i + 1)   # each one queues before the next arrives
        threads.append(th)
    first.leave()
    for th in threads:
        th.join(10)
    assert order == list(range(6))
    assert gate._free == 1 and not gate._queue


def test_never_more_holders_than_places():
    gate, inside, most, lock = StepGate(3), [0], [0], threading.Lock()

    def step() -> None:
        for _ in range(200):
            t = gate.enter()
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            threading.Event().wait(0.0001)
            with lock:
                inside[0] -= 1
            t.leave()
            t.leave()   # a second leave does nothing

    threads = [threading.Thread(target=step) for _ in range(12)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert most[0] == 3
    assert gate._free == 3 and not gate._queue


def test_a_long_command_leaves_the_gate_and_holds_no_one_up():
    """One place: a `sleep` in one sandbox does not keep a command of another waiting; it leaves
    the gate (after ``hold``) while it still runs. Without that the quick command would return
    after the sleep."""
    entered = threading.Event()

    class Noting(StepGate):
        def enter(self):
            ticket = super().enter()
            entered.set()
            return ticket

    gate = Noting(1, hold=0.01)
    a, b = LocalSandbox(SandboxSpec(image="local")), LocalSandbox(SandboxSpec(image="local"))
    a.gate = b.gate = gate
    try:
        slow = threading.Thread(target=a.run, args=("sleep 5",))
        slow.start()
        assert entered.wait(30)
        res = b.run("echo quick")
        assert res.stdout == "quick\n" and res.exit_code == 0
        assert slow.is_alive(), "the quick command waited for the slow one to end"
        slow.join(30)
    finally:
        a.close()
        b.close()
    assert gate._free == 1 and not gate._queue


def test_a_waiter_interrupted_in_line_gives_its_place_back():
    gate = StepGate(1)
    held = gate.enter()

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(KeyboardInterrupt):
            gate.enter()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not gate._queue
    held.leave()
    assert gate._free == 1
    gate.enter().leave()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_finds_every_place_free():
    gate = StepGate(2)
    held = [gate.enter(), gate.enter()]
    pid = os.fork()
    if pid == 0:   # the child: a place at once, or SIGALRM's default action ends it
        signal.alarm(10)
        gate.enter().leave()
        os._exit(0 if gate._free == 2 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for t in held:
        t.leave()


def test_size_from_the_environment(monkeypatch):
    monkeypatch.setattr(gates, "_BY_ENGINE", {})
    monkeypatch.delenv("NEXTSTATE_STEP_GATE", raising=False)
    assert gates.engine_gate("a", 3).size == 3 * gates.PER_CPU
    assert gates.engine_gate("a", 99) is gates.engine_gate("a", 1)   # one per engine
    asked = []
    assert gates.engine_gate("b", lambda: asked.append(1) or 2).size == 2 * gates.PER_CPU
    gates.engine_gate("b", lambda: asked.append(1) or 2)
    assert asked == [1]
    monkeypatch.setenv("NEXTSTATE_STEP_GATE", "0")
    assert gates.engine_gate("c", 2) is None
    monkeypatch.setenv("NEXTSTATE_STEP_GATE", "5")
    assert gates.engine_gate("d", 2).size == 5
    for bad in ("many", "-1"):
        monkeypatch.setenv("NEXTSTATE_STEP_GATE", bad)
        with pytest.raises(ValueError, match="NEXTSTATE_STEP_GATE"):
            gates.engine_gate(f"e{bad}", 2)


def test_a_bad_gate_size_fails_a_pools_lease_at_once(monkeypatch):
    """A broken setting is the sandbox's configuration: no retry can help, so the lease fails."""
    monkeypatch.setattr(gates, "_BY_ENGINE", {})
    monkeypatch.setenv("NEXTSTATE_STEP_GATE", "eight")
    with pytest.warns(RuntimeWarning), SandboxPool("local", size=1, backend="local") as pool:
        with pytest.raises(SandboxConfigError, match="NEXTSTATE_STEP_GATE must be a number"):
            pool.lease(timeout=60)
