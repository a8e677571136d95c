"""The GUI family: a desktop (Xvfb, openbox, Chromium) in a sandbox, seen as screenshots and an
accessibility tree.

:mod:`~envs.gui.env` is the env, :mod:`~envs.gui.desktop` the client of the desktop's controller,
:mod:`~envs.gui.osworld` loads OSWorld tasks and says which this desktop can run, and
:mod:`~envs.gui.metrics` holds OSWorld's getters and metrics. ``tasks/`` holds the built-in web tasks.
The env module's names are importable from here, loaded on first use.
"""

import importlib
from typing import Any

from envs import registry

registry.register(
    "gui", "envs.gui.env:GUIEnv", id="nextstate/GUI-v0", config="gui.yaml", judge_template="gui.yaml",
    intro="You are an agent operating a graphical interface. Each observation shows the screen; "
          "act on it with one tool call per answer.")


def __getattr__(name: str) -> Any:
    """The env module's names (``GUIEnv`` ...), imported on first use, so
    registering the family loads no env module."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("envs.gui.env"), name)
