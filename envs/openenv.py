"""OpenEnv both ways: serve any nextstate family over OpenEnv's API, and use any OpenEnv server
as a nextstate family.

**Serve.** :class:`FamilyServer` puts a registered family (``relay`` included) behind
``openenv-core``'s own server (:func:`openenv.core.env_server.http_server.create_fastapi_app`):
``POST /reset``, ``POST /step``, ``GET /state``, ``/schema``, ``/metadata``, ``/health`` and the
WebSocket session endpoint ``/ws``. Each WebSocket session gets an env of its own from an
:class:`~envs.pool.EnvCache`, leasing its sandbox from one shared pool of ``max_sessions``
sandboxes; a session past ``max_sessions`` is refused with one line (``CAPACITY_REACHED``), and a
session that ends or disconnects gives its sandbox back. ``python -m envs serve FAMILY --port P``
runs it. The observation carries the step's text, its images (base64 PNG), who acts next and the
next-state fields (``next_state``, ``outcome``, ``info``) as observation fields, since OpenEnv's
server drops ``Observation.metadata`` on the wire (it is filled too, for in-process users).
The action is the model's text (``{"text": ...}``) or one tool call (``{"name", "arguments"}``);
the action schema lists the family's tools under ``tools``.

**Consume.** :class:`OpenEnvFamily` registers an OpenEnv server as family ``openenv:URL``
(``python -m train --env openenv:URL`` does it too): its env class talks to the server through
``openenv-core``'s own client, one WebSocket session per env. A nextstate server's tools and
next-state fields come through as they are; any other server's action schema becomes one tool,
``step``, whose arguments are the action, and its observation is shown as JSON.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import time
from typing import Any, Callable, ClassVar

import httpx
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from openenv.core.generic_client import GenericEnvClient
from pydantic import ConfigDict, Field, model_validator
from starlette.websockets import WebSocketDisconnect
from websockets.exceptions import ConnectionClosed

from nextstate.envs import registry
from nextstate.envs.actions import ToolCall, tool_schema
from nextstate.envs.base import NextStateEnv, Outcome, Task, ToolResult
from nextstate.envs.multiagent import MultiAgentEnv
from nextstate.envs.pool import EnvCache

PREFIX = "openenv:"
ACTION_TITLE = "NextStateAction"
NO_EPISODE = ("No episode is running: reset first. Over plain HTTP every request gets a fresh env; "
              "an episode runs in one WebSocket session (/ws).")


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (what JSON cannot hold becomes its ``str``)."""
    return json.loads(json.dumps(value, default=str))


def wait_healthy(url: str, timeout: float = 60.0, alive: Callable[[], bool] | None = None) -> bool:
    """Whether the OpenEnv server at ``url`` answers ``GET /health`` within ``timeout`` seconds
    (False at once when ``alive()`` says its process is gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (alive is None or alive()):
        try:
            if httpx.get(url.rstrip("/") + "/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


# -- serving ---------------------------------------------------------------------------------------
class NextStateAction(Action):
    """One action: the model's ``text`` (a tool call in any form the family parses), or one tool
    call given as ``name`` and ``arguments``."""

    text: str | None = Field(default=None, description="the model's answer, holding one tool call")
    name: str | None = Field(default=None, description="a tool's name (instead of text)")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments")

    @model_validator(mode="after")
    def _one_form(self) -> "NextStateAction":
        if (self.text is None) == (self.name is None):
            raise ValueError("give the action as text or as name (+ arguments), not both or neither")
        return self

    def payload(self) -> Any:
        """What :meth:`NextStateEnv.step` takes."""
        return self.text if self.text is not None else {"name": self.name, "arguments": self.arguments}


class NextStateObservation(Observation):
    """What a nextstate step shows: ``text`` and ``images`` (base64 PNG) as the agent sees them,
    ``agent`` (who acts next, multi-agent families), ``next_state`` and ``outcome`` as in
    ``info``, ``truncated`` (``done`` is ``terminated or truncated``), and the rest of ``info``."""

    text: str = ""
    images: list[str] = Field(default_factory=list)
    agent: str | None = None
    next_state: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


def action_class(tools: list[dict[str, Any]]) -> type[NextStateAction]:
    """:class:`NextStateAction` whose JSON schema lists ``tools`` (``/schema`` shows them)."""
    config = ConfigDict(title=ACTION_TITLE, json_schema_extra={"tools": _jsonable(tools)})
    return type(ACTION_TITLE, (NextStateAction,), {"model_config": {**NextStateAction.model_config, **config},
                                                   "__module__": __name__})


class FamilyServer:
    """A registered family served over OpenEnv's API (see the module docstring).

    Args:
        family: a registered family, or ``MODULE:NAME`` (:func:`registry.resolve`).
        tasks: the family's task source (default: its built-in set).
        max_sessions: WebSocket sessions at once (OpenEnv's ``max_concurrent_envs``), and the size
            of the shared sandbox pool.
        backend: the sandbox backend (``auto``, ``docker``, ``local``).
        **env_kwargs: passed to every env (``max_steps``, ``user``, ...).
    """

    def __init__(self, family: str, *, tasks: Any = None, max_sessions: int = 8, backend: str = "auto",
                 **env_kwargs: Any):
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.family = registry.resolve(family)
        self.record = registry.spec(self.family)
        cls = self.record.env_class()
        probe = cls(tasks=tasks, **env_kwargs)   # loads (and checks) the tasks once
        self.tasks, self.tools = probe.tasks, probe.tools
        probe.close()
        self.max_sessions = max_sessions
        self.pool = cls.make_pool(max_sessions, backend=backend) if cls.uses_family_image(self.tasks) else None
        self.envs = EnvCache(lambda: cls(tasks=self.tasks, pool=self.pool, backend=backend, warm=False,
                                         **env_kwargs))

    def app(self) -> Any:
        """The FastAPI app of ``openenv-core``'s server for this family."""
        app = create_fastapi_app(functools.partial(ServedSession, self), action_class(self.tools),
                                 NextStateObservation, max_concurrent_envs=self.max_sessions)
        app.add_middleware(QuietClose)
        return app

    def leased(self) -> int:
        """Sandboxes the sessions hold now."""
        return self.pool.stats()["leased"] if self.pool is not None else 0

    def close(self) -> None:
        """Close every env and the sandbox pool."""
        self.envs.close()
        if self.pool is not None:
            self.pool.close()


class QuietClose:
    """ASGI middleware: a WebSocket whose client left first is over, not an error.

    openenv-core's ``/ws`` handler closes the socket after the session ends (its env closed, the
    sandbox back); when the client has already gone, that close raises ``WebSocketDisconnect``,
    which uvicorn would log as a traceback per session."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope["type"] != "websocket":
                raise


class ServedSession(Environment):
    """One OpenEnv session on a :class:`FamilyServer`: an env taken from its cache at the first
    reset, given back (its sandbox released) when the session closes."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, server: FamilyServer):
        super().__init__()
        self.server = server
        self.env: NextStateEnv | None = None
        self.episode_id: str | None = None
        self.running = False

    def reset(self, seed: int | None = None, episode_id: str | None = None, task: str | None = None,
              **kwargs: Any) -> NextStateObservation:
        """Start an episode on ``task`` (an id), else on a task drawn with ``seed``."""
        if kwargs:
            raise ValueError(f"unknown reset options: {', '.join(sorted(kwargs))} (known: seed, episode_id, task)")
        if self.env is None:
            self.env = self.server.envs.take()
        self.running = False
        try:
            obs, info = self.env.reset(seed=seed, options={"task": task} if task is not None else None)
        except KeyError as e:
            raise ValueError(e.args[0]) from None
        self.running, self.episode_id = True, episode_id
        return self._observation(obs, 0.0, False, False, info)

    def step(self, action: NextStateAction, timeout_s: float | None = None,
             **kwargs: Any) -> NextStateObservation:
        """Step the episode; without one, an observation that says to reset (``done``)."""
        if not self.running or self.env is None:
            return NextStateObservation(text=NO_EPISODE, done=True, reward=0.0, info={"error": NO_EPISODE})
        obs, reward, terminated, truncated, info = self.env.step(action.payload())
        self.running = not (terminated or truncated)
        return self._observation(obs, reward, terminated, truncated, info)

    @property
    def state(self) -> State:
        """The episode's id and step count, with its family, task and who acts next."""
        env = self.env
        return State(episode_id=self.episode_id, step_count=env.steps if env else 0, family=self.server.family,
                     task_id=env.task.id if env and env.task else None, running=self.running,
                     agent=getattr(env, "agent_selection", None) if self.running else None)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=f"nextstate/{self.server.family}", description=self.server.record.intro,
                                   version="0.1.0", documentation_url="docs/standards.md")

    def close(self) -> None:
        """End the episode (its sandbox goes back to the pool) and give the env back."""
        if self.env is not None:
            self.env.close()
            self.server.envs.give_back(self.env)
            self.env, self.running = None, False

    def _observation(self, obs: Any, reward: float, terminated: bool, truncated: bool,
                     info: dict[str, Any]) -> NextStateObservation:
        assert self.env is not None
        shown = self.env.present(obs)
        rest = _jsonable({k: v for k, v in info.items() if k not in ("next_state", "outcome")})
        agent = info.get("next_agent", info.get("agent")) if isinstance(self.env, MultiAgentEnv) else None
        fields = {"next_state": _jsonable(info.get("next_state")), "outcome": _jsonable(info.get("outcome")),
                  "info": rest}
        return NextStateObservation(
            text=shown.text, images=[base64.b64encode(im).decode() for im in shown.images], agent=agent,
            truncated=truncated, done=terminated or truncated, reward=reward, **fields, metadata=fields)


# -- consuming -------------------------------------------------------------------------------------
#: What openenv-core's client raises when a server fails or goes away.
CLIENT_ERRORS = (ConnectionError, OSError, RuntimeError, TimeoutError, ConnectionClosed)


def _said(e: BaseException) -> str:
    """One line for a client error; a closed WebSocket says what a full server does."""
    if isinstance(e, ConnectionClosed):
        return ("the server closed the session before answering (a server at its session limit sends "
                f"CAPACITY_REACHED and closes): {e}")
    return " ".join(str(e).split())


class OpenEnvEnv(NextStateEnv):
    """A nextstate env over one OpenEnv server (subclassed per server by :class:`OpenEnvFamily`).

    Its tasks are reset seeds: ``tasks`` is a count (default 100: seeds 0..99), ``"seeds:A:B"``,
    or Tasks whose ``data["seed"]`` is the seed. The episode is one WebSocket session of
    ``openenv-core``'s ``GenericEnvClient``, opened at the first reset, closed by :meth:`close`.
    The outcome is the server's last reward (clipped to [-1, 1]; the raw one is in its details),
    or a nextstate server's own outcome.
    """

    url: ClassVar[str] = ""
    served: ClassVar[bool] = False   # the server is a nextstate one (FamilyServer)
    lease_at_reset = False
    default_max_steps = 30

    def __init__(self, tasks: Any = None, *, message_timeout: float = 600.0, **kwargs: Any):
        self.message_timeout = message_timeout
        self._client: Any = None
        self._last: dict[str, Any] = {}
        super().__init__(tasks, **kwargs)

    @classmethod
    def uses_family_image(cls, tasks: list[Task]) -> bool:
        return False   # the server holds the sandboxes

    def load_tasks(self, source: Any) -> list[Task]:
        if source is None or isinstance(source, int):
            return [Task(f"seed-{i}", "", {"seed": i}) for i in range(100 if source is None else source)]
        if isinstance(source, str):
            m = re.fullmatch(r"seeds:(\d+):(\d+)", source)
            if not m:
                raise ValueError(f"OpenEnv tasks are reset seeds: a count or 'seeds:A:B', got {source!r}")
            return [Task(f"seed-{i}", "", {"seed": i}) for i in range(int(m[1]), int(m[2]))]
        return super().load_tasks(source)

    def _session(self) -> Any:
        if self._client is None:
            self._client = GenericEnvClient(self.url, message_timeout_s=self.message_timeout).sync()
        return self._client

    def start_episode(self, task: Task) -> Any:
        try:
            result = self._session().reset(**({"seed": task.data["seed"]} if "seed" in task.data else {}))
        except CLIENT_ERRORS as e:
            self._drop()
            raise ValueError(f"OpenEnv server {self.url}: {_said(e)}") from None
        self._last = {"reward": result.reward, "done": result.done, "observation": result.observation}
        return self._text(result.observation)

    def first_observation(self, task: Task, extras: Any) -> Any:
        return extras

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        info["instruction"] = obs   # the server's first observation is the task
        return obs, info

    def call_tool(self, call: ToolCall) -> ToolResult:
        action = {"name": call.name, "arguments": call.arguments} if self.served else call.arguments
        try:
            result = self._session().step(action)
        except CLIENT_ERRORS as e:
            self._drop()
            return ToolResult(f"The OpenEnv server failed: {_said(e)}", done=True, extra={"openenv_error": _said(e)})
        obs = result.observation
        self._last = {"reward": result.reward, "done": result.done, "observation": obs}
        extra = dict(obs.get("next_state") or {}) if self.served else {"observation": obs}
        extra["openenv_reward"] = result.reward
        code = extra.get("exit_code")
        return ToolResult(self._text(obs), code if isinstance(code, int) else None, done=bool(result.done),
                          timed_out=bool(extra.get("timed_out")), extra=extra)

    def compute_outcome(self) -> Outcome:
        obs = self._last.get("observation") or {}
        if self.served and isinstance(obs.get("outcome"), dict):
            details = dict(obs["outcome"])
            return Outcome(float(details.pop("reward", 0.0)), details)
        raw = self._last.get("reward")
        reward = max(-1.0, min(1.0, float(raw or 0.0)))
        return Outcome(reward, {"openenv_reward": raw, "openenv_done": bool(self._last.get("done"))})

    def close(self) -> None:
        self._drop()
        super().close()

    def _text(self, obs: dict[str, Any]) -> str:
        if self.served:
            return str(obs.get("text", ""))
        return json.dumps(obs, ensure_ascii=False, default=str)

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 -- a dead session has nothing left to close
                pass


class OpenEnvFamily:
    """An OpenEnv server at ``url``, registered as nextstate family ``openenv:URL``.

    Reads the server's ``/schema`` and ``/metadata`` once (a one-line ``ValueError`` when it does
    not answer) and registers an :class:`OpenEnvEnv` subclass for it: ``gymnasium.make(family.id)``,
    ``python -m train --env openenv:URL``, the judge and the viewer then use it as a built-in family.
    """

    def __init__(self, url: str, timeout: float = 10.0):
        self.url = url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"an OpenEnv server URL is http(s)://HOST:PORT, got {url!r}")
        try:
            schema = httpx.get(self.url + "/schema", timeout=timeout).raise_for_status().json()
            meta = httpx.get(self.url + "/metadata", timeout=timeout).raise_for_status().json()
        except (httpx.HTTPError, ValueError) as e:
            raise ValueError(f"OpenEnv server {self.url} does not answer /schema and /metadata: {e}") from None
        action = schema.get("action") or {}
        served = action.get("title") == ACTION_TITLE and isinstance(action.get("tools"), list)
        if served:
            tools = action["tools"]
        else:
            props = {k: v for k, v in (action.get("properties") or {}).items() if k != "metadata"}
            tools = [tool_schema("step", f"One action of {meta.get('name', 'the environment')}: "
                                 f"{meta.get('description', '')}".strip(), props,
                                 [r for r in action.get("required", []) if r in props])]
        self.name = PREFIX + url   # as given: the name --env openenv:URL looks up
        slug = re.sub(r"[^\w.-]+", "-", self.url.split("://", 1)[1]).strip("-")
        self.env_class = type(f"OpenEnv_{slug}", (OpenEnvEnv,), {
            "url": self.url, "served": served, "tools": tools, "family": self.name, "__module__": __name__})
        intro = registry.DEFAULT_INTRO + (f" The environment: {meta['description']}" if meta.get("description") else "")
        self.record = registry.register(self.name, self.env_class, id=f"nextstate/OpenEnv-{slug}-v0", intro=intro)
        self.id = self.record.id


def register_url(name: str) -> None:
    """Register family ``name`` (``openenv:URL``): :func:`registry.spec`'s hook for such names."""
    OpenEnvFamily(name[len(PREFIX):])
