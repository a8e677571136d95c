"""The relay family: a native two-agent family (reader and writer) with information split
between them; :mod:`~envs.relay.env` says how it plays. The env module's names are importable
from here, loaded on first use."""

import importlib
from typing import Any

from envs import registry

registry.register(
    "relay", "envs.relay.env:RelayEnv", id="nextstate/Relay-v0", config="relay.yaml",
    judge_template="relay.yaml",
    intro="You are one of two agents working as a team; each of you sees and can do different "
          "things. Use your tools, one tool call per answer.")


def __getattr__(name: str) -> Any:
    """The env module's names (``RelayEnv`` ...), imported on first use."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("envs.relay.env"), name)
