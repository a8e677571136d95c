"""Gymnasium environments for LLM agents, each episode in a leased sandbox.

``gymnasium.make("nextstate/Terminal-v0")`` (or ``ToolCall``, ``SWE``, ``GUI``)
gives an env whose actions are the model's text; see :mod:`envs.base`. Each
family is one record in :mod:`envs.registry` (env class, config, prompt intro,
judge template, validator); the four built-in ones are registered below.
"""

from envs import registry

registry.register(
    "terminal", "envs.terminal:TerminalEnv", id="nextstate/Terminal-v0", config="terminal.yaml",
    judge_template="terminal.yaml",
    intro="You are an agent working in a Linux terminal. Reach the goal of the task by running "
          "shell commands, one tool call per answer, and look at each result before the next step.")
registry.register(
    "toolcall", "envs.toolcall:ToolCallEnv", id="nextstate/ToolCall-v0", config="toolcall.yaml",
    judge_template="toolcall.yaml",
    intro="You are an assistant that solves the user's problem by calling the provided tools, "
          "one tool call per answer, and answers when done.")
registry.register(
    "swe", "envs.swe:SWEEnv", id="nextstate/SWE-v0", config="swe.yaml", judge_template="swe.yaml",
    validator="envs.swe:check_swe",
    intro="You are a software engineer fixing an issue in a code repository. Explore the code, "
          "reproduce the problem, edit the files and check your fix by running tests, one tool "
          "call per answer.")
registry.register(
    "gui", "envs.gui:GUIEnv", id="nextstate/GUI-v0", config="gui.yaml", judge_template="gui.yaml",
    intro="You are an agent operating a graphical interface. Each observation shows the screen; "
          "act on it with one tool call per answer.")


def env_class(family: str) -> type:
    """The env class of a registered family (``terminal``, ``swe``, ...)."""
    return registry.spec(family).env_class()
