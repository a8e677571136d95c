"""The containers package against a real Docker engine: image builds and reaping."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import pytest

from nextstate import containers
from nextstate.containers import PID_LABEL, owner_labels, reap
from nextstate.containers.build import build, build_image, known_images, parent_of, read_packages

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    """A client of the engine; skips off CI when none runs, fails on CI."""
    try:
        return containers.connect()
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def terminal(client: docker.DockerClient) -> str:
    """The terminal image's tag, built when missing."""
    return containers.ensure_image("terminal", client=client)


@pytest.fixture
def run_id(client: docker.DockerClient):
    """A fresh run id whose containers are removed afterwards."""
    rid = f"test-{uuid.uuid4().hex[:12]}"
    yield rid
    reap(client, run_id=rid)


def dead_pid() -> int:
    """The pid of a process that has exited and been waited for."""
    proc = subprocess.Popen(["sleep", "60"])
    proc.kill()
    proc.wait()
    return proc.pid


def start(client: docker.DockerClient, image: str, labels: dict[str, str]):
    """A detached container of `image` with `labels`."""
    return client.containers.run(image, detach=True, init=True, labels=labels)


def test_known_images_and_packages() -> None:
    assert "terminal" in known_images()
    packages = read_packages(Path(containers.__file__).parent / "terminal")
    assert {"python3", "git", "python3-pytest", "jq"} <= set(packages)
    assert parent_of(Path(containers.__file__).parent / "terminal") is None


def test_terminal_build_is_cached(client: docker.DockerClient, terminal: str) -> None:
    first = build("terminal", client=client)
    second = build("terminal", client=client)
    assert first.tag == second.tag == terminal == "nextstate/terminal:latest"
    assert second.cached
    assert second.image_id == first.image_id


def test_terminal_image_contents(client: docker.DockerClient, terminal: str, run_id: str) -> None:
    script = ("id -u; pwd; python3 -c 'import sys; print(sys.version_info[0])'; "
              "git --version; python3 -m pytest --version")
    out = client.containers.run(terminal, ["sh", "-c", script], remove=True, labels=owner_labels(run_id))
    lines = out.decode().split("\n")
    assert lines[0] == "1000"
    assert lines[1] == "/app"
    assert lines[2] == "3"
    assert lines[3].startswith("git version")
    assert "pytest" in out.decode()


def test_build_image_on_terminal(client: docker.DockerClient, terminal: str, tmp_path: Path, run_id: str) -> None:
    (tmp_path / "Dockerfile").write_text(
        "ARG BASE=nextstate/terminal:latest\nFROM ${BASE}\nCOPY task.txt /app/task.txt\n"
    )
    (tmp_path / "task.txt").write_text("one\n")
    tag = f"nextstate-test/task-{uuid.uuid4().hex[:8]}:latest"
    try:
        assert build_image(tmp_path, tag, client=client) == tag
        first = client.images.get(tag).id
        build_image(tmp_path, tag, client=client)
        assert client.images.get(tag).id == first  # cache hit
        (tmp_path / "task.txt").write_text("two\n")
        build_image(tmp_path, tag, client=client)
        assert client.images.get(tag).id != first  # input changed: rebuilt
        out = client.containers.run(tag, ["cat", "task.txt"], remove=True, labels=owner_labels(run_id))
        assert out == b"two\n"
    finally:
        client.images.remove(tag, force=True)


def test_a_task_image_build_is_one_progress_line(client: docker.DockerClient, terminal: str, tmp_path: Path,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """What a first ``reset()`` prints while it builds a task's image: one line, redrawn in place
    (its ``\r`` updates show the Dockerfile steps), ending in what was built."""
    (tmp_path / "Dockerfile").write_text("ARG BASE=nextstate/terminal:latest\nFROM ${BASE}\n"
                                         f"RUN echo {uuid.uuid4().hex} > /tmp/one\nRUN echo two > /tmp/two\nWORKDIR /app\n")
    tag = f"nextstate-test/task-{uuid.uuid4().hex[:8]}:latest"
    try:
        capfd.readouterr()
        build_image(tmp_path, tag, client=client)
        err = capfd.readouterr().err
        lines = [line for line in err.split("\n") if line.strip()]
        assert len(lines) == 1, lines
        assert "Step 3/" in lines[0] and lines[0].split("\r")[-1].startswith(f"built {tag}")
    finally:
        client.images.remove(tag, force=True)


def test_reap_removes_dead_owner_only(client: docker.DockerClient, terminal: str, run_id: str) -> None:
    orphan = start(client, terminal, {**owner_labels(run_id), PID_LABEL: str(dead_pid())})
    owned = start(client, terminal, owner_labels(run_id))
    reap(client)  # its count may miss the orphan when another process's reap got there first
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(orphan.id)
    assert client.containers.get(owned.id).status in {"created", "running"}
    assert reap(client, run_id=run_id) == 1
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(owned.id)


def test_reap_ignores_other_hosts(client: docker.DockerClient, terminal: str, run_id: str) -> None:
    labels = {**owner_labels(run_id), PID_LABEL: str(dead_pid()), containers.HOST_LABEL: "elsewhere"}
    other = start(client, terminal, labels)
    reap(client)
    assert client.containers.get(other.id)
    assert reap(client, all_hosts=True, run_id=run_id) == 1


def test_reap_survives_vanished_container(client: docker.DockerClient) -> None:
    """A container listed but gone by the time it is removed is skipped."""

    class Vanishing:
        def __init__(self, real: docker.DockerClient) -> None:
            self.real = real
            self.base_url = real.api.base_url

        def containers(self, **_: object) -> list[dict]:
            labels = {**owner_labels("gone"), PID_LABEL: str(dead_pid())}
            return [{"Id": "0" * 64, "Labels": labels}]

        def remove_container(self, *args: object, **kwargs: object) -> None:
            self.real.api.remove_container(*args, **kwargs)

    fake = type("Client", (), {"api": Vanishing(client)})()
    assert reap(fake) == 0


def test_reap_leaves_a_removal_the_engine_times_out_on_for_next_time(monkeypatch, caplog) -> None:
    """An engine that does not answer a removal in time (hung dockerd) fails no caller: that
    container and the rest are left for the next reap with one warning (each would wait out the
    whole timeout), and no disk is reaped this time."""
    import importlib

    import requests

    from nextstate.containers import engine

    reap_module = importlib.import_module("nextstate.containers.reap")   # the package re-exports reap()
    monkeypatch.setattr(engine, "_UNANSWERED", {})
    labels = {**owner_labels("gone"), PID_LABEL: str(dead_pid())}
    asked, disks = [], []

    class Hung:
        base_url = "http+docker://hung"

        def containers(self, **_: object) -> list[dict]:
            return [{"Id": c * 64, "Labels": labels} for c in "abc"]

        def remove_container(self, container_id: str, **_: object) -> None:
            asked.append(container_id)
            raise requests.exceptions.ReadTimeout("read timed out (60 s)")

    monkeypatch.setattr(reap_module, "reap_disks", lambda **kw: disks.append(kw))
    fake = type("Client", (), {"api": Hung()})()
    with caplog.at_level("WARNING"):
        assert reap(fake) == 0
    assert asked == ["a" * 64] and disks == []
    assert "aaaaaaaaaaaa" in caplog.text and "next reap" in caplog.text
    assert sum("moby/moby#46661" in r.getMessage() for r in caplog.records) == 1


def test_removals_go_to_an_engine_one_at_a_time_and_none_after_one_unanswered(tmp_path, monkeypatch) -> None:
    """Two removals at once on an engine that never answers (a real socket that accepts and
    stays silent): one request reaches it, times out, and the other fails at once (no second
    request); after the pause, removals are sent again."""
    import socket
    import threading
    import time

    import requests

    from nextstate.containers import engine

    monkeypatch.setattr(engine, "_UNANSWERED", {})
    path = tmp_path / "silent.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(8)
    requests_seen, conns = [], []

    def accept() -> None:
        with contextlib.suppress(OSError):   # until the server is closed
            while True:
                conns.append(server.accept()[0])
                if (data := conns[-1].recv(65536)).startswith(b"DELETE"):
                    requests_seen.append(data.split(b" ")[1])

    threading.Thread(target=accept, daemon=True).start()
    client = docker.DockerClient(base_url=f"unix://{path}", version="1.41", timeout=1)
    errors = []

    def remove(cid: str) -> None:
        started = time.monotonic()
        try:
            engine.remove_container(client, cid)
        except requests.exceptions.Timeout as e:
            errors.append((cid, time.monotonic() - started, str(e)))

    threads = [threading.Thread(target=remove, args=(c * 64,)) for c in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(requests_seen) == 1 and len(errors) == 2
    assert sum("left a removal unanswered" in e[2] for e in errors) == 1
    monkeypatch.setattr(engine, "UNANSWERED_PAUSE", 0.0)
    remove("c" * 64)
    assert len(requests_seen) == 2
    server.close()
    for c in conns:
        c.close()


def test_chain_and_hash_follow_parents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nextstate.containers import build as b

    for name, base in [("root", "debian:bookworm-slim"), ("child", "nextstate/root:latest")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "Dockerfile").write_text(f"ARG BASE={base}\nFROM ${{BASE}}\n")
    (tmp_path / "child" / "packages.txt").write_text("xvfb  # a comment\n\nchromium\n")
    monkeypatch.setattr(b, "ROOT", tmp_path)
    assert b.known_images() == ["root", "child"]
    assert b.chain(tmp_path / "child") == [tmp_path / "root", tmp_path / "child"]
    assert b.read_packages(tmp_path / "child") == ["xvfb", "chromium"]
    before = b.chain_hash(b.chain(tmp_path / "child"))
    assert b.chain_hash(b.chain(tmp_path / "child")) == before
    (tmp_path / "root" / "extra.sh").write_text("echo\n")
    assert b.chain_hash(b.chain(tmp_path / "child")) != before
    assert b.suite_of(b.chain(tmp_path / "child")) == "bookworm"
    (tmp_path / "child" / "suite").write_text("# the release\ntrixie\n")   # the leaf moves its chain
    assert b.suite_of(b.chain(tmp_path / "child")) == "trixie" and b.suite_of([tmp_path / "root"]) == "bookworm"
    with pytest.raises(ValueError, match="unknown image"):
        b.image_dir("nope")


def test_cli_list_and_reap(client: docker.DockerClient, terminal: str, run_id: str) -> None:
    box = start(client, terminal, owner_labels(run_id))
    cli = [sys.executable, "-m", "containers"]
    listed = subprocess.run([*cli, "list"], capture_output=True, text=True, check=True).stdout
    assert box.id[:12] in listed and run_id in listed
    out = subprocess.run([*cli, "reap", "--run-id", run_id], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "removed 1 container"


def test_containers_cpu_counts_a_removed_containers_work(client: docker.DockerClient, terminal: str,
                                                         run_id: str) -> None:
    """bench's split of the CPU outside its process: what a container burned is counted after
    the container is gone (its parent cgroup keeps the count)."""
    from bench import containers_cpu_s

    before = containers_cpu_s()
    if before is None:
        pytest.skip("this engine's containers share no parent cgroup (the systemd driver)")
    busy = "import time\nwhile time.process_time() < 0.5: pass"   # half a CPU second, however loaded
    client.containers.run(terminal, ["python3", "-c", busy], remove=True, network_mode="none",
                          labels=owner_labels(run_id))
    assert containers_cpu_s() - before >= 0.5
