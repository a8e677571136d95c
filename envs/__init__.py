"""Gymnasium environments for LLM agents, each episode in a leased sandbox.

``gymnasium.make("nextstate/Terminal-v0")`` (or ``ToolCall``, ``SWE``, ``GUI``)
gives an env whose actions are the model's text; see :mod:`envs.base`. Each
family is one record in :mod:`envs.registry` (env class, config, prompt intro,
judge template, validator), registered by its own package (:mod:`envs.terminal`,
:mod:`envs.toolcall`, :mod:`envs.swe`, :mod:`envs.gui`, and the two-agent :mod:`envs.relay`,
see :mod:`envs.multiagent`), imported below. Registering
loads no env module; the sandbox runtime they run on is :mod:`containers`.
"""

from nextstate.envs import registry
from nextstate.envs import terminal, toolcall, swe, gui, relay  # noqa: F401,E402,I001  (each registers its family, in this order)


def env_class(family: str) -> type:
    """The env class of a registered family (``terminal``, ``swe``, ...)."""
    return registry.spec(family).env_class()
