"""Per-image pools shared by an env factory's envs (:class:`containers.image_pools.ImagePools`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nextstate.containers.image_pools import ImagePools
from nextstate.containers.pool import SandboxPool

pytestmark = pytest.mark.filterwarnings("ignore:.*isolate far less:RuntimeWarning")


def local_pool(size: int) -> SandboxPool:
    """A pool as an env makes one for a task's image (not kept warm), on the local backend; "reuse"
    stands in for a verified reset, which the local backend cannot do."""
    return SandboxPool(size=size, backend="local", reset="reuse", warm=False)


def test_envs_share_a_pool_per_key_and_its_idle_sandboxes():
    pools = ImagePools(size=2, max_idle=4)
    try:
        a, first = pools.lease("img-a", local_pool, 30)   # one env's episode
        first.run("echo one > /tmp/mark-shared")
        a.release(first)
        again, second = pools.lease("img-a", local_pool, 30)   # another env's, same image
        assert again is a and a.size == 2 and second is first
        b, other = pools.lease("img-b", local_pool, 30)
        assert b is not a and other is not first
        a.release(second)
        assert pools.stats() == {"pools": 2, "ready": 1, "leased": 1, "starting": 0}
    finally:
        pools.close()
    assert a._closed and b._closed


def test_idle_sandboxes_are_bounded_and_emptied_pools_closed():
    pools = ImagePools(size=2, max_idle=1)
    try:
        a, sa = pools.lease("a", local_pool, 30)
        a.release(sa)
        b, sb = pools.lease("b", local_pool, 30)
        b.release(sb)
        assert a.stats()["ready"] == 1 and b.stats()["ready"] == 1
        c, held = pools.lease("c", local_pool, 30)   # over the bound: the least recently used pool gives its sandbox up
        assert a._closed and not b._closed and not c._closed
        assert pools.stats() == {"pools": 2, "ready": 1, "leased": 1, "starting": 0}
        d, sd = pools.lease("d", local_pool, 30)   # a pool with a sandbox leased is never closed
        assert not c._closed and not d._closed
        for p, sandbox in ((c, held), (d, sd)):
            p.release(sandbox)
    finally:
        pools.close()


def test_bad_bounds_and_a_closed_set_say_so():
    with pytest.raises(ValueError, match="size must be at least 1"):
        ImagePools(size=0, max_idle=1)
    pools = ImagePools(size=1, max_idle=0)
    pools.close()
    with pytest.raises(RuntimeError, match="closed"):
        pools.lease("a", local_pool)


@pytest.mark.docker
def test_a_factorys_envs_reuse_each_others_verified_sandboxes(tmp_path: Path) -> None:
    """Two envs of one factory, one after the other on a task with its own image: the second
    leases the first's sandbox after its verified reset."""
    from nextstate.train.config import load_config
    from nextstate.train.wiring import make_envs
    from test_terminal_env import FINISH, call, make_task

    img_dir = make_task(tmp_path, "nstest-shared", dockerfile=(
        "ARG BASE=nextstate/terminal:latest\nFROM ${BASE}\nRUN echo built > /app/marker\n"))
    seen = {}
    for pools in ("shared", "per-env"):
        cfg = load_config("terminal", overrides=[f"env.tasks={img_dir}", "rollout.parallel=2",
                                                 "env.sandbox_reset=verified", f"env.image_pools={pools}"])
        pool, factory, _ = make_envs(cfg)
        assert pool is None
        ids = []
        try:
            for _ in range(2):
                env = factory()
                try:
                    env.reset(options={"task": "nstest-shared"})
                    env.step(call("bash", command="cat /app/marker"))
                    ids.append(env.sandbox.id)
                    env.step(FINISH)
                finally:
                    env.close()   # the next env's lease waits for this sandbox's reset
        finally:
            factory.close()
        seen[pools] = ids
    assert seen["shared"][0] == seen["shared"][1]      # the second env got the first's sandbox back
    assert seen["per-env"][0] != seen["per-env"][1]    # each env's own pool closed with it
