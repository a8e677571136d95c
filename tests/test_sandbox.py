"""The sandbox contract, on real Docker containers and on the local backend."""

from __future__ import annotations

import io
import os
import shutil
import socket
import time

import pytest

from nextstate import containers
from nextstate.containers.docker_sandbox import DockerSandbox
from nextstate.containers.local_sandbox import LocalSandbox
from nextstate.containers.protocol import SandboxError, SandboxSpec


@pytest.fixture(params=["auto", "exec"])
def docker_box(request, docker_client, terminal_image):
    """A Docker sandbox on each transport: the default (FIFOs, on this host) and the exec stream
    (what an engine elsewhere gets)."""
    sb = DockerSandbox(SandboxSpec(image=terminal_image, pids_limit=128, transport=request.param), docker_client,
                       containers.owner_labels("pytest-sandbox"))
    yield sb
    sb.close()


@pytest.fixture
def local_box():
    sb = LocalSandbox(SandboxSpec())
    yield sb
    sb.close()


def _contract(sb) -> None:
    """What every backend must do, whatever isolates it."""
    r = sb.run("cd /tmp && export GREETING=hello && echo out && echo err >&2 && false")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 1, False)
    r = sb.run('pwd; echo "$GREETING"; f() { echo fn; }')
    assert r.stdout == "/tmp\nhello\n"
    assert sb.run("f").stdout == "fn\n"  # shell functions persist too
    # a heredoc left open or a quote left unbalanced cannot wedge the shell
    assert sb.run("echo 'unbalanced").exit_code != 0
    assert sb.run("echo fine").stdout == "fine\n"
    # `exit` ends the shell, not the sandbox: a new shell takes over
    r = sb.run("cd / && exit 3")
    assert (r.exit_code, r.shell_restarted) == (3, True)
    assert sb.run("echo again").stdout == "again\n"
    # invalid UTF-8 is decoded safely
    assert "\ufffd" in sb.run(r"printf '\xff\xfe'").stdout
    sb.write_file("sub/dir/data.bin", bytes(range(256)))
    assert sb.read_file("sub/dir/data.bin") == bytes(range(256))
    with pytest.raises(FileNotFoundError):
        sb.read_file("no/such/file")


@pytest.mark.docker
def test_docker_contract(docker_box):
    _contract(docker_box)
    assert docker_box.run("id -u").stdout.strip() == "1000"


def test_local_contract(local_box):
    _contract(local_box)


@pytest.mark.docker
def test_sandboxes_of_one_engine_share_its_step_gate(docker_box, docker_client, terminal_image):
    """Every sandbox of an engine queues at one gate (``containers.gate``), sized by its CPUs."""
    from nextstate.containers.gate import PER_CPU, engine_gate
    gate = engine_gate(str(docker_client.api.base_url), 1)
    assert docker_box.gate is gate and gate.size == PER_CPU * (os.cpu_count() or 1)
    other = DockerSandbox(SandboxSpec(image=terminal_image), docker_client, containers.owner_labels("test-gate"))
    try:
        assert other.gate is gate
        assert other.run("echo hi").stdout == "hi\n"
    finally:
        other.close()
    assert gate._free == gate.size and not gate._queue


@pytest.mark.docker
def test_timeout_kills_the_command_and_keeps_the_shell(docker_box):
    docker_box.run("cd /tmp && export KEEP=1")
    r = docker_box.run("sleep 60; sleep 60; sleep 60", timeout=1)
    assert r.timed_out and r.exit_code != 0 and "timed out" in r.stderr
    assert r.elapsed < 10 and not r.shell_restarted
    r = docker_box.run('pwd; echo "$KEEP"')
    assert r.stdout == "/tmp\n1\n" and not r.shell_restarted
    # a builtin busy loop cannot be killed without the shell: it is restarted
    r = docker_box.run("while :; do :; done", timeout=1)
    assert r.timed_out and r.shell_restarted
    assert docker_box.run("echo back").stdout == "back\n"


@pytest.mark.docker
def test_output_flood_is_capped(docker_box):
    r = docker_box.run("yes", timeout=2)
    assert r.timed_out and r.truncated
    assert len(r.stdout) < docker_box.spec.output_limit + 200
    assert "output truncated" in r.stdout
    r = docker_box.run("head -c 1000000 /dev/zero | tr '\\0' x")
    assert r.truncated and not r.timed_out and r.exit_code == 0


@pytest.mark.docker
def test_fork_bomb_is_contained(docker_box):
    start = time.monotonic()
    docker_box.run(":(){ :|:& };:", timeout=5)
    r = docker_box.run("echo survived", timeout=20)
    assert "survived" in r.stdout
    assert time.monotonic() - start < 30
    pids = docker_box.container.attrs["HostConfig"]["PidsLimit"]
    assert pids == 128


@pytest.mark.docker
def test_no_network_no_privileges_no_host_writes(docker_box, tmp_path):
    r = docker_box.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\"")
    assert r.exit_code != 0
    assert docker_box.run("ip -o link | grep -v ' lo:' | wc -l").stdout.strip() == "0"
    assert docker_box.run("touch /etc/owned").exit_code != 0
    assert docker_box.run("grep CapEff /proc/self/status").stdout.split()[1] == "0000000000000000"
    assert docker_box.run("test -S /var/run/docker.sock").exit_code != 0
    marker = tmp_path / "escape"
    docker_box.run(f"mkdir -p {tmp_path} && echo x > {marker}")
    assert not marker.exists()
    assert docker_box.run("hostname").stdout.strip() != socket.gethostname()


@pytest.mark.docker
def test_a_sandbox_with_the_network_trusts_the_hosts_ca_bundle(docker_client, terminal_image, docker_box, tmp_path,
                                                               monkeypatch):
    """Its pip, requests, curl, git, uv and node are pointed at the host's bundle (a TLS-inspecting proxy the
    host trusts); a sandbox without the network gets none of it."""
    from nextstate.containers.build import BUILD_CA, CA_VARIABLES
    bundle = tmp_path / "host-ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nnextstate test bundle\n-----END CERTIFICATE-----\n")
    from nextstate.containers.build import CA_DEFAULTS
    for var in CA_DEFAULTS:   # where host_ca_bundle looks first
        monkeypatch.setenv(var, str(bundle))
    sb = DockerSandbox(SandboxSpec(image=terminal_image, network=True, env={"PIP_CERT": "/own.crt"}), docker_client,
                       containers.owner_labels("pytest-sandbox"))
    try:
        seen = dict(line.split("=", 1) for line in sb.run("env").stdout.splitlines() if "=" in line)
        assert {var: seen.get(var) for var in CA_VARIABLES} == {**{var: BUILD_CA for var in CA_VARIABLES},
                                                                "PIP_CERT": "/own.crt"}   # the spec's own wins
        assert sb.read_file(BUILD_CA) == bundle.read_bytes()
        assert sb.run(f"echo x > {BUILD_CA}").exit_code != 0   # read-only
    finally:
        sb.close()
    assert "SSL_CERT_FILE" not in docker_box.run("env").stdout
    assert docker_box.run(f"test -e {BUILD_CA}").exit_code != 0


@pytest.mark.docker
def test_copy_in_and_out(docker_box, tmp_path):
    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "nested" / "b.txt").write_text("beta")
    docker_box.copy_in(src, "/app/project")
    assert docker_box.run("cat /app/project/nested/b.txt").stdout == "beta"
    docker_box.run("echo gamma > /app/project/c.txt")
    docker_box.copy_out("/app/project", tmp_path / "back")
    assert (tmp_path / "back" / "c.txt").read_text() == "gamma\n"
    assert (tmp_path / "back" / "nested" / "b.txt").read_text() == "beta"


@pytest.mark.docker
def test_killed_container_raises_a_clear_error(docker_box, docker_client):
    docker_client.containers.get(docker_box.container.id).kill()
    with pytest.raises(SandboxError, match="stopped answering"):
        docker_box.run("echo hi", timeout=5)
    assert not docker_box.is_alive()


@pytest.mark.docker
def test_a_shell_connection_closed_under_the_sandbox_is_a_clear_error(docker_box, sever_shell):
    """The shell's socket (or stdin FIFO) closed from elsewhere (EBADF on the next call, seen once
    in 320 relay episodes) is a sandbox that stopped answering, not a bare OSError."""
    sever_shell(docker_box)
    assert not docker_box.is_alive()
    with pytest.raises(SandboxError, match="stopped answering"):
        docker_box.run("echo hi", timeout=5)


def test_local_timeout_and_restart(local_box):
    r = local_box.run("sleep 30", timeout=0.5)
    assert r.timed_out and not r.shell_restarted
    assert local_box.run("echo ok").stdout == "ok\n"


def _fake_bwrap(tmp_path, monkeypatch, fail_first: int, message: str) -> None:
    """A ``bwrap`` first on PATH that fails its first ``fail_first`` starts with ``message`` (what a
    mount race makes bubblewrap print: the race itself cannot be made on demand), then runs the real one."""
    real = shutil.which("bwrap")
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "bwrap"
    script.write_text(f"""#!/bin/bash
n=$(cat {tmp_path}/starts 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/starts
if [ "$n" -lt {fail_first} ]; then echo "bwrap: {message}" >&2; exit 1; fi
exec {real} "$@"
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
def test_local_start_tries_again_when_a_mount_goes_away_meanwhile(tmp_path, monkeypatch):
    _fake_bwrap(tmp_path, monkeypatch, 2, "Unable to apply mount flags: remount /var/lib/docker/overlay2/x/merged")
    sb = LocalSandbox(SandboxSpec())
    try:
        assert sb.run("echo ok").stdout == "ok\n" and (tmp_path / "starts").read_text() == "3\n"
    finally:
        sb.close()


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
@pytest.mark.parametrize("fail_first, message, starts", [
    (99, "Creating new namespace failed: Operation not permitted", "1"),   # not a race: no second try
    (99, "Unable to apply mount flags: remount /x: No such file or directory", "3"),
])
def test_local_start_that_bubblewrap_refuses_is_one_error(tmp_path, monkeypatch, fail_first, message, starts):
    _fake_bwrap(tmp_path, monkeypatch, fail_first, message)
    with pytest.raises(SandboxError, match="^bubblewrap could not start the sandbox: bwrap: " + message.split(":")[0]):
        LocalSandbox(SandboxSpec())
    assert (tmp_path / "starts").read_text().strip() == starts


# -- hard edges (issue 15) ---------------------------------------------------------------------
@pytest.mark.docker
def test_fork_bomb_timeout_holds_and_restart_clears_it(docker_box):
    """The kill comes from the host's cgroup, so it needs no process inside the container."""
    docker_box.run(":(){ :|:& };:", timeout=5)
    time.sleep(1)  # the bomb reaches the pid limit
    r = docker_box.run("sleep 30", timeout=3)
    assert r.timed_out and r.elapsed < 3 + 2, r.elapsed
    r = docker_box.run("echo survived", timeout=10)
    assert "survived" in r.stdout
    r = docker_box.run("ps -e --no-headers | wc -l", timeout=10)
    assert r.exit_code == 0 and int(r.stdout) < 10, r.output  # no bomb process outlived the kill
    cid = docker_box.container.id
    docker_box.close()
    import docker
    with pytest.raises(docker.errors.NotFound):
        docker_box.client.containers.get(cid)


@pytest.mark.docker
def test_restarted_shell_takes_background_processes_with_it(docker_box):
    docker_box.run("sleep 1000 & sleep 1001 &")
    r = docker_box.run("while :; do :; done", timeout=1)
    assert r.shell_restarted
    assert "sleep 100" not in docker_box.run("ps -eo args").stdout


@pytest.mark.docker
def test_nul_bytes_and_lone_surrogates_are_refused_at_once(docker_box):
    for command in ("echo a\x00b", "echo \ud800"):
        r = docker_box.run(command, timeout=5)
        assert r.exit_code == 2 and "not run" in r.stderr
        assert not r.timed_out and not r.shell_restarted
    assert docker_box.run("echo fine").stdout == "fine\n"


@pytest.mark.docker
@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, 0, 10 ** 400])
def test_bad_timeouts_raise_before_sending(docker_box, timeout):
    with pytest.raises(ValueError, match="positive finite"):
        docker_box.run("echo x", timeout=timeout)
    r = docker_box.run("echo clean")
    assert r.stdout == "clean\n" and r.stderr == ""


@pytest.mark.docker
def test_background_output_is_attributed_and_floods_cannot_hide_the_marker(docker_box):
    def wait_for_file(path: str) -> None:   # looked at from outside, so the shell reads nothing
        deadline = time.monotonic() + 30
        while docker_box.container.exec_run(["test", "-e", path]).exit_code != 0:
            assert time.monotonic() < deadline, f"{path} did not appear"
            time.sleep(0.1)

    docker_box.run("(for i in 1 2 3; do echo tick$i; done; sleep 0.3; echo late; touch /tmp/bg1) &")
    wait_for_file("/tmp/bg1")
    r = docker_box.run("echo mine")
    assert r.stdout == "mine\n" and "late" in r.background and "late" in r.output
    # a background flood right after the marker: the next result keeps its own output
    r = docker_box.run("(sleep 0.2; head -c 300000 /dev/zero | tr '\\0' y; touch /tmp/bg2) & echo fg", timeout=10)
    assert r.stdout.startswith("fg\n") and not r.shell_restarted
    wait_for_file("/tmp/bg2")
    r = docker_box.run("echo next", timeout=10)
    assert r.stdout.endswith("next\n") and not r.shell_restarted and not r.timed_out
    assert r.background.startswith("yyy")


def test_end_marker_found_after_any_flood():
    from nextstate.containers.protocol import _Capped
    c = _Capped(16, b"\n\x1eabc:")
    c.feed(b"x" * 100_000 + b"\n\x1eab")
    c.feed(b"c:7\x1e" + b"y" * 100_000)   # the marker split across chunks, then a flood
    assert c.done()
    text, rc, truncated = c.text()
    assert rc == 7 and truncated and text.startswith("x" * 16) and len(c.late) == 100_000


@pytest.mark.parametrize("chunks, text, rc", [
    ([b"a\n\x1eabc:", b"-1", b"2\x1erest"], "a", -12),        # the code split across three chunks
    ([b"\n\x1eabc:x\x1e", b"b\n\x1eabc:0\x1e"], "\n\x1eabc:x\x1eb", 0),   # a marker without a code is output
    ([b"\n\x1eabc:", b"\n\x1eabc:5\x1e"], "\n\x1eabc:", 5),
])
def test_end_marker_needs_its_whole_exit_code(chunks, text, rc):
    from nextstate.containers.protocol import _Capped
    c = _Capped(None, b"\n\x1eabc:")
    for chunk in chunks[:-1]:
        c.feed(chunk)
        assert not c.done()
    c.feed(chunks[-1])
    assert c.done() and c.text()[:2] == (text, rc)
    err = _Capped(None, b"\x1eabc!")
    err.feed(b"oops\x1eab")
    err.feed(b"c!0\x1elate")
    assert err.text()[:2] == ("oops", 0) and bytes(err.late) == b"late"


def test_the_protocol_passes_by_names_the_agent_redefines(local_box):
    """An agent's functions or aliases named eval, read or printf do not reach the protocol; a
    function named `builtin` (which it cannot pass by) costs one timeout and a restarted shell."""
    local_box.run("eval() { echo hijacked; }; read() { :; }; printf() { :; }")
    assert local_box.run("echo one").stdout == "one\n"
    assert local_box.run("echo two").stdout == "two\n"   # not one command late
    assert local_box.run("sleep 30", timeout=1).timed_out
    assert local_box.run("eval x").stdout == "hijacked\n"   # the agent's own function is its business
    local_box.run("shopt -s expand_aliases; alias eval='echo A' read='echo B' builtin='echo C'")
    r = local_box.run("echo three; false")
    assert (r.stdout, r.stderr, r.exit_code) == ("three\n", "", 1)
    local_box.run("unalias -a")
    r = local_box.run("builtin() { echo hijacked; }", timeout=1)
    assert r.shell_restarted
    assert local_box.run("echo four").stdout == "four\n"


def test_the_shell_parses_its_loop_once_and_the_protocol_keeps_no_state(local_box):
    """bash parses a pipe one byte a `read`, so it parses the protocol's loop once and then only
    `read -N`s; nothing the agent sets (the protocol's variables, TMOUT) or does at the top level
    (`break`, `continue`, deeper than the loop) reaches it: every command gets its own result."""
    from nextstate.containers.protocol import _frame

    assert _frame("0123456789", b"echo hi") == b"H0000000007echo hiN0123456789"
    local_box.run("__ns_h=N0000000000; __ns_cmd=x; __ns_rc=9; __ns_x=xv; TMOUT=1")
    time.sleep(1.5)   # past TMOUT: the loop's wait for the next command is not cut short
    r = local_box.run("echo one; (exit 3)")
    assert (r.stdout, r.stderr, r.exit_code, r.shell_restarted) == ("one\n", "", 3, False)
    for word in ("break", "continue", "break 9", "continue 9", "for i in 1; do break 2; done"):
        r = local_box.run(f"cd /tmp; {word}")
        assert (r.stdout, r.exit_code, r.shell_restarted) == ("", 0, False), (word, r)
        r = local_box.run("pwd; false")
        assert (r.stdout, r.stderr, r.exit_code, r.shell_restarted) == ("/tmp\n", "", 1, False), (word, r)
        local_box.run("cd /")
    # the loop sent again after a `break` is parsed without the agent's aliases, which stay on
    local_box.run("shopt -s expand_aliases; alias while='echo W' case='echo C' done=: hi='echo alias'")
    assert local_box.run("break").exit_code == 0
    r = local_box.run("hi; shopt -q expand_aliases")
    assert (r.stdout, r.exit_code, r.shell_restarted) == ("alias\n", 0, False), r


def test_set_x_traces_the_commands_not_the_protocol(local_box):
    local_box.run("cd /tmp; set -x")
    r = local_box.run("echo hi")
    assert r.stdout == "hi\n" and r.stderr.endswith(" echo hi\n") and r.stderr.count("\n") == 1, r.stderr
    local_box.run("set +x -v")
    r = local_box.run("pwd")
    assert r.stdout == "/tmp\n" and "\x1e" not in r.stderr and "__ns" not in r.stderr, r.stderr
    local_box.run("set +v")
    assert local_box.run("echo quiet").stderr == ""


def test_paths_with_a_nul_byte_are_refused_at_once(local_box, tmp_path):
    for call in (lambda: local_box.write_file("a\x00b", "x"), lambda: local_box.read_file("a\x00b"),
                 lambda: local_box.copy_in(tmp_path, "a\x00b"), lambda: local_box.copy_out("a\x00b", tmp_path)):
        with pytest.raises(ValueError, match="NUL byte"):
            call()
    r = local_box.run("echo fine")
    assert r.stdout == "fine\n" and not r.shell_restarted


@pytest.mark.docker
def test_an_oom_kill_says_out_of_memory_and_its_limit(docker_client, terminal_image):
    with DockerSandbox(SandboxSpec(image=terminal_image, memory="256m"), docker_client,
                       containers.owner_labels("pytest-sandbox")) as sb:
        hog = "python3 -c 'x = bytearray(2 ** 30)'"
        r = sb.run(f"{hog}; echo after", timeout=60)   # a child killed, the command goes on
        assert r.stdout == "after\n" and "[out of memory (limit 256 MiB)" in r.stderr, r.stderr
        sb._cgroup.close()
        sb._cgroup = None   # as on a remote engine: the count is read from inside after a 137
        r = sb.run("sh -c 'kill -9 $$'")
        assert r.exit_code == 137 and "out of memory" not in r.stderr   # a 137 of another kind
        r = sb.run(hog, timeout=60)
        assert r.exit_code == 137 and "[out of memory (limit 256 MiB)" in r.stderr, r.stderr


@pytest.mark.docker
@pytest.mark.parametrize("transport", ["exec", "fifo"])
def test_a_shell_that_cannot_start_fails_the_sandbox_at_once(docker_client, terminal_image, transport):
    """An image without bash: one SandboxError that says so (a start that failed used to start the
    shell again from within, until Python's recursion limit)."""
    tag = f"nextstate-test/no-bash:{os.getpid()}"
    docker_client.images.build(fileobj=io.BytesIO(f"FROM {terminal_image}\nUSER root\nRUN rm -f /bin/bash "
                                                  "/usr/bin/bash\n".encode()), tag=tag, rm=True,
                               labels=containers.owner_labels("pytest-sandbox"))
    try:
        with pytest.raises(SandboxError, match="has the image bash|bash.*not found") as e:
            DockerSandbox(SandboxSpec(image=tag, transport=transport), docker_client,
                          containers.owner_labels("pytest-sandbox"))
        assert "recursion" not in str(e.value)
        assert not docker_client.containers.list(all=True, filters={"ancestor": tag})   # removed
    finally:
        docker_client.images.remove(tag, force=True)
