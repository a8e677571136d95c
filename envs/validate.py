"""Oracle check of a task set: the reference solution must score +1, doing nothing must not.

A family's check is the ``validator`` of its record in :mod:`envs.registry`;
a check gets an env (one per worker thread, all sharing one sandbox pool) and
a task, and returns ``None`` when the task is sound or the reason it is not.
Families that name none get :func:`check_oracles`, which plays the env's
``oracle_actions``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable

from tqdm import tqdm

from envs import registry
from envs.base import NextStateEnv, Task, play
from envs.pool import EnvCache

CheckFn = Callable[[NextStateEnv, Task], "str | None"]


@dataclass
class Check:
    """The verdict on one task."""

    task_id: str
    ok: bool
    reason: str = ""


def validator(family: str) -> tuple[type[NextStateEnv], CheckFn]:
    """The env class and check of ``family`` (from its registry record)."""
    if family not in registry.names():
        raise ValueError(f"no validator for {family!r}; known: {', '.join(registry.names())}")
    record = registry.spec(family)
    return record.env_class(), record.check()


def validate(family: str, tasks: Any = None, *, parallel: int = 4, backend: str = "auto",
             progress: bool = True) -> list[Check]:
    """Check every task of ``family`` (from ``tasks``, default the built-in set) on ``parallel`` workers.

    With ``progress``, shows a progress bar and prints each failure as it comes.
    """
    env_cls, check = validator(family)
    probe = env_cls(tasks, backend=backend)
    loaded = probe.tasks
    probe.close()
    pool = env_cls.shared_pool(loaded, parallel, backend=backend)
    envs = EnvCache(lambda: env_cls(loaded, pool=pool, backend=backend))

    def one(task: Task) -> Check:
        with envs.env() as env:
            try:
                reason = check(env, task)
            except Exception as e:  # a broken task must not stop the others
                reason = f"{type(e).__name__}: {e}"
        return Check(task.id, reason is None, reason or "")

    checks = []
    try:
        with ThreadPoolExecutor(parallel) as ex, tqdm(total=len(loaded), desc=f"validate {family}",
                                                      unit="task", disable=not progress) as bar:
            for fut in as_completed([ex.submit(one, t) for t in loaded]):
                checks.append(fut.result())
                bar.update()
                if progress and not checks[-1].ok:
                    tqdm.write(f"FAIL {checks[-1].task_id}: {checks[-1].reason}")
    finally:
        envs.close()
        if pool is not None:
            pool.close()
    return sorted(checks, key=lambda c: c.task_id)


def _why(info: dict[str, Any]) -> str:
    """What the outcome says went wrong: its reason, or the tests that did not pass."""
    outcome = info.get("outcome", {})
    failed = [name for name, status in outcome.get("tests", {}).items() if status != "passed"]
    if outcome.get("reason") or not failed:
        return str(outcome.get("reason") or outcome)
    return f"failed: {', '.join(failed)}; log: ...{outcome.get('log_tail', '')[-400:]}"


def check_oracles(env: NextStateEnv, task: Task) -> str | None:
    """The env's scripted reference solution must score +1; doing nothing must not."""
    reason = env.skip_reason(task)
    if reason:
        return f"skipped: {reason}"
    env.reset(options={"task": task})
    try:
        gold = env.oracle_actions(task, "gold")
    except (LookupError, ValueError, NotImplementedError) as e:
        return str(e)
    reward, info = play(env, gold)
    if reward < 1:
        return f"the reference solution scored {reward:+.2f}: {_why(info)}"
    env.reset(options={"task": task})
    reward, _ = play(env, env.oracle_actions(task, "noop"))
    if reward >= 1:
        return "doing nothing already scores +1"
    return None
