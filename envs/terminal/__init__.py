"""The terminal family: a shell in a sandbox, graded by the task's hidden tests.

:mod:`~envs.terminal.env` is the env, :mod:`~envs.terminal.formats` reads terminal-bench and Harbor
task directories, :mod:`~envs.terminal.procedural` makes the procedural families, and ``tasks/``
holds the built-in tasks. The env module's names are importable from here
(``from envs.terminal import TerminalEnv``), loaded on first use.
"""

from nextstate.envs import registry

registry.register(
    "terminal", "nextstate.envs.terminal.env:TerminalEnv", id="nextstate/Terminal-v0", config="terminal.yaml",
    judge_template="terminal.yaml",
    intro="You are an agent working in a Linux terminal. Reach the goal of the task by running "
          "shell commands, one tool call per answer, and look at each result before the next step.")


__getattr__ = registry.lazy_names("nextstate.envs.terminal.env")
