"""Environments, sandbox pool and step judge of a run, as both backends build them."""

from __future__ import annotations

from typing import Any, Callable

from envs import env_class
from train.config import Config

def load_tasks(cfg: Config) -> list[Any]:
    """The tasks of the configured environment (no sandbox is started)."""
    env = env_class(cfg.env.family)(tasks=cfg.env.tasks)
    try:
        return list(env.tasks)
    finally:
        env.close()


def make_envs(cfg: Config, pool_size: int | None = None,
              run_id: str | None = None) -> tuple[Any, Callable[[], Any], list[Any]]:
    """A shared sandbox pool (``pool_size``, default ``rollout.parallel``; ``run_id`` labels its
    sandboxes), a factory of envs leasing from it, and the env's task list."""
    cls = env_class(cfg.env.family)
    pool = cls.make_pool(pool_size or cfg.rollout.parallel, backend=cfg.env.sandbox_backend, run_id=run_id)

    def factory() -> Any:
        return cls(tasks=cfg.env.tasks, pool=pool, max_steps=cfg.env.max_steps, step_timeout=cfg.env.step_timeout)

    return pool, factory, load_tasks(cfg)


def make_judge(cfg: Config, policy: Any) -> Any:
    """The step judge the config asks for: on ``policy`` (mode ``policy``), on the URL's
    server (mode ``url``), or None (mode ``none``)."""
    from judges.prm import StepJudge

    j = cfg.judge
    if j.mode == "none":
        return None
    backend = policy
    if j.mode == "url":
        from agents.openai_policy import OpenAIPolicy
        backend = OpenAIPolicy(j.url, model=j.model)
    return StepJudge(backend, m=j.votes, temperature=j.temperature, max_tokens=j.max_tokens)
