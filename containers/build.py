"""Image builds: `docker build` online, or on a Debian rootfs (mmdebstrap or debootstrap) offline.

An image directory holds a ``Dockerfile`` that starts with ``ARG BASE=...`` /
``FROM ${BASE}`` and may hold ``packages.txt``, the Debian packages it adds, and
``wheels.txt``, pinned pure-Python wheels from the package registry that the host
downloads into its build context (``wheels/``; :func:`with_wheels`).
When BASE defaults to ``nextstate/<name>:...`` of another image directory,
that image is its parent.  Online, each Dockerfile installs its own
``packages.txt`` with apt-get.  Offline, the packages of the whole parent chain
go into one rootfs (mmdebstrap, else debootstrap), imported as ``nextstate/rootfs-<name>:<hash>``,
and the chain's Dockerfiles run on it with ``OFFLINE=1`` (apt-get skipped).
Images are labelled with a hash of their inputs and not rebuilt while it
matches.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import functools
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import docker
import yaml
from tqdm.auto import tqdm

from nextstate.containers.engine import connect
from nextstate.containers.uv_installer import CONTEXT_NAME as UV_CONTEXT
from nextstate.containers.uv_installer import astral_answers, offline_uv, uv_wheel_binaries

ROOT = Path(__file__).resolve().parent
REPO = "nextstate"
SUITE = "bookworm"
#: Public bases that are Ubuntu: ubuntu:*, terminal-bench's ubuntu-* and buildpack-deps on Ubuntu's codenames.
_UBUNTU = r"ubuntu:|.*/t-bench/ubuntu-|buildpack-deps:(bionic|focal|jammy|noble|oracular|plucky)\b"
PYTHON_OF_SUITE = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}   # each Debian release's own python3
DEFAULT_MIRROR = "http://deb.debian.org/debian"
HASH_LABEL = "io.nextstate.image-hash"
PROBE_IMAGE = ("debian", "bookworm-slim")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What a build's ``apt-get`` and ``pip`` reach: when one answers, builds get the network.
PACKAGE_REGISTRIES = (f"{DEFAULT_MIRROR}/dists/{SUITE}/Release", "https://pypi.org/simple/pip/")
CA_DEFAULTS = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
DEBIAN_CA = "/etc/ssl/certs/ca-certificates.crt"
BUILD_CA = "/usr/local/share/nextstate/host-ca.crt"
# The variables through which a build's pip, requests, curl, git, uv and node trust the host's CA bundle:
# build ARGs, so they reach every RUN and stay out of the image's environment.
CA_VARIABLES = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
                "NODE_EXTRA_CA_CERTS")
#: A host a command's output says it could not reach (curl, apt, git, pip's and requests' urllib3, Java's
#: resolver: Gradle's wrapper, Maven); the host is the first group that matched.
UNREACHABLE_HOST = (r"Could not resolve host: ([\w.-]+)|Temporary failure resolving '([^']+)'|unable to access "
                    r"'https?://([^/':]+)|host='([^']+)'|Failed to connect to ([\w.-]+) port|Could not resolve '([^']+)'"
                    r"|java\.net\.UnknownHostException: ([\w.-]+)")
# Why a build failed, read from its output: (pattern, reason; {0} is the pattern's first group); the first
# that matches wins, so a package "not found" for want of a network reads as no network.
BUILD_FAILURES = (
    (r"(?:CERTIFICATE_VERIFY_FAILED|certificate verify failed|SSL certificate problem)",
     "a TLS certificate was not trusted (a TLS-inspecting proxy? its CA must be in the host's bundle)"),
    (UNREACHABLE_HOST, "the build could not reach {0}"),
    (r"(?:Temporary failure (?:resolving|in name resolution)|Could not resolve host|Network is unreachable|"
     r"Failed to establish a new connection|Name or service not known|Could not connect to)",
     "the build had no network"),
    (r"Unable to locate package (\S+)|Package '?([^' ]+)'? has no installation candidate",
     "apt-get found no package {0}"),
    (r"COPY failed: file not found in build context.*?: stat ([^:]+): file does not exist",
     "the Dockerfile copies {0}, which its build context does not hold"),
    (r"No matching distribution found for (\S+)", "pip found no package {0}"),
    (r"No space left on device", "the disk is full"),
    (r"externally-managed-environment", "pip refused the system Python (PEP 668: externally managed)"),
)
SKIP = {"__pycache__", ".git"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # the colour codes docker wraps a step's stderr in


@dataclass(frozen=True)
class Built:
    """Outcome of a build: the tag, its image id, and whether the cache answered."""

    tag: str
    image_id: str
    cached: bool


class Progress:
    """A build's progress on stderr, and the tail of its output for errors.

    One line per image, redrawn in place (a tqdm line: the Dockerfile step the build is at and
    the time so far), so that a task image built by a first ``reset()`` does not fill a
    training run's progress display; with ``Progress.log_lines`` (``python -m containers``
    sets it) a log line per stage instead, for build logs. Use it as a context manager, or
    end it with :meth:`close`.
    """

    log_lines = False

    def __init__(self, what: str) -> None:
        self.what, self.start, self.last = what, time.monotonic(), 0.0
        self.tail: deque[str] = deque(maxlen=40)
        self.stages: set[str] = set()
        self.bar = None if self.log_lines else tqdm(desc=f"building {what}", bar_format="{desc} [{elapsed}]",
                                                    file=sys.stderr, leave=True, mininterval=0.5)

    def say(self, msg: str) -> None:
        """Shows where the build is: the image's line now says ``msg`` (or a log line does)."""
        if self.bar is not None:
            self.bar.set_description_str(f"building {self.what}: {msg[:100]}")
        else:  # to stderr: library callers may own stdout
            print(f"[containers {self.what} +{time.monotonic() - self.start:5.1f}s] {msg}", file=sys.stderr, flush=True)
        self.last = time.monotonic()

    def feed(self, line: str) -> None:
        """Takes a line of tool output: shown for a Dockerfile step, otherwise at most every
        10 s (and, in log lines, for a first-seen stage: its first two words)."""
        line = line.rstrip()
        if not line:
            return
        self.tail.append(line)
        stage = " ".join(line.split()[:2])
        first = self.bar is None and stage not in self.stages
        if line.startswith("Step ") or first or time.monotonic() - self.last > 10:
            self.stages.add(stage)
            self.say(line[:160])

    def close(self, msg: str | None = None) -> None:
        """Ends the image's line, with ``msg`` when given (safe to call twice)."""
        if self.bar is None:
            if msg:
                self.say(msg)
        elif not self.bar.disable:
            if msg:
                self.bar.set_description_str(msg, refresh=False)
            self.bar.close()

    def fail(self, msg: str) -> RuntimeError:
        """An error carrying the last lines of output."""
        self.close(f"failed building {self.what}: {msg}")
        return RuntimeError(f"{self.what}: {msg}\n--- last output ---\n" + "\n".join(self.tail))

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(None if kind is None else f"failed building {self.what}")


# ---- image directories --------------------------------------------------------------


def known_images() -> list[str]:
    """Names of the image directories (every containers/<name>/Dockerfile), parents first."""
    names = sorted(p.parent.name for p in ROOT.glob("*/Dockerfile"))
    return sorted(names, key=lambda name: len(chain(ROOT / name)))


def image_dir(name: str) -> Path:
    """The directory of a known image, or a clear error."""
    path = ROOT / name
    if not (path / "Dockerfile").is_file():
        raise ValueError(f"unknown image {name!r}; known: {', '.join(known_images())}")
    return path


def tag_of(name: str) -> str:
    """The tag of a known image."""
    return f"{REPO}/{name}:latest"


def read_packages(directory: Path) -> list[str]:
    """The Debian packages a directory's packages.txt lists (comments allowed)."""
    return listed(directory / "packages.txt")


def read_wheels(directory: Path) -> list[str]:
    """The pinned pure-Python packages a directory's wheels.txt lists (``name==version``, comments allowed)."""
    return listed(directory / "wheels.txt")


def listed(path: Path) -> list[str]:
    """The words of a list file (``packages.txt``, ``suite``), '#' comments dropped; [] when absent."""
    return re.sub(r"#.*", "", path.read_text()).split() if path.is_file() else []


BASE_TABLE = ROOT / "base-images.yaml"
BASE_BUILDERS = "nextstate.base_builders"   # the entry-point group of base builders (:func:`built_bases`)
PUBLIC_TABLE = ROOT / "public-bases.yaml"
_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE)


def base_images() -> list[tuple[str, str]]:
    """The base image table: (reference pattern, local image), the user's files
    (``NEXTSTATE_BASE_IMAGES``) first, then containers/base-images.yaml."""
    files = [Path(f) for f in os.environ.get("NEXTSTATE_BASE_IMAGES", "").split(os.pathsep) if f]
    return [entry for path in [*files, BASE_TABLE] for entry in _read_table(path)]


def _read_table(path: Path) -> list[tuple[str, str]]:
    """One base image table file: its (pattern, local image) entries in order."""
    try:
        entries = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"base image table {path}: {exc}") from None
    if not isinstance(entries, dict):
        raise ValueError(f"base image table {path}: expected a mapping of pattern: image")
    return [(str(k), str(v)) for k, v in entries.items()]


def local_base(ref: str, extra: Iterable[tuple[str, str]] = ()) -> str | None:
    """The local image the table (then ``extra``'s entries) maps the reference `ref` to, or None."""
    return next((local for pattern, local in [*base_images(), *extra] if fnmatch.fnmatchcase(ref, pattern)), None)


def public_stand_ins(client: docker.DockerClient, text: str) -> list[tuple[str, str]]:
    """The entries of containers/public-bases.yaml for the ``FROM`` references of a Dockerfile's
    `text` that no base image table maps, that are not here and that cannot be pulled (offline):
    a public base (``python:3.12-slim``, ``ubuntu:24.04``) gets its stand-in only where the
    original cannot be had."""
    refs = [ref for ref in from_refs(text) if local_base(ref) is None and image_info(client, ref) is None]
    if not refs or not is_offline(client):
        return []
    table = _read_table(PUBLIC_TABLE)
    first = [next((entry for entry in table if fnmatch.fnmatchcase(ref, entry[0])), None) for ref in refs]
    return list(dict.fromkeys(entry for entry in first if entry))   # the first match per reference


def built_bases(client: docker.DockerClient, text: str, directory: Path) -> list[tuple[str, str]]:
    """Entries for the ``FROM`` references of a Dockerfile's `text` (in the build context `directory`)
    that no base image table maps and that are not here while no image registry answers, each built
    here by a base builder: a function ``(reference, directory, client) -> local image`` (``None``: not
    its reference) in the ``nextstate.base_builders`` entry-point group, so that packages above the
    runtime can make a base from what a task ships (the SWE family: :func:`envs.swe.images.swebench_base`)."""
    refs = [ref for ref in from_refs(text) if local_base(ref) is None and image_info(client, ref) is None]
    if not refs or not is_offline(client):
        return []
    builders = [entry.load() for entry in entry_points(group=BASE_BUILDERS)]
    found = []
    for ref in refs:
        local = next((local for builder in builders if (local := builder(ref, directory, client))), None)
        if local:
            found.append((glob.escape(ref), local))
    return found


def from_refs(text: str) -> list[str]:
    """The image references a Dockerfile's ``FROM`` lines name (not build args, stages or scratch)."""
    refs, stages = [], {"scratch"}
    for m in _FROM.finditer(text):
        ref, rest = m.group(3), m.group(4).split()
        if "$" not in ref and ref.lower() not in stages:
            refs.append(ref)
        if len(rest) == 2 and rest[0].lower() == "as":
            stages.add(rest[1].lower())
    return refs


def resolve_from(text: str, extra: Iterable[tuple[str, str]] = ()) -> tuple[str, dict[str, str]]:
    """A Dockerfile's text with every mapped ``FROM`` reference (the tables', then `extra`'s)
    replaced by its local image (known images by their tag), and {original: local} of what was
    replaced. ``--platform`` flags go with a replaced reference: the local image is this host's."""
    mapped: dict[str, str] = {}
    extra = list(extra)

    def swap(m: re.Match[str]) -> str:
        local = local_base(m.group(3), extra)
        if local is None:
            return m.group(0)
        mapped[m.group(3)] = tag_of(known_name(local)) if known_name(local) else local
        flags = " ".join(f for f in m.group(2).split() if not f.startswith("--platform"))
        return f"{m.group(1)}{flags + ' ' if flags else ''}{mapped[m.group(3)]}{m.group(4)}"

    return _FROM.sub(swap, text), mapped


def known_name(ref: str) -> str | None:
    """The known image a name or a `nextstate/<name>[:latest]` reference stands for."""
    found = re.fullmatch(rf"(?:{REPO}/)?([\w.-]+)(?::latest)?", ref.strip("\"'"))
    if found and (ROOT / found.group(1) / "Dockerfile").is_file():
        return found.group(1)
    return None


def parent_of(directory: Path) -> str | None:
    """The known image a Dockerfile builds on through its `ARG BASE=nextstate/...` default."""
    match = re.search(r"^\s*ARG\s+BASE=(\S+)", (directory / "Dockerfile").read_text(), re.MULTILINE)
    if match and match.group(1).strip("\"'").startswith(f"{REPO}/"):
        return known_name(match.group(1))
    return None


def suite_of(dirs: list[Path]) -> str:
    """The Debian suite a chain is built on: the word in the nearest ``suite`` file from the
    end of the chain (an image that wants another release than its parents), else bookworm."""
    for directory in reversed(dirs):
        if words := listed(directory / "suite"):
            return words[0]
    return SUITE


def stand_in_note(ref: str, local: str) -> str | None:
    """What a task sees at once of a public base's stand-in that the original differs in, in one
    line: another python3 than a ``python:3.X`` tag's, or Debian in place of Ubuntu; else None."""
    name = known_name(local)
    if name is None:
        return None
    suite = suite_of(chain(image_dir(name)))
    ref = ref.removeprefix("docker.io/library/")
    python = re.match(r"python:(\d+\.\d+)", ref)
    if python and PYTHON_OF_SUITE.get(suite) not in (None, python.group(1)):
        return (f"{ref} stands in as {local}: Debian {suite}, whose python3 is {PYTHON_OF_SUITE[suite]}, "
                f"not {python.group(1)}")
    if re.match(_UBUNTU, ref):
        return f"{ref} stands in as {local}: Debian {suite}, not Ubuntu (apt-get takes the common Ubuntu names)"
    return None


def chain(directory: Path) -> list[Path]:
    """The directory and its ancestors, root first."""
    dirs, seen = [directory], {directory.resolve()}
    while (parent := parent_of(dirs[0])) is not None:
        pdir = image_dir(parent)
        if pdir.resolve() in seen:
            raise ValueError(f"image parents form a cycle at {pdir}")
        seen.add(pdir.resolve())
        dirs.insert(0, pdir)
    return dirs


def dir_hash(directory: Path) -> str:
    """A hash of every file's relative path, mode and bytes under a directory."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not SKIP & set(path.relative_to(directory).parts):
            digest.update(f"{path.relative_to(directory)}\0{path.stat().st_mode & 0o111}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def chain_hash(dirs: Iterable[Path], base: str = SUITE) -> str:
    """The content hash of building `dirs` in order on `base`."""
    digest = hashlib.sha256(base.encode())
    for directory in dirs:
        digest.update(dir_hash(directory).encode())
    return digest.hexdigest()[:32]


# ---- engine helpers -----------------------------------------------------------------


def image_info(client: docker.DockerClient, ref: str) -> dict | None:
    """The engine's inspect of an image, or None when it is absent."""
    try:
        return client.api.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return None


def image_label(info: dict | None, key: str) -> str | None:
    """One label of an inspected image."""
    return ((info or {}).get("Config") or {}).get("Labels", {}).get(key) if info else None


def is_offline(client: docker.DockerClient) -> bool:
    """NEXTSTATE_OFFLINE=1/0 if set, else whether pulling a Debian image fails (20 s)."""
    forced = os.environ.get("NEXTSTATE_OFFLINE", "").strip().lower()
    if forced in {"1", "true", "yes"}:
        return True
    if forced in {"0", "false", "no"}:
        return False
    result: list[bool] = []

    def probe() -> None:
        try:
            client.api.pull(PROBE_IMAGE[0], tag=PROBE_IMAGE[1])
            result.append(True)
        except docker.errors.DockerException:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(20)
    return not (result and result[0])


def registries_answer() -> bool:
    """Whether a package registry (:data:`PACKAGE_REGISTRIES`) answers from here (asked once per process;
    ``NEXTSTATE_OFFLINE=1``: no)."""
    if os.environ.get("NEXTSTATE_OFFLINE", "").strip().lower() in {"1", "true", "yes"}:
        return False
    return _registries_answer()


@functools.cache
def _registries_answer() -> bool:
    for url in PACKAGE_REGISTRIES:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10):
                return True
        except (OSError, ValueError):
            continue
    return False


def build_network(allowed: bool = True) -> str | None:
    """The network of a task's build: the default bridge while a package registry answers (so its
    ``apt-get`` and ``pip`` work), ``none`` when none does, when ``allowed`` is false or when the user
    asks with ``NEXTSTATE_BUILD_NETWORK=none``."""
    if os.environ.get("NEXTSTATE_BUILD_NETWORK", "").strip().lower() == "none" or not allowed:
        return "none"
    return None if registries_answer() else "none"


def host_ca_bundle(explicit: str | None = None) -> Path | None:
    """The CA bundle builds trust: ``explicit``, else the host's pip/requests/OpenSSL bundle."""
    if explicit:
        if not Path(explicit).is_file():
            raise ValueError(f"--ca-bundle {explicit}: no such file")
        return Path(explicit)
    for candidate in (*(os.environ.get(k) for k in CA_DEFAULTS), DEBIAN_CA):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def trusting_host_ca(text: str, name: str) -> str:
    """A Dockerfile that copies the context's ``name`` (the host's CA bundle) into each stage and points
    :data:`CA_VARIABLES` at it as build ARGs."""
    args = "".join(f"ARG {var}={BUILD_CA}\n" for var in CA_VARIABLES)
    return _FROM.sub(lambda m: f"{m.group(0)}\nCOPY {name} {BUILD_CA}\n{args.rstrip()}", text)


def failure_reason(lines: Iterable[str]) -> str:
    """Why a build failed, from its output: a package not found, a host it could not reach (named), no
    network, an untrusted certificate, a full disk; else the failing step."""
    text = "\n".join(lines)
    for pattern, reason in BUILD_FAILURES:
        found = re.search(pattern, text)
        if found:
            return reason.format(next((g for g in found.groups() if g), ""))
    step = re.findall(r"The command '(.*?)' returned a non-zero code: (\d+)", text)
    if step:
        return f"`{step[-1][0][:200]}` exited with {step[-1][1]}"
    return "see the last output"


def docker_build(
    client: docker.DockerClient,
    directory: Path,
    buildargs: dict[str, str],
    progress: Progress,
    *,
    tag: str | None = None,
    labels: dict[str, str] | None = None,
    network: str | None = None,
    dockerfile: str | None = None,
    timeout: float | None = None,
    nocache: bool = False,
) -> str:
    """Runs one `docker build` (of `dockerfile`, default the directory's), streaming its
    steps; returns the image id. The error of a failed build says why (:func:`failure_reason`);
    one past `timeout` seconds (checked as its output comes) is stopped. A step that fails for no
    reason its output names, after steps the cache served, is built once more without the cache:
    the cause may be in a cached step's output (``curl URL | sh`` that could not reach its host
    succeeds, and the next step finds no command)."""
    progress.say(f"docker build {directory.name} ({' '.join(f'{k}={v}' for k, v in buildargs.items())})")
    image_id = None
    deadline = time.monotonic() + timeout if timeout else float("inf")
    stream = client.api.build(
        path=str(directory), tag=tag, buildargs=buildargs, labels=labels or None, nocache=nocache,
        network_mode=network, rm=True, forcerm=True, pull=False, decode=True, dockerfile=dockerfile,
    )
    pending, cached = "", False   # the engine's stream splits lines anywhere (stderr comes a few bytes a chunk)
    for chunk in stream:
        if time.monotonic() > deadline:
            stream.close()
            raise progress.fail(f"docker build of {directory} failed: it ran past its {timeout:g} s build timeout")
        if "error" in chunk:
            progress.feed(_ANSI.sub("", pending))
            progress.feed(chunk["error"])
            reason = failure_reason(progress.tail)
            if cached and not nocache and not any(re.search(p, "\n".join(progress.tail)) for p, _ in BUILD_FAILURES):
                progress.say("the failing step's cause may be in the output of a step the cache served: "
                             "building once more without the cache")
                left = None if timeout is None else max(1.0, deadline - time.monotonic())
                return docker_build(client, directory, buildargs, progress, tag=tag, labels=labels, network=network,
                                    dockerfile=dockerfile, timeout=left, nocache=True)
            raise progress.fail(f"docker build of {directory} failed: {reason}"
                                + (" (built with --network=none)" if network == "none" else ""))
        *lines, pending = (pending + chunk.get("stream", "")).split("\n")
        for line in lines:
            progress.feed(_ANSI.sub("", line))
            cached = cached or line.strip() == "---> Using cache"
        image_id = (chunk.get("aux") or {}).get("ID", image_id)
    progress.feed(_ANSI.sub("", pending))
    if image_id is None:
        raise progress.fail(f"docker build of {directory} gave no image id")
    return image_id


@contextlib.contextmanager
def build_lock(tag: str) -> Iterator[None]:
    """Serialises builds of one tag among the processes of this host."""
    folder = Path(tempfile.gettempdir()) / "nextstate-build-locks"
    folder.mkdir(exist_ok=True)
    with open(folder / (re.sub(r"[^\w.-]", "_", tag) + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# ---- offline rootfs -----------------------------------------------------------------


def unmount_under(path: Path) -> None:
    """Lazily unmounts whatever a failed debootstrap left mounted below `path`."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


def run_streamed(cmd: list[str], progress: Progress, env: dict[str, str] | None = None) -> int:
    """Runs a command, feeding its merged output to `progress`; returns its exit code."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            progress.feed(line)
        return proc.wait()


def mmdebstrap_tar(packages: list[str], archive: Path, mirror: str, progress: Progress, suite: str = SUITE) -> None:
    """Writes a minbase rootfs tarball with `packages`, resolved by apt (virtual packages too)."""
    cmd = ["mmdebstrap", "--variant=minbase", f"--include={','.join(packages)}",
           '--aptopt=APT::Install-Recommends "false"', "--skip=output/dev", suite, str(archive), mirror]
    env = {**os.environ, "TMPDIR": str(archive.parent)}
    if run_streamed(cmd, progress, env) != 0:
        raise progress.fail("mmdebstrap failed")


def debootstrap_tar(packages: list[str], archive: Path, mirror: str, progress: Progress, suite: str = SUITE) -> None:
    """Writes a minbase rootfs tarball with `packages` by debootstrap, whose resolver
    cannot choose providers of virtual packages (mmdebstrap can)."""
    target = archive.parent / "rootfs"
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(target), mirror]
    if run_streamed(cmd, progress) != 0:
        log = target / "debootstrap" / "debootstrap.log"
        if log.is_file():
            lines = log.read_text(errors="replace").splitlines()
            progress.tail.extend([x for x in lines if "dpkg:" in x or "depends on" in x][-15:] + lines[-10:])
        raise progress.fail("debootstrap failed (apt-get install mmdebstrap, whose resolver is apt's, may help)")
    unmount_under(target)
    for leftover in (target / "var/cache/apt/archives").glob("*.deb"):
        leftover.unlink()
    progress.say("packing rootfs")
    subprocess.run(["tar", "-C", str(target), "--numeric-owner", "-cf", str(archive), "."], check=True)
    shutil.rmtree(target)


def rootfs_image(
    client: docker.DockerClient, name: str, packages: list[str], progress: Progress, force: bool,
    suite: str = SUITE,
) -> str:
    """A `docker import` of a Debian minbase rootfs holding `packages` (cached by tag).

    Made by mmdebstrap when installed, else debootstrap; NEXTSTATE_BOOTSTRAP
    names one of them to force it.  The rootfs is removed once imported.
    """
    mirror = os.environ.get("NEXTSTATE_DEBIAN_MIRROR", DEFAULT_MIRROR)
    wanted = sorted(set(packages))
    key = hashlib.sha256(f"{suite}\0minbase\0{' '.join(wanted)}".encode()).hexdigest()[:16]
    tag = f"{REPO}/rootfs-{name}:{key}"
    if not force and image_info(client, tag):
        progress.say(f"rootfs {tag} already imported")
        return tag
    tools = os.environ.get("NEXTSTATE_BOOTSTRAP", "").split() or ["mmdebstrap", "debootstrap"]
    tool = next((t for t in tools if shutil.which(t)), None)
    if tool is None:
        raise RuntimeError(f"offline build needs {' or '.join(tools)}: apt-get install {tools[0]} "
                           "(or NEXTSTATE_OFFLINE=0)")
    if os.geteuid() != 0:
        raise RuntimeError(f"offline build runs {tool}, which needs root here (or NEXTSTATE_OFFLINE=0)")
    work = Path(tempfile.mkdtemp(prefix=f"nextstate-rootfs-{name}-", dir="/var/tmp"))
    try:
        archive = work / "rootfs.tar"
        progress.say(f"{tool} {suite} from {mirror} with {len(wanted)} packages (takes minutes)")
        (mmdebstrap_tar if tool == "mmdebstrap" else debootstrap_tar)(wanted, archive, mirror, progress, suite)
        progress.say(f"docker import as {tag} ({archive.stat().st_size >> 20} MiB)")
        repo, _, key = tag.partition(":")
        client.api.import_image(str(archive), repository=repo, tag=key,
                                changes=[f"ENV {PATH_ENV}", 'CMD ["bash"]'])
    finally:
        unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)
    return tag


# ---- builds -------------------------------------------------------------------------


def build_chain(
    client: docker.DockerClient,
    dirs: list[Path],
    tag: str,
    digest: str,
    progress: Progress,
    *,
    base: str | None,
    offline: bool,
    force: bool,
    network: str | None = None,
) -> str:
    """Builds `dirs` in order, each on the previous; only the last is tagged.

    With no `base`, the chain starts online on the first Dockerfile's own default (or
    ``debian:<suite>-slim`` when the chain names another suite, :func:`suite_of`), and
    offline on a rootfs of the chain's suite with the chain's packages.
    """
    labels = {HASH_LABEL: digest}
    suite = suite_of(dirs)
    if base is None and offline:
        packages = [p for d in dirs for p in read_packages(d)]
        base = rootfs_image(client, tag.split("/")[-1].split(":")[0], packages, progress, force, suite=suite)
    elif base is None and suite != SUITE:
        base = f"debian:{suite}-slim"
    args = {"OFFLINE": "1"} if offline else {}
    for i, directory in enumerate(dirs):
        last = i == len(dirs) - 1
        buildargs = {**args, **({"BASE": base} if base else {})}
        with with_wheels(directory, progress) as context:
            base = docker_build(client, context, buildargs, progress, tag=tag if last else None,
                                labels=labels if last else None, network=network)
    assert base is not None
    return base


@contextlib.contextmanager
def with_wheels(directory: Path, progress: Progress) -> Iterator[Path]:
    """The build context of a known image: its directory, or, where it has a ``wheels.txt``, a copy
    that holds those wheels in ``wheels/``, downloaded on this host from the package registry (its
    pip, its CA bundle), so the build itself needs no network. Each must be pinned and pure Python
    (``*-none-any.whl``): the image's Python need not be this host's."""
    wanted = read_wheels(directory)
    if not wanted:
        yield directory
        return
    loose = [w for w in wanted if "==" not in w]
    if loose:
        raise progress.fail(f"{directory / 'wheels.txt'}: pin each wheel as name==version ({', '.join(loose)})")
    with tempfile.TemporaryDirectory(prefix=f"nextstate-wheels-{directory.name}-") as scratch:
        context = Path(scratch) / directory.name
        shutil.copytree(directory, context, symlinks=True)
        progress.say(f"pip download {' '.join(wanted)}")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--dest", str(context / "wheels"), *wanted]
        if run_streamed(cmd, progress) != 0:
            raise progress.fail(f"pip download of {directory.name}'s wheels failed: {failure_reason(progress.tail)}")
        impure = sorted(w.name for w in (context / "wheels").glob("*.whl") if not w.name.endswith("-none-any.whl"))
        if impure:
            raise progress.fail(f"{directory / 'wheels.txt'}: not pure-Python wheels: {', '.join(impure)}")
        yield context


def finish(client: docker.DockerClient, tag: str, old: dict | None, progress: Progress) -> Built:
    """Drops the image `tag` replaced (when unused) and reports the new one."""
    new = client.api.inspect_image(tag)["Id"]
    if old and old["Id"] != new:
        try:
            client.api.remove_image(old["Id"])
        except docker.errors.APIError:
            pass  # still used by a container or a child image
    progress.close(f"built {tag} ({new[7:19]}) in {time.monotonic() - progress.start:.1f}s")
    return Built(tag, new, cached=False)


def build(name: str, *, client: docker.DockerClient | None = None, force: bool = False,
          offline: bool | None = None) -> Built:
    """Builds a known image (and its parents) unless its hash label is current."""
    client = client or connect()
    dirs = chain(image_dir(name))
    digest, tag = chain_hash(dirs), tag_of(name)
    old = image_info(client, tag)
    if not force and image_label(old, HASH_LABEL) == digest:
        assert old is not None
        return Built(tag, old["Id"], cached=True)
    with build_lock(tag):
        old = image_info(client, tag)  # another process may have built it meanwhile
        if not force and image_label(old, HASH_LABEL) == digest:
            assert old is not None
            return Built(tag, old["Id"], cached=True)
        return rebuild(client, name, dirs, digest, old, force, offline)


def rebuild(client: docker.DockerClient, name: str, dirs: list[Path], digest: str,
            old: dict | None, force: bool, offline: bool | None) -> Built:
    """The uncached part of `build`."""
    tag = tag_of(name)
    offline = is_offline(client) if offline is None else offline
    parent = parent_of(dirs[-1])
    own = read_packages(dirs[-1])
    if parent is not None and not (offline and own) and suite_of(dirs[:-1]) == suite_of(dirs):
        base = build(parent, client=client, offline=offline).tag
        todo = dirs[-1:]
    else:
        base, todo = None, dirs
    with Progress(name) as progress:
        progress.say(f"{tag} {'offline' if offline else 'online'}")
        build_chain(client, todo, tag, digest, progress, base=base, offline=offline, force=force,
                    network="none" if offline else None)
        return finish(client, tag, old, progress)


def ensure_image(name: str = "terminal", client: docker.DockerClient | None = None) -> str:
    """The tag of a known image, built first when missing or stale."""
    return build(name, client=client).tag


def build_image(
    context_dir: str | os.PathLike[str],
    tag: str,
    *,
    base: str | None = None,
    dockerfile: str | os.PathLike[str] | None = None,
    network: bool = True,
    client: docker.DockerClient | None = None,
    force: bool = False,
    timeout: float | None = None,
) -> str:
    """Builds any Dockerfile directory (a task's image); returns `tag`.

    A Dockerfile that declares ``ARG BASE`` is built on `base` (a known image
    name or any reference; default our terminal image), passed as the BASE
    build arg.  ``FROM`` references the base image table maps
    (:func:`base_images`) are replaced by their local images, built first
    when they are ours; so are public bases that cannot be had here
    (:func:`public_stand_ins`).  `dockerfile` (default ``Dockerfile`` in the
    directory; relative paths are to it) may lie anywhere.  Cached by a hash
    of the directory, the Dockerfile as built and the image ids of its bases.
    The build has the network while a package registry answers, trusting the
    host's CA bundle (:func:`build_network`; ``network=False`` or
    ``NEXTSTATE_BUILD_NETWORK=none``: ``--network=none``). Offline a
    ``packages.txt`` is honoured when `base` is ours (its chain is rebuilt on
    a rootfs that has them). `timeout`: seconds the build may take.
    """
    client = client or connect()
    directory = Path(context_dir).resolve()
    source = directory / (dockerfile or "Dockerfile")
    if not source.is_file():
        raise ValueError(f"no Dockerfile at {source}")
    original = source.read_text()
    text, mapped = resolve_from(original, [*built_bases(client, original, directory),
                                           *public_stand_ins(client, original)])
    bases = {ref: (build(name, client=client).tag if (name := known_name(local)) else local)
             for ref, local in mapped.items()}
    base_arg = re.search(r"^\s*ARG\s+BASE\b", text, re.MULTILINE) is not None
    ours = known_name(base or "terminal") if base_arg else None
    base_ref = (build(ours, client=client).tag if ours else base) if base_arg else None
    ids = []
    for ref in [*bases.values(), *([base_ref] if base_ref else [])]:
        info = image_info(client, ref)
        if info is None:
            raise ValueError(f"base image {ref!r} not found")
        ids.append(info["Id"])
    text, uv_version = offline_uv(text) if not astral_answers() else (text, None)
    missing = [ref for ref in from_refs(text) if ref not in bases.values() and image_info(client, ref) is None]
    if missing and is_offline(client):
        raise ValueError(f"base image {missing[0]} is not here and cannot be pulled offline: map it to a "
                         "local image in a base image table (NEXTSTATE_BASE_IMAGES; see containers/base-images.yaml)")
    digest = chain_hash([directory], base="\0".join([text, *ids]))
    with build_lock(tag):
        old = image_info(client, tag)
        if not force and image_label(old, HASH_LABEL) == digest:
            return tag
        offline = is_offline(client)
        on = [f"{ref} as {local}" for ref, local in bases.items()] + ([base_ref] if base_ref else [])
        with Progress(tag) as progress:
            progress.say(f"building {tag} from {source} on {', '.join(on) or 'its own FROM'} "
                         f"{'offline' if offline else 'online'}")
            for note in filter(None, (stand_in_note(ref, local) for ref, local in mapped.items())):
                progress.say(note)
            net = build_network(network)
            progress.say("the build has the network" if net is None else "the build has no network (--network=none)")
            if offline and ours and read_packages(directory):
                dirs = chain(image_dir(ours)) + [directory]
                build_chain(client, dirs, tag, digest, progress, base=None, offline=True, force=force, network=net)
            else:
                args = {**({"OFFLINE": "1"} if offline else {}), "BASE": base_ref} if base_ref else {}
                bundle = host_ca_bundle() if net is None else None
                with tempfile.TemporaryDirectory(prefix="nextstate-dockerfile-") as scratch:
                    context, path = directory, None  # the directory's own Dockerfile; else a rewritten one
                    if bundle is not None or uv_version is not None:  # a copy of the context that holds
                        context = Path(scratch) / "context"           # the host's CA bundle, the offline uv
                        shutil.copytree(directory, context, symlinks=True)
                        added = []
                        if bundle is not None:
                            shutil.copy(bundle, context / "nextstate-host-ca.crt")
                            text = trusting_host_ca(text, "nextstate-host-ca.crt")
                            added.append("nextstate-host-ca.crt")
                        if uv_version is not None:
                            progress.say(f"astral.sh is not reachable: uv {uv_version or '(newest)'} from the "
                                         "package registry stands in for its installer")
                            uv_wheel_binaries(uv_version, context / UV_CONTEXT)
                            added.append(UV_CONTEXT)
                        ignore = context / ".dockerignore"
                        if ignore.is_file():
                            ignore.write_text(ignore.read_text() + "".join(f"\n!{name}\n" for name in added))
                    if text != original or source != directory / "Dockerfile":
                        path = Path(scratch) / "Dockerfile"
                        path.write_text(text)
                    docker_build(client, context, args, progress, tag=tag, labels={HASH_LABEL: digest},
                                 network=net, dockerfile=str(path) if path else None, timeout=timeout)
            finish(client, tag, old, progress)
    return tag


def build_all(names: Iterable[str] | None = None, *, client: docker.DockerClient | None = None,
              force: bool = False) -> Iterator[Built]:
    """Builds the named images (default: every known one), yielding each outcome."""
    client = client or connect()
    for name in names or known_images():
        yield build(name, client=client, force=force)
