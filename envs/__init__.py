"""Gymnasium environments for LLM agents, each episode in a leased sandbox.

``gymnasium.make("nextstate/Terminal-v0")`` (or ``ToolCall``, ``SWE``, ``GUI``)
gives an env whose actions are the model's text; see :mod:`envs.base`.
"""

from gymnasium.envs.registration import register

register(id="nextstate/Terminal-v0", entry_point="envs.terminal:TerminalEnv")
register(id="nextstate/ToolCall-v0", entry_point="envs.toolcall:ToolCallEnv")
# Registered here for their authors: the modules arrive with their own issues.
register(id="nextstate/SWE-v0", entry_point="envs.swe:SWEEnv")
register(id="nextstate/GUI-v0", entry_point="envs.gui:GUIEnv")
