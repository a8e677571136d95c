"""The FIFO transport (``SandboxSpec(transport="fifo")``): the shell's streams around dockerd.

The protocol's own guarantees (caps, timeouts, restarts, hostile input) are the same tests as the
default transport's: run ``tests/test_sandbox.py``, ``test_hard_edges.py`` and ``test_reuse.py``
with ``NEXTSTATE_SHELL_TRANSPORT=fifo``. These are the FIFOs' own: what the container sees of
them, that nothing else can be written there, and that their directories go with their sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nextstate import containers
from nextstate.containers import fifo_shell
from nextstate.containers.docker_sandbox import DockerSandbox
from nextstate.containers.protocol import SandboxConfigError, SandboxError, SandboxSpec
from nextstate.containers.shell_transport import ExecStream


@pytest.fixture
def fifo_box(docker_client, terminal_image):
    sb = DockerSandbox(SandboxSpec(image=terminal_image, transport="fifo", disk=None), docker_client,
                       containers.owner_labels("pytest-fifo"))
    yield sb
    sb.close()


@pytest.mark.docker
def test_the_mount_is_read_only_and_holds_only_the_fifos(fifo_box):
    assert isinstance(fifo_box._shell, fifo_shell.FifoShell)
    r = fifo_box.run(f"find {fifo_shell.MOUNT} -mindepth 1 -printf '%y %f\\n' | sort; "
                     f"touch {fifo_shell.MOUNT}/x; mkdir {fifo_shell.MOUNT}/d; grep ' {fifo_shell.MOUNT} ' /proc/self/mountinfo")
    assert r.stdout.splitlines()[:3] == ["p err.1", "p in.1", "p out.1"]
    assert r.stderr.count("Read-only file system") == 2
    assert " ro," in r.stdout.splitlines()[3]
    assert sorted(p.name for p in fifo_box._shell.dir.iterdir()) == ["err.1", "in.1", "out.1"]


@pytest.mark.docker
def test_a_restarted_shell_gets_new_fifos_and_close_removes_them(fifo_box):
    r = fifo_box.run("exit 4")
    assert (r.exit_code, r.shell_restarted) == (4, True)
    assert fifo_box.run("echo $((1 + 1))").stdout == "2\n"
    assert sorted(p.name for p in fifo_box._shell.dir.iterdir()) == ["err.2", "in.2", "out.2"]
    where = fifo_box._shell.dir
    fifo_box.close()
    assert not where.exists()


@pytest.mark.docker
def test_fifos_closed_under_the_sandbox_are_a_clear_error(fifo_box):
    os.close(fifo_box._shell._in)
    assert not fifo_box.is_alive()
    with pytest.raises(SandboxError, match="stopped answering"):
        fifo_box.run("echo hi", timeout=5)


def test_a_remote_engine_falls_back_to_the_exec_stream():
    assert isinstance(DockerSandbox._transport("fifo", False, {}), ExecStream)
    with pytest.raises(SandboxConfigError, match="transport must be exec or fifo"):
        DockerSandbox._transport("pipes", True, {})


def test_reap_removes_the_dirs_of_dead_owners_and_of_a_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fifo_shell, "SHELL_ROOT", tmp_path)
    mine = fifo_shell.FifoShell("run-a")
    dead = tmp_path / "999999999.run-b.0123456789ab"   # no such pid
    dead.mkdir()
    other = fifo_shell.FifoShell("run-b")
    assert fifo_shell.reap_shell_dirs() == 1 and not dead.exists() and mine.dir.exists()
    assert fifo_shell.reap_shell_dirs("run-b") == 1 and not other.dir.exists() and mine.dir.exists()
    mine.remove()
    assert list(tmp_path.iterdir()) == []
