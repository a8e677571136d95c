"""The FIFO transport (``SandboxSpec(transport="fifo")``, and ``"auto"``, the default, on this
host): the shell's streams around dockerd.

The protocol's own guarantees (caps, timeouts, restarts, hostile input) are the same tests on both
transports: ``tests/test_sandbox.py`` and ``test_hard_edges.py`` run their Docker sandboxes on
each. These are the FIFOs' own: what the container sees of them, that nothing else can be written
there, that their directories go with their sandbox, and that an engine whose containers cannot
see them gets the exec stream.
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
    assert isinstance(DockerSandbox._transport("auto", False, {}), ExecStream)
    with pytest.raises(SandboxConfigError, match="transport must be auto, exec or fifo"):
        DockerSandbox._transport("pipes", True, {})


@pytest.mark.docker
def test_the_default_gives_fifos_where_the_container_sees_them(docker_client, terminal_image, monkeypatch):
    monkeypatch.delenv("NEXTSTATE_SHELL_TRANSPORT", raising=False)
    monkeypatch.setattr(DockerSandbox, "_fifo_support", {})
    spec = SandboxSpec(image=terminal_image, disk=None)
    assert spec.transport == "auto"
    with DockerSandbox(spec, docker_client, containers.owner_labels("pytest-fifo")) as sb:
        assert isinstance(sb._shell, fifo_shell.FifoShell) and sb.run("echo hi").stdout == "hi\n"
        assert sb._shell.unseen_by(sb._init_pid) is None
        assert "no process of this host" in sb._shell.unseen_by(os.getpid())   # not in the container
    assert DockerSandbox._fifo_support == {str(docker_client.api.base_url): True}


@pytest.mark.docker
@pytest.mark.parametrize("transport", ["auto", "fifo"])
@pytest.mark.parametrize("where", ["elsewhere", "unmountable"])
def test_an_engine_whose_containers_cannot_see_the_fifos_gets_the_exec_stream(
        docker_client, terminal_image, monkeypatch, tmp_path, caplog, transport, where):
    """Stand-ins for an engine on a unix socket that is not on this host's filesystem (a socket
    given to a container, a VM's): the container is given a directory other than the FIFOs'
    (docker makes a missing one), or one the engine cannot make. Either way the sandbox works on
    the exec stream, with its disk limit, and the engine's next sandbox does not try FIFOs."""
    source = str(tmp_path / "not-the-fifos") if where == "elsewhere" else "/sys/nextstate-unmountable"
    monkeypatch.setattr(fifo_shell.FifoShell, "bind", lambda self: {source: {"bind": fifo_shell.MOUNT, "mode": "ro"}})
    monkeypatch.setattr(DockerSandbox, "_fifo_support", {})
    monkeypatch.setattr(DockerSandbox, "_fifo_said", False)
    def mine() -> set[Path]:
        return set(fifo_shell.SHELL_ROOT.glob(f"{os.getpid()}.*"))

    made = mine()
    spec = SandboxSpec(image=terminal_image, transport=transport, disk="64m")
    with caplog.at_level("INFO", logger="nextstate.containers.docker_sandbox"):
        with DockerSandbox(spec, docker_client, containers.owner_labels("pytest-fifo")) as sb:
            assert isinstance(sb._shell, ExecStream) and sb.run("echo hi").stdout == "hi\n"
            assert sb._disk is not None or sb._disk_limit is not None   # a loop disk, or the watchdog
        assert mine() == made   # the FIFOs' directory went with it
        with DockerSandbox(spec, docker_client, containers.owner_labels("pytest-fifo")) as sb:
            assert isinstance(sb._shell, ExecStream)
    [said] = [r for r in caplog.records if "not FIFOs" in r.getMessage()]
    assert said.levelname == ("WARNING" if transport == "fifo" else "INFO")
    assert ("another directory" if where == "elsewhere" else "cannot mount") in said.getMessage()


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


@pytest.mark.docker
def test_a_container_that_exits_at_once_does_not_cost_the_engine_its_fifos(docker_client, terminal_image,
                                                                          monkeypatch):
    """Its init is gone before the mount is looked at: that says nothing of the engine."""
    monkeypatch.setattr(DockerSandbox, "_fifo_support", {})
    with pytest.raises(SandboxError):
        DockerSandbox(SandboxSpec(image=terminal_image, transport="auto", disk=None, command=["true"]),
                      docker_client, containers.owner_labels("pytest-fifo"))
    assert DockerSandbox._fifo_support.get(str(docker_client.api.base_url)) is not False
    with DockerSandbox(SandboxSpec(image=terminal_image, transport="auto", disk=None), docker_client,
                       containers.owner_labels("pytest-fifo")) as sb:
        assert isinstance(sb._shell, fifo_shell.FifoShell)
