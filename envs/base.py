"""The contract every nextstate environment follows.

An episode is a conversation: ``reset`` shows a task, each ``step`` takes the
model's text (a tool call), runs it in a sandbox and returns what the tool
printed. The episode ends when the model calls a finishing tool or after
``max_steps`` steps; either way the final state is graded once
(:meth:`NextStateEnv.compute_outcome`) and that outcome is the reward of the
final step; every other step has reward 0.

A subclass declares ``family``, ``tools`` and ``default_max_steps`` and fills
in four hooks: :meth:`~NextStateEnv.load_tasks`, :meth:`~NextStateEnv.start_episode`,
:meth:`~NextStateEnv.call_tool` and :meth:`~NextStateEnv.compute_outcome`.
Parsing, validation, step counting, truncation, timing, sandbox leasing and
error handling live here once.

Observations: ``reset`` and ``step`` return whatever suits the family (a string
for terminal, tool-call and SWE; a dict with a PIL screenshot for GUI, as
OSWorld's users expect). Everything that *shows* an observation -- the chat
prompt, the step judge, the rollout log -- reads it only through
:meth:`NextStateEnv.present`, which turns it into one :class:`Observation`:
text, images, structured extras. A family whose observation is not a string
overrides ``present``; the default refuses anything else, so a new family
cannot leave the agent blind without an error.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import string
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable

import gymnasium
from gymnasium.error import ResetNeeded

from nextstate.envs.actions import MAX_ACTION_BYTES, ActionError, ToolCall, parse_action
from nextstate.containers.image_pools import ImagePools
from nextstate.containers.pool import PoolTimeout, SandboxPool
from nextstate.containers.protocol import DEFAULT_IMAGE, CommandResult, Sandbox, SandboxError, unsendable

log = logging.getLogger(__name__)
MAX_OBSERVATION_CHARS = 1 << 22
INFRA_ERRORS = (SandboxError, PoolTimeout)


class AnyText(gymnasium.spaces.Text):
    """A ``Text`` space for model text: it contains any ``str`` up to ``max_length`` characters.

    gymnasium's ``Text`` only contains strings over its charset, which no
    charset of model output satisfies; sampling (what ``check_env`` does)
    still draws printable ASCII.
    """

    def __init__(self, max_length: int):
        super().__init__(max_length, min_length=0, charset=string.printable)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


class TaskUnsupported(RuntimeError):
    """This environment cannot run the task here; ``reason`` says why. Report it skipped."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Task:
    """One problem: an id, what the model is told, and whatever the env needs to grade it."""

    id: str
    instruction: str
    data: dict[str, Any] = field(default_factory=dict)
    category: str = ""


@dataclass
class ToolResult:
    """What one tool call did. ``done`` ends the episode; ``extra`` goes into ``info["next_state"]``."""

    output: str
    exit_code: int | None = None
    done: bool = False
    timed_out: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Observation:
    """An observation as the agent and the judge are shown it (see :meth:`NextStateEnv.present`).

    ``text``: everything the model reads, laid out (the instruction, the step's
    output, an accessibility tree...). ``images``: PNG bytes, in the order the
    model sees them (a screenshot; empty for text families). ``extras``:
    structured fields for code and logs, never rendered into the prompt.
    """

    text: str
    images: list[bytes] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"Observation.text must be a str, got {type(self.text).__name__}")
        if any(not isinstance(im, bytes) for im in self.images):
            raise TypeError("Observation.images must be PNG bytes")

    @classmethod
    def of(cls, obs: Any) -> "Observation":
        """The default view: a string (or None) is text; an Observation is itself."""
        if isinstance(obs, Observation):
            return obs
        if obs is None or isinstance(obs, str):
            return cls("" if obs is None else obs)
        raise TypeError(f"cannot show a {type(obs).__name__} observation to the agent: the env "
                        "must override present() to turn it into an envs.base.Observation")


@dataclass
class Outcome:
    """The grade of a final state: ``reward`` in [-1, 1] and the details behind it."""

    reward: float
    details: dict[str, Any] = field(default_factory=dict)


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a task index: JSON lines (``.jsonl``) or a parquet file."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    if path.suffix != ".jsonl":
        raise ValueError(f"{path}: task files must be .jsonl or .parquet")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return rows


class NextStateEnv(gymnasium.Env):
    """Base of all nextstate environments: text actions, tools in a leased sandbox.

    Args:
        tasks: where the tasks come from (see :meth:`load_tasks`); ``None`` is
            the family's built-in set.
        pool: a shared :class:`SandboxPool` to lease from; without one (or for
            a task whose sandbox differs from the pool's) the env leases from
            ``image_pools`` or, without those, makes its own pools of size 1 and
            closes them in :meth:`close`.
        image_pools: per-image pools shared with other envs (an env factory's:
            :class:`~containers.image_pools.ImagePools`); their owner closes them.
        max_steps: steps before truncation (default ``default_max_steps``).
        step_timeout: default seconds a command may run.
        lease_timeout: seconds to wait for a free sandbox.
        render_mode: ``None`` or ``"ansi"`` (render returns the last observation).
        **pool_kwargs: passed to the pools the env makes itself
            (``backend="local"``, ``memory="2g"``, ...).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    family: ClassVar[str] = "base"
    tools: ClassVar[list[dict[str, Any]]] = []
    default_max_steps: ClassVar[int] = 10
    image: ClassVar[str] = DEFAULT_IMAGE
    lease_at_reset: ClassVar[bool] = True   # False: lease on first use of ``self.sandbox``
    max_private_pools: ClassVar[int] = 4
    sandbox_defaults: ClassVar[dict[str, Any]] = {}  # SandboxSpec fields this family needs (memory...)
    #: Why this family's sandboxes are never reused after a verified reset ("": they may be).
    fresh_sandbox: ClassVar[str] = ""

    @classmethod
    def make_pool(cls, size: int, **kwargs: Any) -> SandboxPool:
        """A pool of this family's sandboxes: its image and ``sandbox_defaults``, then ``kwargs``
        (``reset="verified"`` becomes ``"replace"`` for a family with a ``fresh_sandbox`` reason)."""
        kw = {"image": cls.image, **cls.sandbox_defaults, **kwargs}
        if cls.fresh_sandbox and kw.get("reset") == "verified":
            log.info("%s sandboxes are not reused: %s", cls.family, cls.fresh_sandbox)
            kw["reset"] = "replace"
        return SandboxPool(kw.pop("image"), size=size, **kw)

    @classmethod
    def shared_pool(cls, tasks: list[Task], size: int, **kwargs: Any) -> SandboxPool | None:
        """A pool of ``size`` warm sandboxes for ``tasks``, or None when none would be used: leasing
        happens later, or no task runs in the family's image (a SWE-bench row names its own)."""
        return cls.make_pool(size, **kwargs) if cls.lease_at_reset and cls.uses_family_image(tasks) else None

    @classmethod
    def uses_family_image(cls, tasks: list[Task]) -> bool:
        """Whether some of ``tasks`` run in the family's image (a shared pool of it would be used)."""
        return any(not cls.has_own_image(t) for t in tasks)

    @classmethod
    def has_own_image(cls, task: Task) -> bool:
        """Whether ``task`` runs in an image of its own rather than the family's (its episodes
        lease from a pool for that image, not from the shared one)."""
        return isinstance(task.data, dict) and task.data.get("image", cls.image) != cls.image

    def __init__(self, tasks: Any = None, *, pool: SandboxPool | None = None,
                 image_pools: ImagePools | None = None, max_steps: int | None = None, step_timeout: float = 30.0,
                 lease_timeout: float | None = 600.0, render_mode: str | None = None,
                 **pool_kwargs: Any):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, "
                             f"got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = AnyText(MAX_OBSERVATION_CHARS)
        self.action_space = AnyText(MAX_ACTION_BYTES)
        self.tasks = self.load_tasks(tasks)
        if not self.tasks:
            raise ValueError(f"{type(self).__name__}: no tasks found in {tasks!r}")
        self._by_id: dict[str, Task] = {}
        for t in self.tasks:
            if t.id in self._by_id:
                raise ValueError(f"duplicate task id {t.id!r}")
            self._by_id[t.id] = t
        self.pool = pool
        self.image_pools = image_pools
        self.pool_kwargs = pool_kwargs
        self.max_steps = max_steps or self.default_max_steps
        self.step_timeout = step_timeout
        self.lease_timeout = lease_timeout
        self.task: Task | None = None
        self.steps = 0
        self._ended = True
        self._sandbox: Sandbox | None = None
        self._sandbox_pool: SandboxPool | None = None
        self._private: OrderedDict[str, SandboxPool] = OrderedDict()
        self._last_obs: Any = None

    # -- hooks for subclasses ------------------------------------------------------------
    def load_tasks(self, source: Any) -> list[Task]:
        """Tasks from ``source``. The base takes a :class:`Task` or a list of them; subclasses add files."""
        if isinstance(source, Task):
            return [source]
        if isinstance(source, (list, tuple)) and all(isinstance(t, Task) for t in source):
            return list(source)
        raise TypeError(f"{type(self).__name__} cannot load tasks from {source!r}")

    def sandbox_overrides(self, task: Task) -> dict[str, Any]:
        """:class:`~containers.protocol.SandboxSpec` fields this task needs (``image``, ``network``...).

        Empty (the default) means any sandbox of the shared pool will do.
        """
        return {}

    def start_episode(self, task: Task) -> Any:
        """Set the task up (``self.sandbox`` is leased); returns what to show after the instruction."""
        return None

    def call_tool(self, call: ToolCall) -> ToolResult:
        """Run one validated tool call."""
        raise NotImplementedError

    def compute_outcome(self) -> Outcome:
        """Grade the final state (after a finishing tool, or at truncation)."""
        raise NotImplementedError

    def skip_reason(self, task: Task) -> str | None:
        """Why this environment cannot run ``task`` here (it is then reported skipped), or None."""
        return None

    def oracle_actions(self, task: Task, kind: str) -> Iterable[Any]:
        """Scripted actions for the episode just reset: ``"gold"`` (the reference solution,
        must score +1) or ``"noop"`` (doing nothing, must not). May be lazy: an action
        can be drawn after the previous one was stepped. Used by validate and evaluate."""
        raise NotImplementedError(f"{type(self).__name__} has no scripted {kind} solution")

    def parse(self, action: Any) -> ToolCall:
        """The tool call in ``action``; raises :class:`~envs.actions.ActionError`."""
        return parse_action(action, self.tools)

    def first_observation(self, task: Task, extras: Any) -> Any:
        """The observation :meth:`reset` returns: the instruction, then ``extras``."""
        return task.instruction if extras is None else f"{task.instruction}\n\n{extras}"

    def observe(self, result: ToolResult) -> Any:
        """The observation :meth:`step` returns for a tool result."""
        return result.output

    def present(self, obs: Any) -> Observation:
        """``obs`` (returned by :meth:`reset` or :meth:`step`) as the agent and judge see it.

        The default takes strings; a family with richer observations overrides it.
        """
        return Observation.of(obs)

    # -- helpers for tools -----------------------------------------------------------------
    @property
    def sandbox(self) -> Sandbox:
        """The episode's sandbox, leased on first use (at reset when ``lease_at_reset``)."""
        if self._sandbox is None:
            if self.task is None or self._ended:
                raise ResetNeeded("no episode is running: call reset() first")
            self._sandbox_pool, self._sandbox = self._lease(self.task)
        return self._sandbox

    def command_timeout_cap(self) -> float:
        """The most seconds one command may ask for (default ``step_timeout``)."""
        return self.step_timeout

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run ``command`` in the sandbox for ``timeout`` s (default ``step_timeout``, capped).

        A command bash cannot take (a NUL byte, text that is not UTF-8) or a timeout that
        is not a finite number raises :class:`~envs.actions.ActionError`: an invalid step.
        """
        problem = unsendable(command)
        if problem:
            raise ActionError(problem[0].upper() + problem[1:] + ".")
        if timeout is not None:
            try:
                finite = math.isfinite(float(timeout))
            except (TypeError, ValueError, OverflowError):
                finite = False
            if not finite:
                raise ActionError(f"The timeout must be a finite number of seconds, got {timeout!r:.40}.")
        limit = self.step_timeout if timeout is None or timeout <= 0 else timeout
        return self.sandbox.run(command, timeout=min(limit, self.command_timeout_cap()))

    @staticmethod
    def command_result(r: CommandResult) -> ToolResult:
        """A command's output with its exit code, as the model sees it."""
        text = r.output.rstrip("\n")
        text += ("\n" if text else "") + f"[exit code {r.exit_code}]"
        return ToolResult(text, r.exit_code, timed_out=r.timed_out,
                          extra={"truncated": r.truncated, "shell_restarted": r.shell_restarted})

    # -- gymnasium API -------------------------------------------------------------------
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Start an episode on ``options["task"]`` (a Task or an id), else on a task drawn with ``seed``."""
        super().reset(seed=seed)
        self._end_episode()
        task = self._pick_task((options or {}).get("task"))
        for attempt in (1, 2):  # a sandbox that dies while starting gets one replacement
            self.task, self.steps, self._ended = task, 0, False
            try:
                if self.lease_at_reset:
                    self.sandbox  # noqa: B018 -- lease now
                extras = self.start_episode(task)
                break
            except SandboxError:
                self._end_episode()
                if attempt == 2:
                    raise
            except BaseException:
                self._end_episode()
                raise
        obs = self.first_observation(task, extras)
        self._last_obs = obs
        return obs, {"task_id": task.id, "instruction": task.instruction, "family": self.family,
                     "tools": copy.deepcopy(self.tools), "max_steps": self.max_steps}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Parse and run one action; grade the final state when the episode ends."""
        if self.task is None or self._ended:
            raise ResetNeeded("the episode has ended (or never started): call reset() before step()")
        info: dict[str, Any] = {"step": self.steps, "task_id": self.task.id}
        self.steps += 1
        core: dict[str, Any] = {"action": None, "valid": False, "error": None, "output": "",
                                "exit_code": None, "elapsed": 0.0, "timed_out": False}
        extra: dict[str, Any] = {}
        start = time.monotonic()
        try:
            call = self.parse(action)
            core.update(action=call.to_dict(), valid=True)
            result = self.call_tool(call)
        except ActionError as e:
            core.update(valid=False, error=str(e))
            result = ToolResult(f"Invalid action: {e}")
        except INFRA_ERRORS as e:
            return self._abort(core, info, e)
        else:
            core.update(exit_code=result.exit_code, timed_out=result.timed_out,
                        elapsed=round(time.monotonic() - start, 3))
            extra = result.extra
        core["output"] = result.output
        info["next_state"] = {**extra, **core}
        terminated = bool(result.done)
        truncated = not terminated and self.steps >= self.max_steps
        reward = 0.0
        if terminated or truncated:
            try:
                outcome = self.compute_outcome()
            except INFRA_ERRORS as e:
                return self._abort(core, info, e)
            reward = float(outcome.reward)
            info["outcome"] = {"reward": reward, **outcome.details}
            self._end_episode()
        obs = self.observe(result)
        self._last_obs = obs
        return obs, reward, terminated, truncated, info

    def render(self) -> Any:
        """The last observation (``render_mode="ansi"``)."""
        return self._last_obs if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Give the sandbox back and close the pools this env made. Safe to call twice."""
        self._end_episode()
        for pool in self._private.values():
            pool.close()
        self._private.clear()
        super().close()

    # -- internals -------------------------------------------------------------------------
    def _pick_task(self, choice: Task | str | None) -> Task:
        if choice is None:
            return self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if isinstance(choice, Task):
            return choice
        if choice in self._by_id:
            return self._by_id[choice]
        known = ", ".join(list(self._by_id)[:10])
        raise KeyError(f"unknown task {choice!r} ({len(self._by_id)} tasks, e.g. {known})")

    def _lease(self, task: Task) -> tuple[SandboxPool, Sandbox]:
        """A sandbox for ``task`` and its pool: the shared pool's when its sandboxes fit the task,
        else one of the pool for the task's spec, the shared ``image_pools``' or a private one."""
        overrides = self.sandbox_overrides(task)
        if self.pool is not None and all(getattr(self.pool.spec, k) == v for k, v in overrides.items()):
            return self.pool, self.pool.lease(timeout=self.lease_timeout)
        key = json.dumps(overrides, sort_keys=True)
        if self.image_pools is not None:
            return self.image_pools.lease(key, lambda size: self.make_pool(size, **{**self.pool_kwargs, **overrides}),
                                          self.lease_timeout)
        pool = self._private_pool(key, overrides)
        return pool, pool.lease(timeout=self.lease_timeout)

    def _private_pool(self, key: str, overrides: dict[str, Any]) -> SandboxPool:
        """This env's own pool for the spec ``overrides`` (the ``max_private_pools`` latest kept)."""
        pool = self._private.pop(key, None)
        if pool is None:
            pool = self.make_pool(1, **{**self.pool_kwargs, **overrides})
        self._private[key] = pool  # most recently used last
        while len(self._private) > self.max_private_pools:
            self._private.popitem(last=False)[1].close()
        return pool

    def _abort(self, core: dict[str, Any], info: dict[str, Any],
               error: BaseException) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        reason = f"{type(error).__name__}: {error}"
        result = ToolResult(f"The environment failed and the episode was aborted ({reason}).")
        core.update(error=reason, output=result.output)
        info["next_state"] = core
        info["aborted"] = reason
        self._end_episode()
        obs = self.observe(result)
        self._last_obs = obs
        return obs, 0.0, False, True, info

    def _end_episode(self) -> None:
        self._ended = True
        if self._sandbox is not None and self._sandbox_pool is not None:
            self._sandbox_pool.release(self._sandbox)
        self._sandbox = self._sandbox_pool = None


def play(env: NextStateEnv, actions: Iterable[Any]) -> tuple[float, dict[str, Any]]:
    """Step ``actions`` until the episode ends; the final reward and info.

    Raises ``RuntimeError`` when the episode is aborted or the actions run out first.
    """
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        if "aborted" in info:
            raise RuntimeError(f"episode aborted: {info['aborted']}")
        if terminated or truncated:
            return reward, info
    raise RuntimeError("the actions ran out before the episode ended")
