"""The GUI family: a desktop (Xvfb, openbox, Chromium) in a sandbox, seen as screenshots and an
accessibility tree.

:mod:`~envs.gui.env` is the env, :mod:`~envs.gui.desktop` the client of the desktop's controller,
:mod:`~envs.gui.osworld` loads OSWorld tasks and says which this desktop can run, and
:mod:`~envs.gui.metrics` holds OSWorld's getters and metrics. ``tasks/`` holds the built-in web tasks.
The env module's names are importable from here, loaded on first use.
"""

from nextstate.envs import registry

registry.register(
    "gui", "nextstate.envs.gui.env:GUIEnv", id="nextstate/GUI-v0", config="gui.yaml", judge_template="gui.yaml",
    intro="You are an agent operating a graphical interface. Each observation shows the screen; "
          "act on it with one tool call per answer.")


__getattr__ = registry.lazy_names("nextstate.envs.gui.env")
