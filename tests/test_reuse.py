"""Reusing sandboxes: a verified reset (``SandboxPool(reset="verified")``), or a fresh sandbox.

The hostile episodes run in real Docker sandboxes; the next lease of the same container
must see nothing of them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nextstate import containers
from nextstate.containers.docker_sandbox import DockerSandbox, layer_changes
from nextstate.containers.pool import SandboxPool
from nextstate.containers.protocol import SandboxSpec
from nextstate.envs.base import play
from nextstate.envs.gui.env import GUIEnv
from nextstate.envs.swe.env import SWEEnv
from nextstate.envs.terminal.env import TerminalEnv
from nextstate.train.config import ConfigError, load_config

# Everything an episode can leave behind, as the sandbox's user: processes that outlive the
# shell (a background job, nohup, setsid, a double-forked daemon that ignores SIGTERM), a
# file in every directory it may write, files it locked itself out of, SysV IPC objects,
# a full /dev/shm, and changes to the shell (environment, umask, cwd, functions, traps).
HOSTILE = r"""
sleep 1001 & disown
nohup sleep 1002 >/dev/null 2>&1 &
setsid sleep 1003 >/dev/null 2>&1 < /dev/null &
(setsid sh -c 'trap "" TERM HUP; while :; do sleep 1; done' >/dev/null 2>&1 < /dev/null &)
for d in $(find / -xdev -type d -writable 2>/dev/null) /dev/shm /dev/mqueue; do
  echo hostile > "$d/hostile-file" 2>/dev/null
done
mkdir -p ~/hostile-dir/deep /tmp/hostile-dir && touch ~/hostile-dir/deep/f /tmp/hostile-dir/g
chmod 000 ~/hostile-dir/deep ~/hostile-dir /tmp/hostile-dir
touch /tmp/hostile-suid && chmod 4777 /tmp/hostile-suid
ln -s /etc/passwd /tmp/hostile-link; ln -s ~/.bashrc /tmp/hostile-link2; mkfifo /tmp/hostile-fifo
ipcmk -M 4096 >/dev/null; ipcmk -Q >/dev/null; ipcmk -S 1 >/dev/null
dd if=/dev/zero of=/dev/shm/hostile-fill bs=1M 2>/dev/null
export HOSTILE_VAR=1 PATH=/tmp:$PATH; umask 077; cd /tmp; hostile() { :; }; trap 'echo x' EXIT
echo played
"""
# As root, also files owned by other users, and an attempt at an immutable file (no
# sandbox has CAP_LINUX_IMMUTABLE, so it fails; the next test makes one from the host).
HOSTILE_ROOT = HOSTILE + r"""
touch /tmp/hostile-nobody && chown nobody:nogroup /tmp/hostile-nobody && chmod 000 /tmp/hostile-nobody
mkdir -p /opt/hostile-root && chown -R 65534:65534 /opt/hostile-root
chattr +i /tmp/hostile-nobody 2>/dev/null && echo immutable
"""
# What the next lease looks at: processes, every writable place, IPC, /dev/shm, the shell.
LOOK = r"""
ps -eo args= | grep -v -e '^ps' -e '^bash' -e '^sort' -e '^grep' | sort
find / -xdev -name 'hostile*' 2>/dev/null; find /dev/shm /dev/mqueue -mindepth 1 2>/dev/null
ls -lAn --time-style=+ /tmp /var/tmp ~ /app 2>&1
ipcs | grep -c '^0x'; df -k /dev/shm | tail -1 | awk '{print $3}'
env | sort; umask; pwd; type hostile >/dev/null 2>&1 && echo a-function; trap -p
"""


def _pool(image: str, **kw) -> SandboxPool:
    return SandboxPool(image, size=1, backend="docker", reset="verified", run_id=f"reuse-{os.getpid()}", **kw)


@pytest.mark.docker
@pytest.mark.parametrize("user", ["agent", "root"])
def test_a_hostile_episode_leaves_nothing_for_the_next_lease(terminal_image: str, user: str) -> None:
    with _pool(terminal_image, user=user) as pool:
        with pool.leased(timeout=120) as sb:
            first, fresh = sb.id, sb.run(LOOK).stdout
            played = sb.run(HOSTILE_ROOT if user == "root" else HOSTILE, timeout=60)
            assert "played" in played.stdout and "immutable" not in played.stdout
            assert "hostile" in sb.run("ps -eo args=; ls /tmp ~").stdout   # it did leave all that behind
        with pool.leased(timeout=120) as sb:
            assert sb.id == first                    # the same container, reused
            assert sb.run(LOOK).stdout == fresh      # and nothing of the episode is visible
        assert pool.stats()["reset_verified"] == 1 and pool.stats()["reset_discarded"] == 0


@pytest.mark.docker
def test_a_reset_that_cannot_be_verified_discards_the_sandbox(terminal_image: str) -> None:
    """A changed file of the image cannot be restored in place: the next lease gets a fresh sandbox."""
    with _pool(terminal_image) as pool:
        with pool.leased(timeout=120) as sb:
            first = sb.id
            sb.run("echo 'export HOSTILE_VAR=1' >> ~/.bashrc")
        with pool.leased(timeout=120) as sb:
            assert sb.id != first
            assert "HOSTILE" not in sb.read_file("/home/agent/.bashrc").decode()
        assert pool.stats()["reset_discarded"] == 1
        assert "/home/agent/.bashrc of the image was changed" in pool.discard_reasons[-1]


@pytest.mark.docker
def test_a_file_the_reset_cannot_delete_fails_the_check(terminal_image: str, docker_client) -> None:
    """An immutable file (made from the host: no sandbox has the capability) survives the wipe,
    and the check after it says so."""
    sb = DockerSandbox(SandboxSpec(image=terminal_image), docker_client,
                       containers.owner_labels(f"reuse-{os.getpid()}"), baseline=True)
    upper = Path(sb.container.attrs["GraphDriver"]["Data"]["UpperDir"])
    try:
        sb.run("echo x > /tmp/stuck")
        subprocess.run(["chattr", "+i", str(upper / "tmp/stuck")], check=True)
        result = sb.reset()
        assert not result.verified and "/tmp/stuck remains after the reset" in result.problems
    finally:
        subprocess.run(["chattr", "-i", str(upper / "tmp/stuck")], check=False)
        sb.close()


@pytest.mark.docker
def test_a_reset_says_when_the_image_changed(terminal_image: str, docker_client) -> None:
    """A tag moved to another image (a rebuilt task image) since the sandbox started: not reused."""
    base = docker_client.images.get(terminal_image)
    other = next((i for i in docker_client.images.list() if i.id != base.id), None)
    if other is None:
        pytest.skip("no second image to move the tag to")
    tag = f"nextstate-reuse-test:{os.getpid()}"
    base.tag(tag)
    sb = DockerSandbox(SandboxSpec(image=tag), docker_client, containers.owner_labels(f"reuse-{os.getpid()}"),
                       baseline=True)
    try:
        assert sb.reset().verified
        other.tag(tag)
        assert sb.reset().problems == [f"the image {tag} changed since the sandbox started"]
    finally:
        sb.close()
        docker_client.images.remove(tag)


def test_layer_changes_tells_additions_from_changes_to_the_image(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    for d in (lower / "etc", lower / "home/agent", upper / "etc", upper / "home/agent/new/deep"):
        d.mkdir(parents=True)
    (lower / "etc/passwd").write_text("root")
    (lower / "etc/keep").write_text("k")
    (upper / "etc/passwd").write_text("hacked")            # a file of the image, changed
    (upper / "home/agent/new/deep/f").write_text("x")      # a new tree: listed once
    (upper / "home/agent/notes").write_text("x")
    (upper / "etc").chmod(0o777)                            # an image directory's mode
    added, changed = layer_changes(upper, [lower])
    assert added == {"/home/agent/new", "/home/agent/notes"}
    assert changed == {"/etc: its mode or owner changed"}   # not looked into: one change is enough
    (upper / "etc").chmod((lower / "etc").stat().st_mode)
    assert layer_changes(upper, [lower])[1] == {"/etc/passwd of the image was changed"}
    if os.geteuid() == 0:   # a whiteout (a deleted file of the image) is a 0:0 device: root only
        (upper / "etc/passwd").unlink()
        os.mknod(upper / "etc/keep", 0o600 | 0o020000, os.makedev(0, 0))
        assert layer_changes(upper, [lower])[1] == {"/etc/keep of the image was deleted"}


def test_a_backend_that_cannot_verify_gets_a_fresh_sandbox() -> None:
    with SandboxPool(size=1, backend="local", reset="verified") as pool:
        with pool.leased(timeout=30) as sb:
            first, roots = sb.id, [sb.root]
            assert not sb.reset().verified
        with pool.leased(timeout=30) as sb:
            assert sb.id != first
            roots.append(sb.root)
        assert pool.stats()["reset_discarded"] == 1
        assert "cannot verify a reset" in pool.discard_reasons[-1]
    # the second one's reset may still be queued when the pool closes: it is removed all the same
    assert not [r for r in roots if r.exists()]


def test_a_family_that_needs_fresh_sandboxes_gets_them() -> None:
    assert GUIEnv.fresh_sandbox and SWEEnv.fresh_sandbox and not TerminalEnv.fresh_sandbox
    with GUIEnv.make_pool(1, backend="local", reset="verified") as gui, \
            TerminalEnv.make_pool(1, backend="local", reset="verified") as terminal:
        assert gui.reset == "replace" and terminal.reset == "verified"


def test_the_config_names_the_reset() -> None:
    assert load_config("terminal", overrides=["env.sandbox_reset=verified"]).env.sandbox_reset == "verified"
    with pytest.raises(ConfigError, match="env.sandbox_reset must be replace or verified"):
        load_config("terminal", overrides=["env.sandbox_reset=sometimes"])


@pytest.mark.docker
def test_a_graded_terminal_episode_leaves_a_reusable_sandbox(terminal_image: str) -> None:
    """Grading empties /tests and /logs/verifier rather than removing them (directories of the
    image): the next episode on the same task image gets the same container, and passes again."""
    env = TerminalEnv(reset="verified", warm=False)
    try:
        ids = []
        for _ in range(2):
            env.reset(options={"task": "word-frequency"})
            ids.append(env.sandbox.id)
            assert play(env, env.oracle_actions(env.task, "gold"))[0] == 1.0
        assert ids[0] == ids[1]
        [pool] = env._private.values()
        assert pool.stats()["reset_verified"] >= 1 and not pool.discard_reasons   # the second may be under way
    finally:
        env.close()
