"""``python -m containers tag-stand-ins NAME``: the offline stand-ins under the public names.

Tested on a name of the ``debian:*`` entry that no one else uses (``debian:nextstate-test-<pid>``),
untagged afterwards, so the engine's real names are never touched.
"""

from __future__ import annotations

import os

import pytest

from nextstate.containers.__main__ import main
from nextstate.containers.stand_ins import stand_in_of

NAME = f"debian:nextstate-test-{os.getpid()}"


def test_a_name_maps_to_its_stand_in_and_a_bad_one_is_one_line():
    assert (stand_in_of("ubuntu:24.04"), stand_in_of("python:3.12-slim"), stand_in_of("python:3.12")) == (
        "tbench", "tbench-python", "tbench-dev")
    assert stand_in_of("python:3.13-slim") == "tbench-trixie"
    assert stand_in_of("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624") == "tbench"   # base-images.yaml
    with pytest.raises(ValueError, match="name one image with its tag"):
        stand_in_of("ubuntu:*")
    with pytest.raises(ValueError, match="has no stand-in"):
        stand_in_of("alpine:3.20")


@pytest.mark.docker
def test_tagging_a_name_only_when_asked_and_never_over_another_image(docker_client, terminal_image, capsys,
                                                                    monkeypatch):
    from nextstate.containers.build import Progress

    monkeypatch.setattr(Progress, "log_lines", Progress.log_lines)   # main() sets it for the whole process
    try:
        assert main(["tag-stand-ins", NAME]) == 0
        assert capsys.readouterr().out.strip() == f"{NAME}: tagged (nextstate/tbench:latest)"
        assert docker_client.images.get(NAME).id == docker_client.images.get("nextstate/tbench:latest").id
        assert main(["tag-stand-ins", NAME]) == 0
        assert "already tagged" in capsys.readouterr().out
        docker_client.images.get(terminal_image).tag(*NAME.split(":"))     # the name now holds another image
        assert main(["tag-stand-ins", NAME]) == 1
        assert "left alone" in capsys.readouterr().err
        assert docker_client.images.get(NAME).id == docker_client.images.get(terminal_image).id
        assert main(["tag-stand-ins", NAME, "--force"]) == 0
        assert docker_client.images.get(NAME).id == docker_client.images.get("nextstate/tbench:latest").id
    finally:
        docker_client.images.remove(NAME)
