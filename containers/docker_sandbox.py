"""The Docker backend: a :class:`DockerSandbox` is a container with no network (unless its spec asks:
then the bridge, with the host's CA bundle trusted, :func:`containers.build.host_ca_bundle`), a non-root
user, all capabilities dropped, ``no-new-privileges`` and pids/memory/CPU limits. Its shell is
one ``docker exec`` whose streams stay open (its socket, or FIFOs: :mod:`containers.shell_transport`);
it speaks the protocol of :mod:`containers.protocol`.

Hard limits: ``pids_limit``, ``memory``, ``cpus`` and
``disk``. Where the engine can kill by cgroup from the host (a local engine,
run as root) a timeout kills the command without starting a process inside
the container, so it holds under a fork bomb that exhausted the pid limit; a
restarted shell takes every other process in the container with it.
``disk`` is the engine's per-container storage quota where its storage driver
supports one (overlay2 on XFS with project quotas). Elsewhere (overlay2 on ext4),
on a local engine run as root, the container's writable layer goes on a
loop-mounted ext4 disk of the limit's size (:mod:`containers.disks`): past it,
every write fails with ``ENOSPC`` as on a full disk, and the result says the
limit (its bytes, or its inodes) is used up. A process the kernel kills for the
memory limit gets a line saying so, with the limit. Where neither is possible (no loop devices, not root, a
remote engine) a watchdog measures the writable layer while commands run (and
at most every ``disk_check_every`` seconds between them) and, past the limit,
kills the writers and reports ``ENOSPC`` in the result: a write can run past
the limit by what it writes in one check interval (0.2 s; into the page cache
that can be a few hundred MB).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import stat
import time
from pathlib import Path
from typing import Any, Callable

from nextstate.containers.engine import RUN_LABEL, remove_container
from nextstate.containers.fifo_shell import FifoShell, FifoUnavailable
from nextstate.containers.protocol import (_KILL_TREE, ResetResult, Sandbox, SandboxConfigError, SandboxError,
                                           SandboxSpec, _mib, parse_size)
from nextstate.containers.shell_transport import ExecStream, ShellTransport

log = logging.getLogger(__name__)

# Kills every process but init (pid 1), the container's command (its oldest child), the
# shell (pid $1, 0: none) and this script: a watchdog's or a restart's kill from inside.
_KILL_OTHERS = r"""
main=$(pgrep -o -P 1); keep=" 1 $main $1 $$ "
pids=$(for p in $(pgrep .); do case "$keep" in *" $p "*) ;; *) echo "$p";; esac; done)
[ -n "$pids" ] && kill -STOP $pids 2>/dev/null; [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
exit 0
"""

# What a sandbox looks like from inside, its writable layer apart: its tmpfs mounts' files, SysV IPC
# objects, mounts, network interfaces, cgroup limits, rlimits, user, umask and a new shell's environment.
# Run by the sandbox's shell when it starts and after every reset: the two must be the same.
_FINGERPRINT = r"""
ls -lAn --time-style=+ /dev/shm /dev/mqueue 2>&1
cat /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem 2>&1
cut -d' ' -f5,6 /proc/self/mountinfo | sort
cut -s -d: -f1 /proc/net/dev
cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max /sys/fs/cgroup/pids/pids.max \
    /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null
ulimit -a; id; umask; env | sort
"""
# The engine's settings a reset checks are unchanged: the limits, capabilities and mounts.
_LIMIT_KEYS = ("Memory", "MemorySwap", "NanoCpus", "PidsLimit", "CapAdd", "CapDrop", "SecurityOpt", "NetworkMode",
               "Privileged", "ReadonlyRootfs", "Binds", "Devices", "ShmSize", "Ulimits")


def _below(lowers: list[Path], path: str) -> os.stat_result | None:
    """The image's entry at ``path`` (its topmost layer that has one), None where it has none."""
    for layer in lowers:
        try:
            st = os.lstat(layer / path.lstrip("/"))
        except OSError:
            continue
        return None if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0 else st   # a whiteout: deleted
    return None


def _opaque(path: str) -> bool:
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        try:
            if os.getxattr(path, name) == b"y":
                return True
        except OSError:
            continue
    return False


def layer_changes(upper: Path, lowers: list[Path]) -> tuple[set[str], set[str]]:
    """What an overlay writable layer ``upper`` holds over the image's layers ``lowers`` (top first).

    Returns the paths the sandbox added (the outermost: a new directory's contents are not
    listed) and the changes to the image itself, as sentences: a file of the image changed or
    deleted, a directory replaced or its mode or owner changed. A path that is not UTF-8 counts
    as a change (no shell command can name it).
    """
    added, changed = set(), set()
    for root, dirs, files in os.walk(upper):
        rel = os.path.relpath(root, upper).removeprefix(".")
        descend = []
        for name in dirs + files:
            path, host = f"/{rel}/{name}".replace("//", "/"), os.path.join(root, name)
            st, image = os.lstat(host), _below(lowers, f"{rel}/{name}")
            try:
                path.encode()
            except UnicodeEncodeError:
                changed.add(f"{path!r} has a name that is not UTF-8")
                continue
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                changed.add(f"{path} of the image was deleted")
            elif image is None:
                added.add(path)
            elif not (stat.S_ISDIR(st.st_mode) and stat.S_ISDIR(image.st_mode)):
                changed.add(f"{path} of the image was changed")
            elif (st.st_mode, st.st_uid, st.st_gid) != (image.st_mode, image.st_uid, image.st_gid):
                changed.add(f"{path}: its mode or owner changed")
            elif _opaque(host):
                changed.add(f"{path} of the image was replaced")
            else:
                descend.append(name)
        dirs[:] = [d for d in dirs if d in descend]
    return added, changed


# Docker's default capabilities but NET_RAW: what a root user needs to act as root
# (write others' files, chown, apt-get's privilege drop); other users get none.
ROOT_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
             "NET_BIND_SERVICE", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP"]


class _HostCgroup:
    """A container's cgroup seen from the host: freeze it, list and kill its processes.

    Needs a local engine and write access to ``/sys/fs/cgroup`` (root); works with
    cgroup v1 (the freezer and pids controllers) and v2. :meth:`find` returns None
    where that is not so, and callers fall back to killing from inside.
    """

    ROOT = Path("/sys/fs/cgroup")

    def __init__(self, procs: Path, freeze: Path, frozen: Callable[[], bool], pids: Path, v2: bool,
                 oom: Path):
        self.procs, self.freeze_file, self._frozen, self.pids_dir, self.v2 = procs, freeze, frozen, pids, v2
        self.oom_file = oom   # memory.events (v2) or memory.oom_control (v1): "oom_kill N"
        self._oom_fd: int | None = None   # kept open: one pread after every command

    @classmethod
    def find(cls, init_pid: int, container_id: str) -> "_HostCgroup | None":
        try:
            lines = Path(f"/proc/{init_pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        v1: dict[str, str] = {}
        unified = None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if not controllers:
                unified = path
            for c in controllers.split(","):
                v1[c] = path
        if container_id not in v1.get("freezer", unified or ""):  # another host's pid, or no match
            return None
        if "freezer" in v1:
            d = cls.ROOT / "freezer" / v1["freezer"].lstrip("/")
            state = d / "freezer.state"
            found = cls(d / "cgroup.procs", state, lambda: state.read_text().strip() == "FROZEN",
                        cls.ROOT / "pids" / v1.get("pids", "/").lstrip("/"), False,
                        cls.ROOT / "memory" / v1.get("memory", "/").lstrip("/") / "memory.oom_control")
        else:
            d = cls.ROOT / (unified or "/").lstrip("/")
            events = d / "cgroup.events"
            found = cls(d / "cgroup.procs", d / "cgroup.freeze",
                        lambda: "frozen 1" in events.read_text(), d, True, d / "memory.events")
        return found if os.access(found.freeze_file, os.W_OK) else None

    def oom_kills(self) -> int | None:
        """Processes the OOM killer killed in this cgroup so far (None: the kernel does not say).

        Read after every command, so through a descriptor kept open: one ``pread`` (an open,
        reads and a close each time cost a saturated pool's client more than the rest of a step)."""
        try:
            if self._oom_fd is None:
                self._oom_fd = os.open(self.oom_file, os.O_RDONLY | os.O_CLOEXEC)
            return _oom_count(os.pread(self._oom_fd, 4096, 0).decode(errors="replace"))
        except OSError:
            return None

    def close(self) -> None:
        """Close what is kept open. Safe to call twice."""
        fd, self._oom_fd = self._oom_fd, None
        if fd is not None:
            os.close(fd)

    def pids(self) -> list[int]:
        return [int(p) for p in self.procs.read_text().split()]

    def near_pid_limit(self) -> bool:
        """Whether the pid limit is (nearly) exhausted: a fork bomb, as far as anyone can tell."""
        try:
            limit = (self.pids_dir / "pids.max").read_text().strip()
            current = int((self.pids_dir / "pids.current").read_text())
        except (OSError, ValueError):
            return False
        return limit != "max" and current >= 0.9 * int(limit)

    def kill(self, choose: Callable[[dict[int, int]], set[int]]) -> None:
        """Freeze, SIGKILL ``choose({pid: parent pid})``, thaw: nothing forks while we look."""
        self.freeze_file.write_text("FROZEN" if not self.v2 else "1")
        try:
            deadline = time.monotonic() + 1.0
            while not self._frozen() and time.monotonic() < deadline:
                time.sleep(0.005)
            parents = {}
            for pid in self.pids():
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    parents[pid] = int(stat[stat.rindex(")") + 2:].split()[1])
                except (OSError, ValueError, IndexError):
                    continue  # gone meanwhile
            for pid in choose(parents):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        finally:
            self.freeze_file.write_text("THAWED" if not self.v2 else "0")


def _engine_cpus(client: Any) -> int:
    """The CPU count of a remote engine's host (this host's where the engine does not say)."""
    try:
        return int(client.info()["NCPU"])
    except Exception:   # an engine too old or too odd to say: this host's count is the best guess
        return os.cpu_count() or 1


def _oom_count(text: str) -> int | None:
    """N of the ``oom_kill N`` line of a cgroup's memory.events / memory.oom_control."""
    m = re.search(r"^oom_kill (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


def _descendants(parents: dict[int, int], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


class DockerSandbox(Sandbox):
    """A container on a Docker engine, with its shell's streams on a :class:`ShellTransport`."""

    backend = "docker"
    _quota_support: "dict[str, bool]" = {}   # engine URL -> whether it takes a storage quota
    _loop_support: "dict[str, bool]" = {}    # engine URL -> whether its containers get loop disks
    _fifo_support: "dict[str, bool]" = {}    # engine URL -> whether its containers see FIFOs of this host

    def __init__(self, spec: SandboxSpec, client: Any, labels: dict[str, str], baseline: bool = False):
        """``baseline``: record the fresh state, so that :meth:`reset` can restore and check it."""
        import docker

        super().__init__(spec)
        self.client = client
        self._disk: Any = None   # a containers.disks.LoopDisk
        self._cgroup: _HostCgroup | None = None   # found once the container runs (a local engine)
        self._ooms = 0           # OOM kills in the container's cgroup seen so far
        engine = str(client.api.base_url)
        local = engine.startswith(("http+docker://localhost", "http+unix://"))
        self._use_gate(engine, (os.cpu_count() or 1) if local else lambda: _engine_cpus(client))
        self._shell = self._transport(spec.transport, local and self._fifo_support.get(engine, True), labels)
        try:
            self._create_and_start(spec, client, labels)
        except docker.errors.APIError as e:
            if not (isinstance(self._shell, FifoShell) and "mount" in str(e).lower()):
                raise
            self._no_fifos(engine, f"the engine cannot mount {self._shell.dir}: {str(e)[:300]}")
            self._disk_limit, self._disk = parse_size(spec.disk), None
            self._create_and_start(spec, client, labels)
        self.id = self.container.id[:12]
        self._shell_host_pid: int | None = None
        try:
            self.container.reload()
            self._init_pid = int(self.container.attrs["State"]["Pid"])
            self._cgroup = _HostCgroup.find(self._init_pid, self.container.id) if local else None
            if isinstance(self._shell, FifoShell):
                if not (why := self._shell.unseen_by(self._init_pid)):
                    self._fifo_support[engine] = True
                elif self._still_running():   # else its command exited: the shell's start says so
                    self._no_fifos(engine, why)
            self._start_shell()
            self._fresh: dict[str, Any] | None = self._state() if baseline else None
        except BaseException:
            self.close()
            raise

    def _create_and_start(self, spec: SandboxSpec, client: Any, labels: dict[str, str]) -> None:
        """Create the container, give it its disk and start it; on failure nothing of it is left."""
        try:
            self.container = self._create(spec, client, labels)
        except BaseException:
            self._shell.remove()
            raise
        try:
            self._attach_disk(labels)
            self.container.start()
        except BaseException as e:
            self._dispose()
            if not isinstance(e, Exception):
                raise
            if "unable to find user" in str(e) or "no matching entries in passwd" in str(e):
                raise SandboxConfigError(
                    f"image {spec.image} has no user {spec.user!r}: set `user` in the task file or "
                    "the config (e.g. root), or add the user to the image") from None
            raise

    _fifo_said = False

    @classmethod
    def _transport(cls, transport: str, local: bool, labels: dict[str, str]) -> ShellTransport:
        """The shell's transport: the exec stream for ``"exec"``; FIFOs for ``"fifo"`` and
        ``"auto"`` on a local engine, else (said once, where this host cannot make them) the exec
        stream. ``local``: the engine is on a unix socket and has not been seen to fail FIFOs."""
        if transport not in ("auto", "exec", "fifo"):
            raise SandboxConfigError(f"transport must be auto, exec or fifo, got {transport!r}")
        if transport == "exec":
            return ExecStream()
        why = "the engine is not local"
        if local:
            try:
                return FifoShell(labels.get(RUN_LABEL, "-"))
            except FifoUnavailable as e:
                why = str(e)
        cls._say_no_fifos(transport, why)
        return ExecStream()

    @classmethod
    def _say_no_fifos(cls, transport: str, why: str) -> None:
        """Once a process: shells use the exec stream (a warning where FIFOs were asked for)."""
        if not cls._fifo_said:
            cls._fifo_said = True
            (log.warning if transport == "fifo" else log.info)(
                "sandbox shells use the docker exec stream, not FIFOs: %s", why)

    def _no_fifos(self, engine: str, why: str) -> None:
        """FIFOs do not reach this sandbox's container: its shell, and the engine's from now on,
        use the exec stream."""
        self._shell.remove()
        self._shell = ExecStream()
        self._fifo_support[engine] = False
        self._say_no_fifos(self.spec.transport, why)

    def _create(self, spec: SandboxSpec, client: Any, labels: dict[str, str]) -> Any:
        """Create the container, with the engine's storage quota when its driver has one."""
        import docker

        volumes, env = self._shell.bind(), spec.env
        if spec.network:   # pip, curl, git, uv and node in it trust what the host trusts (a TLS-inspecting proxy)
            from nextstate.containers.build import BUILD_CA, CA_VARIABLES, host_ca_bundle
            bundle = host_ca_bundle()
            if bundle is not None:
                volumes = {**(volumes or {}), str(bundle.resolve()): {"bind": BUILD_CA, "mode": "ro"}}
                env = {**{var: BUILD_CA for var in CA_VARIABLES}, **env}
        kw = dict(init=True, labels=labels, user=spec.user, working_dir=spec.workdir,
                  environment=env, network_mode="bridge" if spec.network else "none",
                  cap_drop=["ALL"], cap_add=ROOT_CAPS if spec.user in ("root", "0") else None,
                  security_opt=["no-new-privileges"],
                  pids_limit=spec.pids_limit, mem_limit=spec.memory, memswap_limit=spec.memory,
                  nano_cpus=int(spec.cpus * 1e9), auto_remove=False,
                  volumes=volumes)
        engine = str(client.api.base_url)
        if self._disk_limit is not None and self._quota_support.get(engine, True):
            try:
                container = client.containers.create(spec.image, spec.command,
                                                     storage_opt={"size": str(self._disk_limit)}, **kw)
            except docker.errors.APIError as e:
                if "storage" not in str(e).lower() and "quota" not in str(e).lower():
                    raise
                log.info("engine %s has no storage quota (%s): a watchdog enforces disk limits",
                         engine, str(e).splitlines()[0][:200])
                self._quota_support[engine] = False
            else:
                self._quota_support[engine] = True
                self._disk_limit = None   # the engine enforces it: real ENOSPC, nothing to watch
                return container
        return client.containers.create(spec.image, spec.command, **kw)

    def _attach_disk(self, labels: dict[str, str]) -> None:
        """Without an engine quota, put the writable layer on a loop-mounted disk of the limit's
        size (:mod:`containers.disks`); where this host can't, warn once and keep the watchdog."""
        from nextstate.containers.disks import DiskUnavailable, attach

        engine = str(self.client.api.base_url)
        if self._disk_limit is None or not self._loop_support.get(engine, True):
            return
        try:
            self._disk = attach(self.container.id, self.container.attrs.get("GraphDriver") or {},
                                self._disk_limit, labels)
        except DiskUnavailable as e:
            if self._loop_support.get(engine):   # worked before: this one failed (out of loop devices?)
                log.warning("sandbox %s: no disk of its own (%s); a watchdog keeps its disk limit", self.id, e)
            else:   # this host can't: say so once
                log.warning("sandbox disk limits on %s are kept by a watchdog, which a fast write can "
                            "overshoot: %s", engine, e)
                self._loop_support[engine] = False
            return
        self._loop_support[engine] = True
        self._disk_limit = None   # the kernel enforces it: real ENOSPC, nothing to watch

    @property
    def address(self) -> str | None:
        """The container's IP on the bridge network (None without network)."""
        self.container.reload()
        nets = self.container.attrs.get("NetworkSettings", {}).get("Networks", {})
        return next((n["IPAddress"] for n in nets.values() if n.get("IPAddress")), None)

    def _open_shell(self) -> None:
        try:
            self._exec_id = self._shell.open(self.client.api, self.container.id, self.spec)
        except Exception as e:  # docker.errors.APIError, connection errors, OSError (the FIFOs)
            raise SandboxError(f"cannot start a shell in container {self.id}: {e}") from e
        self._shell_host_pid = None   # looked up when first needed

    def _send(self, data: bytes) -> None:
        self._shell.send(data)

    def _recv(self, timeout: float) -> list[tuple[int, bytes]] | None:
        return self._shell.recv(timeout)

    def _close_shell(self) -> None:
        self._shell.close()

    def _host_shell_pid(self) -> int | None:
        if self._shell_host_pid is None:
            try:
                self._shell_host_pid = int(self.client.api.exec_inspect(self._exec_id)["Pid"]) or None
            except Exception:
                return None
        return self._shell_host_pid

    def _main_pid(self, parents: dict[int, int]) -> set[int]:
        """The container's init and its oldest child (the container's command): never killed."""
        kids = [p for p, pp in parents.items() if pp == self._init_pid]
        if not kids:
            return {self._init_pid}

        def started(pid: int) -> int:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                return int(stat[stat.rindex(")") + 2:].split()[19])
            except (OSError, ValueError, IndexError):
                return 1 << 62
        return {self._init_pid, min(kids, key=started)}

    def _kill_tree(self, pid: int) -> bool | None:
        shell = self._host_shell_pid() if self._cgroup else None
        if self._cgroup is not None and shell is not None:
            bomb = self._cgroup.near_pid_limit()
            try:  # the command's tree; under a fork bomb, everything but the shell
                self._cgroup.kill(lambda parents: set(parents) - self._main_pid(parents) - {shell}
                                  if bomb else _descendants(parents, shell))
                return bomb
            except OSError as e:
                log.warning("cgroup kill in %s failed (%s); killing from inside", self.id, e)
        try:
            self.container.exec_run(["bash", "-c", _KILL_TREE, "kill", str(pid)], user=self.spec.user)
        except Exception as e:
            log.warning("could not kill processes in %s: %s", self.id, e)

    def _kill_others(self, keep_shell: bool = True) -> None:
        shell = self._host_shell_pid() if self._cgroup else None
        if self._cgroup is not None and (shell is not None or not keep_shell):
            keep = {shell} if keep_shell else set()
            try:
                self._cgroup.kill(lambda parents: set(parents) - self._main_pid(parents) - keep)
                return
            except OSError as e:
                log.warning("cgroup kill in %s failed (%s); killing from inside", self.id, e)
        try:  # from inside: everything but init, the container's command and the shell
            self.container.exec_run(["bash", "-c", _KILL_OTHERS, "kill",
                                     str(self._shell_pid if keep_shell and self._shell_pid else 0)],
                                    user=self.spec.user)
        except Exception as e:
            log.warning("could not kill processes in %s: %s", self.id, e)

    # -- reset -----------------------------------------------------------------------------
    def _layers(self) -> tuple[Path, list[Path]] | None:
        """The writable layer's directory on this host and the image's layers (overlay2 only)."""
        graph = self.container.attrs.get("GraphDriver") or {}
        data = graph.get("Data") or {}
        upper = Path(data.get("UpperDir") or "-")
        if graph.get("Name") != "overlay2" or not upper.is_dir():
            return None
        return upper, [Path(p) for p in (data.get("LowerDir") or "").split(":") if p]

    def _state(self) -> dict[str, Any] | None:
        """What :meth:`reset` compares: the writable layer, the view from inside, the engine's
        settings, the files the engine mounts in, the processes. None where this host cannot
        see them (a remote engine, not root, not overlay2)."""
        layers = self._layers()
        if self._cgroup is None or layers is None:
            return None
        attrs = self.container.attrs
        mounted = {}
        for key in ("HostsPath", "HostnamePath", "ResolvConfPath"):
            try:
                mounted[key] = Path(attrs[key]).read_bytes()
            except (KeyError, OSError, TypeError):
                mounted[key] = None
        return {"layer": layer_changes(*layers), "inside": self._internal(_FINGERPRINT, timeout=30).stdout,
                "engine": {k: attrs["HostConfig"].get(k) for k in _LIMIT_KEYS}, "mounted": mounted,
                "mounts": attrs.get("Mounts"), "image": attrs.get("Image"), "processes": len(self._cgroup.pids())}

    def reset(self) -> ResetResult:
        """Kill every process of the episode (the container's cgroup, frozen), delete what it added
        to the writable layer, ``/dev/shm``, ``/dev/mqueue`` and SysV IPC, start a new shell, and
        check against the state recorded at start (``baseline=True``): the layer holds nothing
        new, the view from inside, the limits, the mounted files and the image are the same, and
        no process but the container's own and the new shell is left. A change to the image's own
        files (one changed, deleted, or a directory's mode) cannot be undone in place: unverified."""
        start = time.monotonic()

        def result(*problems: str) -> ResetResult:
            return ResetResult(not problems, list(problems), round(time.monotonic() - start, 3))

        fresh = self._fresh
        if fresh is None or self.closed:
            return result("no fresh state was recorded (a remote engine, not root, not overlay2, "
                          "or the sandbox was made without baseline=True)")
        try:
            self._close_shell()
            self._kill_others(keep_shell=False)
            cgroup, deadline = self._cgroup, time.monotonic() + 2.0   # not None: a fresh state was recorded
            while cgroup is not None and len(cgroup.pids()) >= fresh["processes"] and time.monotonic() < deadline:
                time.sleep(0.01)   # the killed are being reaped: init and its command stay
            layers = self._layers()
            if layers is None:
                return result("the writable layer is gone")
            added, changed = layer_changes(*layers)
            changed -= fresh["layer"][1]
            if changed:
                return result(*sorted(changed)[:5])
            new = sorted(added - fresh["layer"][0])
            self._start_shell()
            if self.client.images.get(self.spec.image).id != fresh["image"]:
                return result(f"the image {self.spec.image} changed since the sandbox started")
            wipe = " ".join(shlex.quote(p) for p in new)
            # Directories the episode locked itself out of are opened first (never through a symlink).
            self._internal((f"find -P {wipe} -type d ! -perm -u+rwx -exec chmod u+rwx {{}} \\; 2>/dev/null; "
                            f"rm -rf -- {wipe} 2>/dev/null; " if new else "")
                           + "find /dev/shm /dev/mqueue -mindepth 1 -delete 2>/dev/null; ipcrm -a 2>/dev/null; true",
                           timeout=60)
            self.container.reload()
            now = self._state()
        except (SandboxError, OSError) as e:
            return result(f"the reset failed: {e}")
        except Exception as e:  # the engine: docker.errors.APIError, connection errors
            return result(f"the engine failed during the reset: {e}")
        if now is None:
            return result("the sandbox's state can no longer be seen")
        problems = [f"{p} remains after the reset" for p in sorted(now["layer"][0] - fresh["layer"][0])[:5]]
        problems += sorted(now["layer"][1] - fresh["layer"][1])[:5]
        if now["inside"] != fresh["inside"]:
            seen = set(fresh["inside"].splitlines())
            odd = next((line for line in now["inside"].splitlines() if line not in seen), "a line is missing")
            problems.append(f"the view from inside differs from a fresh sandbox's: {odd.strip()[:200]!r}")
        problems += [f"the {what} differ from a fresh sandbox's" for what, key in
                     (("engine's settings", "engine"), ("files the engine mounts in", "mounted"), ("mounts", "mounts"))
                     if now[key] != fresh[key]]
        if now["processes"] != fresh["processes"]:
            problems.append(f"{now['processes']} processes, a fresh sandbox has {fresh['processes']}")
        return result(*problems)

    def _disk_full(self) -> str | None:
        if self._disk is None:
            return None
        try:
            free, inodes, files = self._disk.room()
        except OSError:   # unmounted by someone else: the next command will say so
            return None
        if free < 2 ** 20:
            return (f"the sandbox's disk limit of {_mib(self._disk.size)} is used up: writes fail "
                    "with 'No space left on device'")
        if inodes < 16:
            return (f"the sandbox's disk limit of {files} files (inodes) is used up: creating a file "
                    "fails with 'No space left on device'")
        return None

    def _oom_killed(self, exit_code: int | None) -> bool:
        if self._cgroup is not None:   # one file read: looked at after every command
            count = self._cgroup.oom_kills()
        elif exit_code == 137:   # killed: ask the container's own cgroup
            try:
                res = self.container.exec_run(["cat", "/sys/fs/cgroup/memory.events",
                                               "/sys/fs/cgroup/memory/memory.oom_control"])
                count = _oom_count(res.output.decode(errors="replace"))
            except Exception as e:
                log.debug("reading the OOM count of %s: %s", self.id, e)
                count = None
        else:
            return False
        if count is None or count <= self._ooms:
            return False
        self._ooms = count
        return True

    def _disk_used(self) -> int | None:
        try:
            listed = self.client.api.containers(all=True, size=True, filters={"id": self.container.id})
        except Exception as e:
            log.debug("measuring the disk of %s: %s", self.id, e)
            return None
        return int(listed[0].get("SizeRw") or 0) if listed else None

    def _shell_exit_code(self) -> int | None:
        try:
            for _ in range(20):  # the engine notes the exit a moment after the socket closes
                info = self.client.api.exec_inspect(self._exec_id)
                if not info.get("Running"):
                    break
                time.sleep(0.05)
            self.container.reload()
        except Exception:
            return None
        if self.container.status != "running" or info.get("Running"):
            return None
        return info.get("ExitCode")

    def _still_running(self) -> bool:
        """Whether the engine says the container runs."""
        try:
            self.container.reload()
        except Exception:   # the engine: docker.errors.APIError, connection errors
            return False
        return self.container.status == "running"

    def is_alive(self) -> bool:
        return not self.closed and self._shell.is_open and self._still_running()

    def _dispose(self) -> None:
        try:
            remove_container(self.client, self.container.id)
        except Exception as e:  # already gone, or the engine went away (said once by remove_container)
            log.debug("removing %s: %s", self.id, e)
        self._shell.remove()
        if self._cgroup is not None:
            self._cgroup.close()
        if self._disk is not None and not self._disk.release():
            log.warning("the disk of sandbox %s is still in use; `python -m containers reap` "
                        "removes it once its container is gone", self.id)

