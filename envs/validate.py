"""Oracle check of a task set: the reference solution must score +1, doing nothing must not.

A family's check is the ``validator`` of its record in :mod:`envs.registry`;
a check gets an env (one per worker thread, all sharing one sandbox pool) and
a task, and returns ``None`` when the task is sound or the reason it is not.
Families that name none get :func:`check_oracles`, which plays the env's
``oracle_actions``.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable

from tqdm import tqdm

from nextstate.envs import registry
from nextstate.envs.base import NextStateEnv, Task, play
from nextstate.envs.pool import EnvCache

CheckFn = Callable[[NextStateEnv, Task], "str | None"]
#: Failures of the machinery, not of the task or the agent: (pattern of a one-line reason, class).
INFRASTRUCTURE = (
    (r"could not reach ([\w.-]+)", "unreachable host {0}"),
    (r"the build had no network", "no network"),
    (r"a TLS certificate was not trusted", "untrusted TLS certificate"),
    (r"base image (\S+) is not here|image (\S+) not found; build it", "missing base {0}"),
    (r"stopped answering|sandbox shell did not start|cannot start a shell|Docker engine not reachable|"
     r"no Docker engine of the pool answers", "sandbox died"),
    (r"the test runner could not start", "test runner did not start"),
    (r"holds no git repository for (\S+)", "missing repository {0}"),
)


@dataclass
class Check:
    """The verdict on one task."""

    task_id: str
    ok: bool
    reason: str = ""
    seconds: float | None = None  # None: never ran (it could not be loaded)

    @property
    def infrastructure(self) -> str | None:
        """The infrastructure class of a failure (:func:`infrastructure`); None for a pass or the task's own."""
        return None if self.ok else infrastructure(self.reason)

    def line(self) -> str:
        """``ok   ID  (12.3 s)``, ``FAIL ID  (12.3 s): reason``, or for an infrastructure failure
        ``FAIL ID  (12.3 s) [infrastructure: class]: reason``."""
        took = "" if self.seconds is None else f"  ({self.seconds:.1f} s)"
        if self.ok:
            return f"ok   {self.task_id}{took}"
        infra = f" [infrastructure: {self.infrastructure}]" if self.infrastructure else ""
        return f"FAIL {self.task_id}{took}{infra}: {self.reason}"


def infrastructure(reason: str) -> str | None:
    """The infrastructure failure a one-line reason tells of (a host the build could not reach, named;
    no network; a missing base image; a sandbox that died; a test runner that could not start), or
    None: the task's (or the agent's) own failure."""
    for pattern, label in INFRASTRUCTURE:
        found = re.search(pattern, reason)
        if found:
            return label.format(next((g for g in found.groups() if g), ""))
    return None


def summary(checks: list[Check]) -> str:
    """``3 passed, 2 failed``, and where some failures are the infrastructure's, how many of each class:
    ``3 passed, 2 failed (1 the tasks' own; infrastructure: 1 unreachable host github.com)``."""
    failed = [c for c in checks if not c.ok]
    text = f"{len(checks) - len(failed)} passed, {len(failed)} failed"
    infra = Counter(c.infrastructure for c in failed if c.infrastructure)
    if infra:
        own = len(failed) - sum(infra.values())
        text += f" ({own} the tasks' own; infrastructure: {', '.join(f'{n} {k}' for k, n in sorted(infra.items()))})"
    return text


def validator(family: str) -> tuple[type[NextStateEnv], CheckFn]:
    """The env class and check of ``family`` (from its registry record)."""
    if family not in registry.names():
        raise ValueError(f"no validator for {family!r}; known: {', '.join(registry.names())} "
                         "(a family of your own: MODULE:NAME, or NAME for a module of that name)")
    record = registry.spec(family)
    return record.env_class(), record.check() or check_oracles


def validate(family: str, tasks: Any = None, *, parallel: int = 4, backend: str = "auto",
             progress: bool = True, env_kwargs: dict[str, Any] | None = None) -> list[Check]:
    """Check every task of ``family`` (from ``tasks``, default the built-in set) on ``parallel`` workers.

    A task that cannot be loaded, built or started fails with its reason; the
    others still run. With ``progress``, shows a progress bar and prints a line
    per task as it finishes (verdict, seconds, and why a failure failed). ``env_kwargs`` go to the env (e.g. ``user``).
    """
    env_cls, check = validator(family)
    kw = dict(env_kwargs or {})
    load_set = getattr(env_cls, "load_task_set", None)
    if load_set is not None:
        loaded, broken = load_set(tasks)
    else:
        probe = env_cls(tasks, backend=backend, **kw)
        loaded, broken = probe.tasks, []
        probe.close()
    failed = [Check(name, False, f"could not load: {why}") for name, why in broken]
    if progress:
        for c in failed:
            tqdm.write(c.line())
    if not loaded:
        if not failed:
            raise ValueError(f"no {family} tasks found in {tasks}")
        return sorted(failed, key=lambda c: c.task_id)
    pool = env_cls.shared_pool(loaded, parallel, backend=backend)
    envs = EnvCache(lambda: env_cls(loaded, pool=pool, backend=backend, **kw))

    def one(task: Task) -> Check:
        start = time.monotonic()
        with envs.env() as env:
            try:
                reason = check(env, task)
            except Exception as e:  # a broken task must not stop the others
                reason = one_line(e)
        return Check(task.id, reason is None, reason or "", round(time.monotonic() - start, 1))

    checks = failed
    try:
        with ThreadPoolExecutor(parallel) as ex, tqdm(total=len(loaded), desc=f"validate {family}",
                                                      unit="task", disable=not progress) as bar:
            for fut in as_completed([ex.submit(one, t) for t in loaded]):
                checks.append(fut.result())
                bar.update()
                if progress:
                    tqdm.write(checks[-1].line())
    finally:
        envs.close()
        if pool is not None:
            pool.close()
    return sorted(checks, key=lambda c: c.task_id)


def one_line(error: BaseException) -> str:
    """An error as one line: its first line, and the last line of any output it carries
    (a failed image build's error)."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip() and not x.startswith("---")]
    text = lines[0] if lines else ""
    if len(lines) > 1:
        text += f" ... {lines[-1]}"
    return f"{type(error).__name__}: {text}"


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
