"""Environments, sandbox pool and step judge of a run, as both backends build them."""

from __future__ import annotations

from typing import Any, Callable

from envs import env_class
from train.config import Config

def env_kwargs(cfg: Config) -> dict[str, Any]:
    """The env options the config sets (``env.user``, ``env.tmux``; terminal only), and no others."""
    return {**({"user": cfg.env.user} if cfg.env.user else {}), **({"tmux": True} if cfg.env.tmux else {})}


def load_tasks(cfg: Config, source: Any = None) -> list[Any]:
    """The tasks of the configured environment, or of ``source`` (no sandbox is started)."""
    env = env_class(cfg.env.family)(tasks=source if source is not None else cfg.env.tasks, **env_kwargs(cfg))
    try:
        return list(env.tasks)
    finally:
        env.close()


def make_envs(cfg: Config, pool_size: int | None = None,
              run_id: str | None = None) -> tuple[Any, Callable[[], Any], list[Any]]:
    """A shared sandbox pool (``pool_size``, default ``rollout.parallel``; ``run_id`` labels its
    sandboxes), a factory of envs leasing from it, and the env's task list."""
    cls = env_class(cfg.env.family)
    pool = cls.make_pool(pool_size or cfg.rollout.parallel, backend=cfg.env.sandbox_backend,
                         disk=cfg.env.sandbox_disk, run_id=run_id)

    def factory() -> Any:
        return cls(tasks=cfg.env.tasks, pool=pool, max_steps=cfg.env.max_steps, step_timeout=cfg.env.step_timeout,
                   **env_kwargs(cfg))

    return pool, factory, load_tasks(cfg)


def make_judge(cfg: Config, policy: Any) -> Any:
    """The step judge the config asks for: on ``policy`` (mode ``policy``), on the URL's
    server (mode ``url``), by rule (mode ``rules``), or None (mode ``none``)."""
    from judges.prm import StepJudge

    j = cfg.judge
    if j.mode == "none":
        return None
    if j.mode == "rules":
        from judges.rules import RuleJudge
        return RuleJudge(m=j.votes)
    backend = policy
    if j.mode == "url":
        from agents.openai_policy import OpenAIPolicy
        backend = OpenAIPolicy(j.url, model=j.model)
    return StepJudge(backend, m=j.votes, temperature=j.temperature, max_tokens=j.max_tokens)
