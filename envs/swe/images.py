"""SWE-bench instance images from plain dataset rows: ``python -m containers build-swe``.

For each row the image ``sweb.eval.x86_64.<instance_id>:latest`` (swebench's
name) is built in SWE-bench's layers: a Python of the spec's version, the
``testbed`` env at ``/opt/miniconda3/envs/testbed`` with the spec's
requirements and pins, then the repository in ``/testbed`` at ``base_commit``
(newer tags, the remote and the reflog removed), installed, and committed so
that ``git diff`` shows only later changes. The specs and scripts come from
:mod:`envs.swe.specs`.

* **Base.** Where a registry answers: ``python:<version>-bookworm`` (3.5:
  ``-buster``, 3.6: ``-bullseye``). Where
  none does: a Debian rootfs made by mmdebstrap/debootstrap from the Debian
  mirror whose suite ships that Python (3.9: bullseye, 3.11: bookworm, 3.13:
  trixie); other versions are refused offline with that said.
* **Env.** A venv stands in for conda's env; ``/opt/miniconda3/bin/activate``
  defines a ``conda`` function whose ``conda activate testbed`` activates it,
  so SWE-bench's eval scripts and ``.bashrc`` line work unchanged. A python reached
  through a symlink to the env's (``tox --current-env``) sees the env's packages, as with
  conda (:data:`ENV_LINK_HOOK`).
* **Repository source.** By default ``git clone https://github.com/<repo>`` as
  SWE-bench does; ``repo_source`` (``--repo-source``) names local git
  repositories instead: a directory holding ``owner+name/repo``,
  ``owner+name``, ``owner__name(.git)`` or ``owner/name``, or a JSON file
  mapping ``owner/name`` to a path. Requirements files are read from the same
  source at ``environment_setup_commit``. A source lacking objects of later
  commits gives the build the history of ``base_commit`` (:func:`copy_repository`).
* **Network and certificates.** Builds use the default bridge network: pip
  reaches PyPI. The host's CA bundle (``ca_bundle``; default ``PIP_CERT``,
  ``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE`` or Debian's bundle) is copied into
  the build and used by pip and git there, so a TLS-inspecting proxy the host
  trusts is trusted in the build too.

Images carry a hash of their build inputs and are not rebuilt while it matches.
Where the repository came from is no input: an image built with
``--repo-source`` stays current for a later ``build-swe`` without it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from nextstate.envs.swe.specs import ACTIVATE, CONDA, ENV_NAME, TESTBED, SpecError, complete_row, spec_of

from nextstate.containers import connect
from nextstate.containers.build import (HASH_LABEL, Progress, docker_build, finish, host_ca_bundle, image_info, image_label,
                              is_offline, rootfs_image)
from nextstate.envs.swe.instances import SETUP_COMMIT_MESSAGE, load_instances

#: Debian suites by the Python version they ship (offline bases).
DEBIAN_PYTHON = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
#: The newest Debian suite of the official ``python:<version>-<suite>`` images of old Pythons.
PYTHON_IMAGE_SUITE = {"3.5": "buster", "3.6": "bullseye"}
OFFLINE_PACKAGES = ["bash", "ca-certificates", "git", "patch", "python3", "python3-venv", "python3-dev",
                    "gcc", "libc6-dev", "make", "procps"]
REQUIREMENT_SKIP = ("-e .", "#", ".[test")

TRUST_CA = ("export PIP_DISABLE_PIP_VERSION_CHECK=1; if [ -s /nextstate-build/ca.crt ]; then "
            "export PIP_CERT=/nextstate-build/ca.crt GIT_SSL_CAINFO=/nextstate-build/ca.crt; fi")
CONDA_STANDIN = f"""\
# A stand-in for conda's activate: `conda activate NAME` activates the venv {CONDA}/envs/NAME.
conda() {{
    case "$1" in
        activate) . "{CONDA}/envs/${{2:-{ENV_NAME}}}/bin/activate" && export CONDA_DEFAULT_ENV="${{2:-{ENV_NAME}}}" ;;
        deactivate) deactivate 2>/dev/null; unset CONDA_DEFAULT_ENV ;;
        *) echo "conda stand-in (nextstate): only 'conda activate NAME' and 'conda deactivate' work" >&2; return 1 ;;
    esac
}}
"""

#: A conda env's python reached through a symlink (``tox --current-env`` links ``.tox/py39/bin/python`` to
#: it) is still that env; a venv's is the system interpreter without the env's packages. This module, in
#: the system interpreter's site directory with a ``.pth`` that imports it, adds the env's packages (first)
#: when the interpreter was reached through the env's ``bin``.
ENV_LINK_HOOK = """\
import os
import site
import sys

ENV_BIN = "{env_bin}"


def _through_env(path):
    for _ in range(40):
        if os.path.dirname(os.path.abspath(path)) == ENV_BIN:
            return True
        if not os.path.islink(path):
            return False
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return False


if sys.prefix == sys.base_prefix and _through_env(sys.executable):
    _before = list(sys.path)
    site.addsitedir("{site_packages}")
    sys.path[:] = [p for p in sys.path if p not in _before] + _before
"""
ENV_LINK_MODULE = "nextstate_testbed_env"


def env_link_hook(env: str, python: str) -> str:
    """:data:`ENV_LINK_HOOK` for the venv at ``env`` of Python ``python`` (``3.9``)."""
    return ENV_LINK_HOOK.format(env_bin=f"{env}/bin", site_packages=f"{env}/lib/python{python}/site-packages")


DOCKERFILE = """\
ARG BASE
FROM ${BASE}
COPY setup_env.sh requirements.txt ca.crt /nextstate-build/
RUN bash /nextstate-build/setup_env.sh
COPY . /nextstate-build/
RUN bash /nextstate-build/setup_repo.sh && rm -rf /nextstate-build
WORKDIR /testbed/
"""


@dataclass
class SWEBuilt:
    """One instance's build: its image, whether the cache answered, seconds, and size in bytes."""

    instance_id: str
    image: str
    cached: bool
    seconds: float
    size: int
    error: str | None = None


# ---- the repository source ----------------------------------------------------------


def repo_path(repo: str, source: str | None) -> Path | None:
    """The local git repository for ``owner/name`` under ``source`` (None: clone from GitHub)."""
    if not source:
        return None
    root = Path(source)
    if root.is_file():
        mapping = json.loads(root.read_text())
        if repo not in mapping:
            raise SpecError(f"--repo-source {source} maps no path for {repo}")
        return Path(mapping[repo])
    owner, name = repo.split("/")
    for candidate in (root / f"{owner}+{name}" / "repo", root / f"{owner}+{name}", root / f"{owner}__{name}.git",
                      root / f"{owner}__{name}", root / owner / name, root / f"{name}.git", root / name):
        if (candidate / "HEAD").is_file() or (candidate / ".git").exists():
            return candidate
    raise SpecError(f"the repository source {source} holds no git repository for {repo} (looked for {owner}+{name}/repo, "
                    f"{owner}+{name}, {owner}__{name}.git, {owner}/{name})")


def read_at(repo: str, source: str | None, commit: str, path: str) -> str | None:
    """A file of ``repo`` at ``commit`` from the local source, else from GitHub; None if absent
    (GitHub's 404). GitHub not answering is said, naming its host, not taken for an absent file."""
    local = repo_path(repo, source)
    if local is not None:
        shown = subprocess.run(["git", "--git-dir", str(local / ".git") if (local / ".git").exists() else str(local),
                                "show", f"{commit}:{path}"], capture_output=True, text=True)
        return shown.stdout if shown.returncode == 0 else None
    url = f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.read().decode()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise SpecError(f"raw.githubusercontent.com answered HTTP {e.code} for {repo}'s {path} at {commit[:12]}") from e
    except OSError as e:
        why = getattr(e, "reason", e)
        raise SpecError(f"could not reach raw.githubusercontent.com for {repo}'s {path} at {commit[:12]} ({why}); "
                        "a local copy of the repository: --repo-source or NEXTSTATE_SWE_REPOS") from e


def first_file(row: dict[str, Any], paths: list[str], source: str | None) -> tuple[str, str]:
    """The first of ``paths`` that exists in the row's repository at its setup commit, and its text."""
    commit = row.get("environment_setup_commit") or row["base_commit"]
    for path in paths:
        text = read_at(row["repo"], source, commit, path)
        if text is not None:
            return path, text
    raise SpecError(f"instance {row['instance_id']}: none of {', '.join(paths)} exists in {row['repo']} "
                    f"at {commit[:12]}")


def requirements(row: dict[str, Any], spec: dict[str, Any], source: str | None) -> str:
    """The spec's requirements file at the environment setup commit, ``-r`` includes inlined (for a
    conda ``environment`` file: its ``pip:`` list; the conda packages are the spec's ``pip_packages``)."""
    if spec.get("environment"):
        return environment_pip(row, spec["environment"], source)
    paths = spec.get("requirements") or []
    if not paths:
        return ""
    commit = row.get("environment_setup_commit") or row["base_commit"]
    path, text = first_file(row, paths, source)
    folder = os.path.dirname(path)
    lines = []
    for line in text.splitlines():
        if line.strip().startswith("-r"):
            include = os.path.normpath(os.path.join(folder, line.strip()[2:].strip()))
            included = read_at(row["repo"], source, commit, include)
            lines += [x for x in (included or "").splitlines() if not x.strip().startswith(REQUIREMENT_SKIP)]
        elif not line.strip().startswith(REQUIREMENT_SKIP):
            lines.append(line)
    return "\n".join(lines) + "\n"


def environment_pip(row: dict[str, Any], paths: list[str], source: str | None) -> str:
    """The ``pip:`` list of the first conda environment file of ``paths`` at the setup commit."""
    import yaml

    _, text = first_file(row, paths, source)
    deps = (yaml.safe_load(text) or {}).get("dependencies") or []
    pip = next((d["pip"] for d in deps if isinstance(d, dict) and "pip" in d), [])
    return "".join(f"{line}\n" for line in pip if not str(line).startswith(REQUIREMENT_SKIP))


# ---- the build scripts --------------------------------------------------------------------


def setup_env_script(spec: dict[str, Any]) -> str:
    """Creates the testbed venv, the conda stand-in, and installs requirements and pins."""
    pins = " ".join(shlex.quote(p) for p in spec.get("pip_packages", []))
    packages = spec.get("packages", "")  # conda's package list in swebench; the same names on PyPI
    return "\n".join([
        "set -euxo pipefail",
        TRUST_CA,
        f"mkdir -p {CONDA}/bin {CONDA}/etc/profile.d {CONDA}/envs",
        f"python{spec['python']} -m venv {CONDA}/envs/{ENV_NAME}",
        f"SYSTEM_SITE=$(python{spec['python']} -c 'import site; print(site.getsitepackages()[0])')",
        'mkdir -p "$SYSTEM_SITE"',
        f"cat > \"$SYSTEM_SITE/{ENV_LINK_MODULE}.py\" <<'NEXTSTATE_EOF'\n"
        f"{env_link_hook(f'{CONDA}/envs/{ENV_NAME}', spec['python'])}NEXTSTATE_EOF",
        f"echo 'import {ENV_LINK_MODULE}' > \"$SYSTEM_SITE/{ENV_LINK_MODULE}.pth\"",
        f"cat > {CONDA}/bin/activate <<'NEXTSTATE_EOF'\n{CONDA_STANDIN}NEXTSTATE_EOF",
        f"cp {CONDA}/bin/activate {CONDA}/etc/profile.d/conda.sh",
        ACTIVATE,
        "python -m pip install -q --upgrade pip",  # the distro's pip predates pyproject-only packages
        "if [ -s /nextstate-build/requirements.txt ]; then "
        "python -m pip install -r /nextstate-build/requirements.txt; fi",
        *([f"python -m pip install {packages}"] if packages else []),
        *([f"python -m pip install {pins}"] if pins else []),
        f"echo '{ACTIVATE}' >> /root/.bashrc",
    ]) + "\n"


def setup_repo_script(row: dict[str, Any], spec: dict[str, Any], local: bool) -> str:
    """Clones the repository into /testbed at the base commit the way SWE-bench does, then installs it."""
    from swebench.image_builder.constants import REPO_BASE_COMMIT_BRANCH

    base = row["base_commit"]
    if local:
        clone = f"git clone -q -o origin /nextstate-build/repo.git {TESTBED}"
    else:
        branch = REPO_BASE_COMMIT_BRANCH.get(row["repo"], {}).get(base, "")
        clone = (f"git clone -o origin {'--branch ' + branch if branch else ''} --single-branch "
                 f"https://github.com/{row['repo']} {TESTBED}")
    return "\n".join([
        "set -euxo pipefail",
        TRUST_CA,
        clone,
        f"chmod -R 777 {TESTBED}",
        f"cd {TESTBED}",
        f"git reset --hard {base}",
        "git remote remove origin",
        f"TARGET_TIMESTAMP=$(git show -s --format=%ci {base})",
        'git tag -l | while read tag; do TAG_COMMIT=$(git rev-list -n 1 "$tag"); '
        'TAG_TIME=$(git show -s --format=%ci "$TAG_COMMIT"); '
        'if [[ "$TAG_TIME" > "$TARGET_TIMESTAMP" ]]; then git tag -d "$tag" >/dev/null; fi; done',
        "git reflog expire --expire=now --all",
        "git gc -q --prune=now",
        ACTIVATE,
        *spec.get("pre_install", []),
        *([spec["install"]] if spec.get("install") else []),
        "git config --global user.email setup@swebench.config",
        "git config --global user.name SWE-bench",
        f"git commit --allow-empty -qam {SETUP_COMMIT_MESSAGE}",
    ]) + "\n"


def write_context(row: dict[str, Any], folder: Path, *, repo_source: str | None, ca_bundle: Path | None) -> str:
    """Writes the build context of one instance into ``folder``; returns a hash of its inputs."""
    spec = spec_of(row)
    local = repo_path(row["repo"], repo_source)
    (folder / "Dockerfile").write_text(DOCKERFILE)
    (folder / "setup_env.sh").write_text(setup_env_script(spec))
    (folder / "requirements.txt").write_text(requirements(row, spec, repo_source))
    (folder / "setup_repo.sh").write_text(setup_repo_script(row, spec, local is not None))
    (folder / "ca.crt").write_bytes(ca_bundle.read_bytes() if ca_bundle else b"")
    digest = hashlib.sha256()
    for name in ("Dockerfile", "setup_env.sh", "requirements.txt"):
        digest.update((folder / name).read_bytes())
    # the image's identity is the repository at base_commit, not where it was cloned from
    digest.update(setup_repo_script(row, spec, local=False).encode())
    if local is not None:
        copy_repository(local, row["base_commit"], folder / "repo.git")
    return digest.hexdigest()[:32]


def copy_repository(local: Path, base: str, target: Path) -> None:
    """A bare copy of ``local`` for the build context. Where the whole history cannot be copied (a mirror
    lacking objects of later commits), the history of ``base`` and the tags in it: what SWE-bench's setup
    keeps of the clone once it has reset to ``base``, removed the remote and pruned."""
    full = subprocess.run(["git", "clone", "-q", "--bare", "--no-local", str(local), str(target)],
                          capture_output=True, text=True)
    if full.returncode == 0:
        return
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["git", "init", "-q", "--bare", str(target)], check=True, capture_output=True)
    tags = subprocess.run(["git", "-C", str(local), "tag", "--merged", base], capture_output=True, text=True)
    refs = [f"{base}:refs/heads/main", *(f"refs/tags/{t}:refs/tags/{t}" for t in tags.stdout.split())]
    fetched = subprocess.run(["git", "--git-dir", str(target), "fetch", "-q", "--no-tags", str(local), *refs],
                             capture_output=True, text=True)
    if fetched.returncode != 0:
        raise SpecError(f"cannot copy the git repository {local}: {' '.join(full.stderr.split())[-300:]}; "
                        f"nor the history of {base[:12]}: {' '.join(fetched.stderr.split())[-300:]}")
    subprocess.run(["git", "--git-dir", str(target), "symbolic-ref", "HEAD", "refs/heads/main"], check=True)


# ---- building -----------------------------------------------------------------------------


def base_image(client: docker.DockerClient, python: str, offline: bool, progress: Progress) -> str:
    """The image to build on: ``python:<v>-bookworm`` online, a Debian rootfs with that Python offline."""
    if not offline:
        return f"python:{python}-{PYTHON_IMAGE_SUITE.get(python, 'bookworm')}"
    suite = DEBIAN_PYTHON.get(python)
    if suite is None:
        raise SpecError(f"Python {python} is in no Debian suite this builder knows ({', '.join(DEBIAN_PYTHON)}), "
                        f"and no image registry answers for python:{python}; build where one does")
    return rootfs_image(client, f"swe-{suite}", OFFLINE_PACKAGES, progress, False, suite=suite)


def build_one(row: dict[str, Any], *, client: docker.DockerClient, offline: bool, repo_source: str | None,
              ca_bundle: Path | None, force: bool = False) -> SWEBuilt:
    """Builds one instance's image unless its input hash is current."""
    start = time.monotonic()
    row = complete_row(row)
    tag = row["image"]
    with tempfile.TemporaryDirectory(prefix="nextstate-swe-", dir="/var/tmp") as tmp:
        digest = write_context(row, Path(tmp), repo_source=repo_source, ca_bundle=ca_bundle)
        old = image_info(client, tag)
        if not force and image_label(old, HASH_LABEL) == digest:
            assert old is not None
            return SWEBuilt(row["instance_id"], tag, True, time.monotonic() - start, old["Size"])
        with Progress(row["instance_id"]) as progress:
            base = base_image(client, spec_of(row)["python"], offline, progress)
            docker_build(client, Path(tmp), {"BASE": base}, progress, tag=tag, labels={HASH_LABEL: digest})
            finish(client, tag, old, progress)  # drops the image this one replaced
    return SWEBuilt(row["instance_id"], tag, False, round(time.monotonic() - start, 1),
                    client.api.inspect_image(tag)["Size"])


def build_swe(rows: list[dict[str, Any]], *, client: docker.DockerClient, parallel: int = 1,
              repo_source: str | None = None, ca_bundle: str | None = None, force: bool = False,
              offline: bool | None = None) -> Iterator[SWEBuilt]:
    """Builds the rows' images, ``parallel`` at a time, yielding each outcome as it finishes
    (a failed build carries its ``error``; the others go on)."""
    if shutil.which("git") is None and repo_source:
        raise SpecError("--repo-source needs git on this machine")
    for row in rows:  # refuse bad rows before any build starts
        complete_row(row)
        spec_of(row)
    offline = is_offline(client) if offline is None else offline
    bundle = host_ca_bundle(ca_bundle)

    def one(row: dict[str, Any]) -> SWEBuilt:
        start = time.monotonic()
        try:
            return build_one(row, client=client, offline=offline, repo_source=repo_source, ca_bundle=bundle,
                             force=force)
        except (RuntimeError, SpecError, OSError, subprocess.CalledProcessError, docker.errors.DockerException) as e:
            return SWEBuilt(row["instance_id"], complete_row(row)["image"], False,
                            round(time.monotonic() - start, 1), 0, f"{type(e).__name__}: {e}")

    with ThreadPoolExecutor(max(1, parallel)) as pool:
        yield from pool.map(one, rows)


#: swebench's image names, local (``sweb.eval.x86_64.<instance_id>``) or on Docker Hub
#: (``swebench/sweb.eval.x86_64.<instance_id with __ spelt _1776_>``), with any tag.
SWEBENCH_IMAGE = re.compile(r"(?:docker\.io/)?(?:[\w.-]+/)?sweb\.eval\.[\w-]+\.(?P<name>[^:@/]+)(?:[:@].*)?")


def swebench_base(ref: str, context: Path, client: docker.DockerClient) -> str | None:
    """A base builder (:func:`containers.build.built_bases`): a task whose ``FROM`` names a SWE-bench
    instance image (terminal-bench's and Harbor's SWE-bench tasks) gets that image built here by
    ``build-swe`` from the instance's row: the task's own ``tests/config.json`` (as their adapters
    ship it; beside or above the build context) or a row of the files ``NEXTSTATE_SWE_ROWS`` names
    (``os.pathsep``-separated .jsonl/.json/.parquet). The repository comes from ``NEXTSTATE_SWE_REPOS``
    (``--repo-source``'s format), else from GitHub. Not a SWE-bench name: ``None``."""
    found = SWEBENCH_IMAGE.fullmatch(ref)
    if not found:
        return None
    wanted = found.group("name").replace("_1776_", "__").lower()
    rows = [json.loads(p.read_text()) for p in (context / "tests" / "config.json", context.parent / "tests" /
                                                 "config.json", context / "config.json") if p.is_file()]
    for source in filter(None, os.environ.get("NEXTSTATE_SWE_ROWS", "").split(os.pathsep)):
        rows += load_instances(source)
    row = next((r for r in rows if isinstance(r, dict) and str(r.get("instance_id", "")).lower() == wanted), None)
    if row is None:
        raise ValueError(f"base image {ref} is not here and cannot be pulled offline: a SWE-bench instance "
                         f"image, which build-swe makes from the row of {wanted}, and neither the task "
                         "(tests/config.json) nor NEXTSTATE_SWE_ROWS has it")
    row = {k: v for k, v in row.items() if k not in ("image", "eval_script", "log_parser", "eval_type")}
    built = next(build_swe([row], client=client, offline=True, repo_source=os.environ.get("NEXTSTATE_SWE_REPOS")))
    if built.error:
        raise RuntimeError(f"building the SWE-bench base {built.image} for {ref}: {built.error}")
    return built.image


def add_command(subparsers: Any) -> None:
    """Adds ``build-swe`` to ``python -m containers`` (its ``nextstate.containers`` entry point)."""
    s = subparsers.add_parser("build-swe", help="build SWE-bench instance images from dataset rows "
                              "(sweb.eval.x86_64.<instance_id>:latest)")
    s.add_argument("--tasks", required=True, help="rows in SWE-bench's schema: .jsonl, .json or .parquet")
    s.add_argument("--ids", help="comma-separated instance ids (default: every row)")
    s.add_argument("--parallel", type=int, default=1, help="builds at once (default 1)")
    s.add_argument("--repo-source", metavar="DIR_OR_MAP",
                   help="local git repositories instead of cloning from GitHub: a directory holding "
                   "owner+name/repo, owner+name, owner__name.git or owner/name, or a JSON file "
                   "{\"owner/name\": path}")
    s.add_argument("--ca-bundle", help="CA bundle pip and git trust inside the build (default: the host's, "
                   "from PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE or Debian's)")
    s.add_argument("--force", action="store_true", help="rebuild even when up to date")
    s.set_defaults(func=_cmd_build_swe)
    e = subparsers.add_parser("export-swe", help="write the rows completed with the fields swebench's harness "
                              "reads (image, eval_script, log_parser, eval_type), for `python -m "
                              "swebench.harness.run_evaluation --dataset_name OUT`")
    e.add_argument("--tasks", required=True, help="rows in SWE-bench's schema: .jsonl, .json or .parquet")
    e.add_argument("--ids", help="comma-separated instance ids (default: every row)")
    e.add_argument("--out", required=True, help="the .jsonl file to write")
    e.set_defaults(func=_cmd_export_swe)


def _cmd_export_swe(args: argparse.Namespace) -> int:
    """Writes the completed rows as JSON lines."""
    rows = load_instances(args.tasks, args.ids.split(",") if args.ids else None)
    with open(args.out, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    print(f"{len(rows)} rows with image, eval_script, log_parser and eval_type written to {args.out}")
    return 0


def _cmd_build_swe(args: argparse.Namespace) -> int:
    """Builds SWE-bench instance images from dataset rows; exits 1 if any build failed."""
    rows = load_instances(args.tasks, args.ids.split(",") if args.ids else None)
    failed = 0
    for built in build_swe(rows, client=connect(args.host), parallel=args.parallel, repo_source=args.repo_source,
                           ca_bundle=args.ca_bundle, force=args.force):
        if built.error:
            failed += 1
            print(f"{built.instance_id}: FAILED after {built.seconds:.0f}s: {built.error}", flush=True)
        else:
            state = "up to date" if built.cached else f"built in {built.seconds:.0f}s"
            print(f"{built.image}: {state}, {built.size / 2**20:.0f} MiB", flush=True)
    print(f"{len(rows) - failed}/{len(rows)} images ready")
    return 1 if failed else 0
