"""The relay family: a native two-agent family (reader and writer) with information split
between them; :mod:`~envs.relay.env` says how it plays. The env module's names are importable
from here, loaded on first use."""

from nextstate.envs import registry

registry.register(
    "relay", "nextstate.envs.relay.env:RelayEnv", id="nextstate/Relay-v0", config="relay.yaml",
    judge_template="relay.yaml",
    intro="You are one of two agents working as a team; each of you sees and can do different "
          "things. Use your tools, one tool call per answer.")


__getattr__ = registry.lazy_names("nextstate.envs.relay.env")
