"""Config-to-object wiring: what a :class:`~train.config.Config` asks for, made or checked.

The model checks at start (:func:`check_model`, :func:`probe_server`, :func:`probe_judge`),
and a run's objects: who acts (:func:`role_router`), the prompt shape (:func:`chat_config`),
the tasks, envs and sandbox pool (:func:`load_tasks`, :func:`make_envs`), the step judge
(:func:`make_judge`) and the hint source (:func:`make_hinter`). The local and veRL backends,
``python -m train``, ``python -m train.evaluate``, warm starts and the benchmarks share them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Mapping

from nextstate.agents.chat import ChatConfig
from nextstate.agents.presets import PRESETS
from nextstate.containers.image_pools import ImagePools
from nextstate.envs import env_class
from nextstate.envs.multiagent import MultiAgentEnv
from nextstate.judges.prm import StepJudge
from nextstate.train.config import Config, ConfigError, policy_roles
from nextstate.train.rollout import Router, planner_executor, single_role

PROBE_TIMEOUT = 5.0
JUDGE_PROBE_TIMEOUT = 60.0   # one real judge request at start (the judge's own timeout)


def check_model(name: str) -> None:
    """A preset must be available here (:mod:`agents.presets`), a local model path must exist and
    hold an HF config; hub names are checked at load."""
    if name in PRESETS:
        try:
            PRESETS[name].check()
        except FileNotFoundError as e:
            raise ConfigError(str(e)) from None
        return
    if name.startswith(("http://", "https://")):
        raise ConfigError(f"the trained model must be local (a preset such as 'tiny', a path or a hub name), not a URL "
                          f"({name}); a server URL can be the judge: --judge {name}")
    path = Path(name).expanduser()
    looks_local = name.startswith(("/", ".", "~")) or path.exists() or name.count("/") > 1
    if looks_local and not (path / "config.json").is_file():
        what = "does not exist" if not path.exists() else "has no config.json"
        raise ConfigError(f"model path {name!r} {what}")


def probe_server(url: str, model: str | None, key: str, what: str = "judge URL",
                 timeout: float = PROBE_TIMEOUT) -> str:
    """The model name an OpenAI-compatible server at ``url`` serves, worked out now.

    ``model`` when given (``/models`` may fail, as on ``transformers serve``),
    else the first one ``/models`` lists. Raises :class:`ConfigError` with one
    line that names ``key``, the setting to fill in.
    """
    import httpx

    from nextstate.agents.openai_policy import OpenAIPolicy
    from nextstate.agents.policy import PolicyError

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{what} {url!r} is not an http(s):// URL")
    policy = OpenAIPolicy(url, model=model, timeout=timeout, max_retries=0, model_key=key)
    try:
        with httpx.Client(timeout=timeout) as client:   # does anything answer at all?
            resp = client.get(policy.base_url + "/models")
    except httpx.HTTPError as e:
        raise ConfigError(f"{what} {url} does not answer (GET {policy.base_url}/models: "
                          f"{type(e).__name__}: {e})") from None
    if model is not None and resp.status_code == 200:   # a name the server lists as not served
        try:
            served = [str(m.get("id")) for m in resp.json().get("data") or [] if isinstance(m, dict)]
        except ValueError:
            served = []
        if served and model not in served:
            raise ConfigError(f"{url} does not serve model {model!r} (it serves: "
                              f"{', '.join(served[:5])}); set {key}")

    async def resolve() -> str:
        try:
            return await policy.resolve_model()
        finally:
            await policy.aclose()
    try:
        return asyncio.run(resolve())
    except PolicyError as e:
        raise ConfigError(str(e)) from None


def probe_judge(url: str, model: str, timeout: float = JUDGE_PROBE_TIMEOUT) -> None:
    """One real judge request (a short chat completion) at start: a server that answers
    ``/models`` but not a chat (a wrong ``judge.model``, a URL that is not an OpenAI server)
    stops the run now, with one line, instead of failing every judge call of the run."""
    from nextstate.agents.openai_policy import OpenAIPolicy
    from nextstate.agents.policy import PolicyError

    policy = OpenAIPolicy(url, model=model, timeout=timeout, max_retries=1, request_ids=False,
                          model_key="judge.model")

    async def ask() -> list[str]:
        try:
            return await policy.complete([{"role": "user", "content": "Reply with \\boxed{1}."}],
                                         n=1, temperature=0.0, max_tokens=8)
        finally:
            await policy.aclose()
    try:
        asyncio.run(ask())
    except (PolicyError, OSError) as e:
        raise ConfigError(f"the judge at {url} (model {model!r}) fails a chat request: {e}; "
                          "check judge.url and judge.model") from None


def role_router(cfg: Config) -> Router | None:
    """Who acts in a run's episodes: None when the family is a :class:`MultiAgentEnv` (the env
    decides), else the one role of a single policy, or planner/executor for those two roles."""
    roles = [r for rs in policy_roles(cfg).values() for r in rs]
    if issubclass(env_class(cfg.env.family), MultiAgentEnv):
        return None
    if len(roles) == 1:
        return single_role(roles[0])
    if set(roles) == {"planner", "executor"}:
        return planner_executor()
    raise ConfigError(f"env {cfg.env.family} has one agent: several policies need the roles planner and "
                      f"executor (got {', '.join(roles)})")


def chat_config(cfg: Config) -> ChatConfig:
    """The prompt budget and shape ``cfg.rollout`` sets, for rollouts, evaluation and warm starts."""
    r = cfg.rollout
    return ChatConfig(context_tokens=r.max_context_tokens, max_response_tokens=r.max_response_tokens,
                      max_images=r.max_images, system_prompt=r.system_prompt)


def env_kwargs(cfg: Config) -> dict[str, Any]:
    """The env options the config sets (``env.user``, ``env.tmux``, ``env.network``; terminal only), and no others."""
    return {**({"user": cfg.env.user} if cfg.env.user else {}), **({"tmux": True} if cfg.env.tmux else {}),
            **({"network": False} if cfg.env.network == "none" else {})}


def load_tasks(cfg: Config, source: Any = None) -> list[Any]:
    """The tasks of the configured environment, or of ``source`` (no sandbox is started)."""
    env = env_class(cfg.env.family)(tasks=source if source is not None else cfg.env.tasks, **env_kwargs(cfg))
    try:
        return list(env.tasks)
    finally:
        env.close()


class EnvFactory:
    """Makes the envs of one run: each call a new env on the run's tasks, sharing the run's pools.

    ``image_pools`` (``env.image_pools=shared``, the default) are the per-image pools every env
    of this factory leases from for tasks with an image of their own; :meth:`close` removes them.
    """

    def __init__(self, make: Callable[..., Any], image_pools: ImagePools | None):
        self._make, self.image_pools = make, image_pools

    def __call__(self) -> Any:
        return self._make(image_pools=self.image_pools)

    def close(self) -> None:
        """Close the shared per-image pools (the envs' own are closed with each env)."""
        if self.image_pools is not None:
            self.image_pools.close()


def make_envs(cfg: Config, pool_size: int | None = None,
              run_id: str | None = None) -> tuple[Any, EnvFactory, list[Any]]:
    """A shared pool of warm sandboxes (``pool_size``, default ``rollout.parallel``; ``run_id``
    labels its sandboxes), a factory of envs leasing from it, and the env's task list.

    The pool is None when every task runs in an image of its own (terminal-bench tasks with
    a Dockerfile, SWE-bench rows). Such a task's episode starts its sandbox when it begins,
    and none is started ahead for an image the env's next task may not use. With
    ``env.image_pools=shared`` (the default) those per-image pools are the factory's, shared
    by all its envs (at most ``pool_size`` idle sandboxes over all of them); the caller closes
    them with ``factory.close()``. ``per-env``: each env keeps its own.
    """
    cls = env_class(cfg.env.family)
    tasks = load_tasks(cfg)
    size = pool_size or cfg.rollout.parallel
    pool = cls.make_pool(size, backend=cfg.env.sandbox_backend,
                         disk=cfg.env.sandbox_disk, reset=cfg.env.sandbox_reset,
                         run_id=run_id) if cls.uses_family_image(tasks) else None

    def make(image_pools: ImagePools | None) -> Any:
        return cls(tasks=tasks, pool=pool, image_pools=image_pools, max_steps=cfg.env.max_steps,
                   step_timeout=cfg.env.step_timeout, warm=False, reset=cfg.env.sandbox_reset, run_id=run_id,
                   **env_kwargs(cfg))   # tasks loaded once, not per env

    shared = ImagePools(size, max_idle=size) if cfg.env.image_pools == "shared" else None
    return pool, EnvFactory(make, shared), tasks


def judge_backend(cfg: Config, policy: Any) -> Any:
    """The LLM an LLM judge asks: judge.url's server when judge.mode is ``url``, else ``policy``."""
    j = cfg.judge
    if j.mode == "url":
        from nextstate.agents.openai_policy import OpenAIPolicy
        return OpenAIPolicy(j.url, model=j.model)
    return policy


def make_judge(cfg: Config, policy: Any, templates: Mapping[str, Any] | None = None) -> Any:
    """The step judge the config asks for: on ``policy`` (mode ``policy``), on the URL's
    server (mode ``url``), by rule (mode ``rules``), or None (mode ``none``). ``templates``: the
    judge prompts of families with none registered (:class:`~nextstate.judges.prm.StepJudge`'s)."""
    j = cfg.judge
    if j.mode == "none":
        return None
    if j.mode == "rules":
        from nextstate.judges.rules import RuleJudge
        return RuleJudge(m=j.votes)
    return StepJudge(judge_backend(cfg, policy), m=j.votes, temperature=j.temperature, max_tokens=j.max_tokens, hints=j.hints,
                     timeout=j.timeout, templates=templates)


def make_hinter(cfg: Config, policy: Any, templates: Mapping[str, Any] | None = None) -> Any:
    """The hint source ``cfg.opd`` asks for (None in mode ``rl``): ``rules``, or an LLM judge
    on judge.url's server when judge.mode is ``url``, else on ``policy`` (``templates``: as
    :func:`make_judge`'s)."""
    if cfg.opd.mode == "rl":
        return None
    if cfg.opd.hint_source == "rules":
        from nextstate.judges.rules import RuleHints
        return RuleHints()
    from nextstate.judges.hints import HintJudge
    j = cfg.judge
    return HintJudge(judge_backend(cfg, policy), m=j.votes, temperature=j.temperature, max_tokens=j.max_tokens,
                     timeout=j.timeout, templates=templates)
