"""The sandbox runtime moved to :mod:`containers.sandbox`; this module re-exports its public
names, so ``from envs.sandbox import Sandbox`` keeps working."""

from containers.sandbox import (DEFAULT_IMAGE, CommandResult, DockerSandbox, LocalSandbox, Sandbox,
                                SandboxConfigError, SandboxError, SandboxSpec, parse_size, unsendable)

__all__ = ["DEFAULT_IMAGE", "CommandResult", "DockerSandbox", "LocalSandbox", "Sandbox", "SandboxConfigError",
           "SandboxError", "SandboxSpec", "parse_size", "unsendable"]
