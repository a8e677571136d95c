"""Sandboxes: one isolated machine an episode acts in.

A :class:`Sandbox` behaves like a terminal someone types into: one long-lived
``bash`` per sandbox receives every command, so the working directory,
environment variables and shell state persist between :meth:`Sandbox.run`
calls, and a command costs a round trip through a pipe instead of a
``docker exec`` (about 100x cheaper).

Two backends share the same wire protocol (:mod:`containers.protocol`):

* :class:`DockerSandbox` (:mod:`containers.docker_sandbox`) -- a container with
  no network, a non-root user, all capabilities dropped, ``no-new-privileges``
  and pids/memory/CPU limits.
* :class:`LocalSandbox` (:mod:`containers.local_sandbox`) -- a ``bash`` on this
  machine in a scratch directory, inside bubblewrap when it is installed. It
  isolates far less; it exists for machines without Docker.

This module is where users import them from: it holds no code of its own, so
it can import both backends, and they import the protocol, without a circle.
"""

from __future__ import annotations

from nextstate.containers.docker_sandbox import DockerSandbox
from nextstate.containers.local_sandbox import LocalSandbox, warn_local_backend
from nextstate.containers.protocol import (DEFAULT_IMAGE, CommandResult, ResetResult, Sandbox, SandboxConfigError,
                                           SandboxError, SandboxSpec, parse_size, unsendable)

__all__ = ["DEFAULT_IMAGE", "CommandResult", "DockerSandbox", "LocalSandbox", "ResetResult", "Sandbox",
           "SandboxConfigError", "SandboxError", "SandboxSpec", "parse_size", "unsendable", "warn_local_backend"]
