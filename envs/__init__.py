"""Gymnasium environments for LLM agents, each episode in a leased sandbox.

``gymnasium.make("nextstate/Terminal-v0")`` (or ``ToolCall``, ``SWE``, ``GUI``)
gives an env whose actions are the model's text; see :mod:`envs.base`.
"""

import gymnasium
from gymnasium.envs.registration import load_env_creator, register

register(id="nextstate/Terminal-v0", entry_point="envs.terminal:TerminalEnv")
register(id="nextstate/ToolCall-v0", entry_point="envs.toolcall:ToolCallEnv")
# Registered here for their authors: the modules arrive with their own issues.
register(id="nextstate/SWE-v0", entry_point="envs.swe:SWEEnv")
register(id="nextstate/GUI-v0", entry_point="envs.gui:GUIEnv")


def env_class(family: str) -> type:
    """The env class registered as ``nextstate/<Family>-v0`` (``terminal``, ``swe``, ...)."""
    found = {spec.id.split("/")[1].split("-")[0].lower(): spec.entry_point
             for spec in gymnasium.envs.registry.values() if spec.id.startswith("nextstate/")}
    if family not in found:
        raise ValueError(f"unknown env {family!r}; known: {', '.join(sorted(found))}")
    entry = found[family]
    return load_env_creator(entry) if isinstance(entry, str) else entry
