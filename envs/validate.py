"""Oracle check of a task set: the reference solution must score +1, doing nothing must not.

Each family registers a check with :func:`register_validator`; a check gets
an env (one per worker thread, all sharing one sandbox pool) and a task, and
returns ``None`` when the task is sound or the reason it is not. Families not
registered here are looked up by importing ``envs.<family>``, whose module
may register its own check.
"""

from __future__ import annotations

import importlib
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable

from tqdm import tqdm

from envs.base import NextStateEnv, Task
from envs.pool import SandboxPool
from envs.terminal import TerminalEnv
from envs.toolcall import ToolCallEnv

CheckFn = Callable[[NextStateEnv, Task], "str | None"]
_VALIDATORS: dict[str, tuple[type[NextStateEnv], CheckFn]] = {}
FINISH = {"name": "finish", "arguments": {}}


@dataclass
class Check:
    """The verdict on one task."""

    task_id: str
    ok: bool
    reason: str = ""


def register_validator(family: str, env_cls: type[NextStateEnv]) -> Callable[[CheckFn], CheckFn]:
    """Decorator: ``@register_validator("terminal", TerminalEnv)`` on a check function."""
    def wrap(fn: CheckFn) -> CheckFn:
        _VALIDATORS[family] = (env_cls, fn)
        return fn
    return wrap


def validator(family: str) -> tuple[type[NextStateEnv], CheckFn]:
    """The env class and check of ``family``."""
    if family not in _VALIDATORS:
        try:
            importlib.import_module(f"envs.{family}")
        except ImportError:
            pass
    if family not in _VALIDATORS:
        raise ValueError(f"no validator for {family!r}; known: {', '.join(sorted(_VALIDATORS))}")
    return _VALIDATORS[family]


def validate(family: str, tasks: Any = None, *, parallel: int = 4, backend: str = "auto",
             progress: bool = True) -> list[Check]:
    """Check every task of ``family`` (from ``tasks``, default the built-in set) on ``parallel`` workers.

    With ``progress``, shows a progress bar and prints each failure as it comes.
    """
    env_cls, check = validator(family)
    probe = env_cls(tasks, backend=backend)
    loaded = probe.tasks
    probe.close()
    pool = SandboxPool(env_cls.image, size=parallel, backend=backend) if env_cls.lease_at_reset else None
    local, envs = threading.local(), []

    def one(task: Task) -> Check:
        if not hasattr(local, "env"):
            local.env = env_cls(loaded, pool=pool, backend=backend)
            envs.append(local.env)
        try:
            reason = check(local.env, task)
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
        for env in envs:
            env.close()
        if pool is not None:
            pool.close()
    return sorted(checks, key=lambda c: c.task_id)


def _final_step(env: NextStateEnv, action: Any) -> tuple[float, dict[str, Any]]:
    """Play ``action``, which must end the episode; its reward and info."""
    _, reward, terminated, truncated, info = env.step(action)
    if "aborted" in info:
        raise RuntimeError(f"episode aborted: {info['aborted']}")
    if not (terminated or truncated):
        raise RuntimeError(f"{action} did not end the episode")
    return reward, info


def _failed_tests(info: dict[str, Any]) -> str:
    outcome = info.get("outcome", {})
    failed = [name for name, status in outcome.get("tests", {}).items() if status != "passed"]
    return outcome.get("reason") or f"failed: {', '.join(failed)}; log: ...{outcome.get('log_tail', '')[-400:]}"


@register_validator("terminal", TerminalEnv)
def check_terminal(env: NextStateEnv, task: Task) -> str | None:
    """Run ``solution.sh`` in the workdir, then finish: +1 expected; finishing at once: below +1."""
    if not task.data.get("solution"):
        return "the task has no solution.sh"
    env.reset(options={"task": task})
    sb = env.sandbox
    sb.write_file("/tmp/solution.sh", task.data["solution"], 0o755)
    timeout = float(task.data.get("max_agent_timeout_sec") or 600)
    ran = sb.run(f"cd {sb.spec.workdir} && bash /tmp/solution.sh; rc=$?; rm -f /tmp/solution.sh; "
                 "(exit $rc)", timeout=timeout)
    reward, info = _final_step(env, FINISH)
    if reward < 1:
        how = "timed out" if ran.timed_out else f"exited with {ran.exit_code}"
        return f"reference solution ({how}) scored {reward:+.2f}: {_failed_tests(info)}"
    env.reset(options={"task": task})
    reward, _ = _final_step(env, FINISH)
    if reward >= 1:
        return "doing nothing already passes every test"
    return None


@register_validator("toolcall", ToolCallEnv)
def check_toolcall(env: NextStateEnv, task: Task) -> str | None:
    """Answering the reference must score +1; answering ``\\boxed{}`` must not."""
    reference = task.data["answer"]
    env.reset(options={"task": task})
    reward, _ = _final_step(env, {"name": "answer", "arguments": {"answer": reference}})
    if reward < 1:
        return f"the reference answer {reference!r} is not accepted by math-verify"
    env.reset(options={"task": task})
    reward, _ = _final_step(env, {"name": "answer", "arguments": {"answer": "\\boxed{}"}})
    if reward >= 1:
        return "an empty answer is accepted"
    return None
