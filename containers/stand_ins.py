"""The offline stand-ins of public base images, tagged under the public names on request.

``python -m containers tag-stand-ins ubuntu:24.04 python:3.12-slim`` builds the stand-in that the
base image tables name for each (the user's ``NEXTSTATE_BASE_IMAGES``, ``containers/base-images.yaml``
for terminal-bench's ``ghcr.io/laude-institute/t-bench/*``, then ``containers/public-bases.yaml``:
``tbench``, ``tbench-python``, ``tbench-dev``, ``tbench-trixie``, ``tbench-bullseye``, ``tbench-deveval``)
and tags it in the local engine as that name, so a tool that builds ``FROM ubuntu:24.04`` itself
(Harbor's ``docker`` environment, docker compose) finds it here unchanged. Nothing is tagged unless asked, and a name
the engine already holds (the original, or another image) is left alone unless ``force``. The
stand-ins differ from the originals as public-bases.yaml says.
"""

from __future__ import annotations

import docker

from nextstate.containers.build import (PUBLIC_TABLE, _read_table, base_images, ensure_image, image_info,
                                        local_base)


def stand_in_of(name: str) -> str:
    """The known image the base image tables, then public-bases.yaml, map the image name ``name``
    (with its tag) to: the first match, as a build resolves a ``FROM``."""
    if any(c in name for c in "*?[") or ":" not in name.rsplit("/", 1)[-1]:
        raise ValueError(f"{name!r}: name one image with its tag, such as ubuntu:24.04")
    public = _read_table(PUBLIC_TABLE)
    found = local_base(name, public)
    if found is None:
        raise ValueError(f"{name!r} has no stand-in in base-images.yaml or {PUBLIC_TABLE.name} "
                         f"(patterns: {', '.join(p for p, _ in [*base_images(), *public])})")
    return found


def tag_stand_ins(client: docker.DockerClient, names: list[str], force: bool = False) -> list[tuple[str, str, str]]:
    """Tag each name's stand-in as the name; ``(name, stand-in tag, what happened)`` for each."""
    stand_ins = {name: stand_in_of(name) for name in names}     # every name checked before anything is tagged
    done = []
    for name, local in stand_ins.items():
        tag = ensure_image(local, client=client)
        image = client.images.get(tag)
        held = image_info(client, name)
        if held is not None and held["Id"] == image.id:
            done.append((name, tag, "already tagged"))
            continue
        if held is not None and not force:
            raise ValueError(f"{name} is already an image here ({held['Id'][7:19]}), not the stand-in: "
                             "left alone (--force replaces the tag)")
        repo, _, version = name.rpartition(":")
        image.tag(repo, version)
        done.append((name, tag, "tagged"))
    return done
