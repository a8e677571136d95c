"""The tool-call family: a Python interpreter in a sandbox and an ``answer`` tool, graded by
math-verify equivalence. :mod:`~envs.toolcall.env` is the env; ``tasks/`` holds the built-in rows.
The env module's names are importable from here, loaded on first use.
"""

import importlib
from typing import Any

from envs import registry

registry.register(
    "toolcall", "envs.toolcall.env:ToolCallEnv", id="nextstate/ToolCall-v0", config="toolcall.yaml",
    judge_template="toolcall.yaml",
    intro="You are an assistant that solves the user's problem by calling the provided tools, "
          "one tool call per answer, and answers when done.")


def __getattr__(name: str) -> Any:
    """The env module's names (``ToolCallEnv`` ...), imported on first use, so
    registering the family loads no env module."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("envs.toolcall.env"), name)
