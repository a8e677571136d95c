"""The sandbox runtime, the floor every env stands on: sandboxes, their pool, their disks, the
images they run and the removal of what a dead run left behind.

* :mod:`containers.sandbox` -- one long-lived shell per sandbox (Docker, or a local shell): the names
  users import, from :mod:`containers.protocol` (the protocol both backends speak),
  :mod:`containers.docker_sandbox` and :mod:`containers.local_sandbox` (the backends);
* :mod:`containers.pool` -- :class:`~containers.pool.SandboxPool`, warm sandboxes leased per episode;
* :mod:`containers.disks` -- a per-sandbox disk limit on a loop-mounted ext4 disk;
* :mod:`containers.engine` -- the labels every project container carries, and owner liveness;
* :mod:`containers.reap` -- removal of leftovers whose owner died, even by SIGKILL;
* :mod:`containers.build` -- images from ``containers/<name>/`` (a ``Dockerfile`` plus an optional
  ``packages.txt``), offline through a debootstrapped root file system when no registry answers.

Nothing here imports an env: families above add their own images (the SWE family's
``python -m containers build-swe``) through the ``nextstate.containers`` entry points.
"""

from __future__ import annotations

from nextstate.containers.build import build_image, ensure_image
from nextstate.containers.engine import (HOST_LABEL, PID_LABEL, PROJECT, PROJECT_LABEL, ROLE_LABEL, RUN_LABEL, connect, owner_alive,
                     owner_labels)
from nextstate.containers.reap import project_containers, reap

__all__ = [
    "PROJECT", "PROJECT_LABEL", "RUN_LABEL", "PID_LABEL", "HOST_LABEL", "ROLE_LABEL",
    "owner_labels", "owner_alive", "connect", "project_containers", "reap", "ensure_image", "build_image",
]
