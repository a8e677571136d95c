"""The tool-call family: a Python interpreter in a sandbox and an ``answer`` tool, graded by
math-verify equivalence. :mod:`~envs.toolcall.env` is the env; ``tasks/`` holds the built-in rows.
The env module's names are importable from here, loaded on first use.
"""

from nextstate.envs import registry

registry.register(
    "toolcall", "nextstate.envs.toolcall.env:ToolCallEnv", id="nextstate/ToolCall-v0", config="toolcall.yaml",
    judge_template="toolcall.yaml",
    intro="You are an assistant that solves the user's problem by calling the provided tools, "
          "one tool call per answer, and answers when done.")


__getattr__ = registry.lazy_names("nextstate.envs.toolcall.env")
