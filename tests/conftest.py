"""Shared fixtures: a Docker engine, the terminal image, and the project's wheel.

Docker tests are skipped on a machine without an engine, except in CI
(``CI=true``), where a missing engine is a failure: `.ci/run` starts one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nextstate.containers.pool import docker_available

# Task directories under fixtures/ hold their own test_outputs.py files: task data, not tests.
collect_ignore = ["fixtures"]

# Tests started in the background by a script (`bash .ci/run &`) get SIGINT ignored, and so would
# every command they start: the Ctrl-C tests' commands would then run to their end. A handler here
# is reset to the default in each child.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TERMINAL_IMAGE = "nextstate/terminal:latest"
ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", "runs", ".pytest_cache")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if docker_available():
        return
    if os.environ.get("CI"):
        raise pytest.UsageError("CI=true but no Docker engine answers: .ci/run must start dockerd")
    skip = pytest.mark.skip(reason="no Docker engine answers on this machine")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def sever_shell():
    """A function that closes a DockerSandbox's host end of its shell's streams for real, under the
    sandbox (as a finished close() leaves it: EBADF on the next use), on either transport."""
    from nextstate.containers.fifo_shell import FifoShell

    def sever(sb) -> None:
        shell = sb._shell
        os.close(shell._in if isinstance(shell, FifoShell) else shell.sock.detach())
    return sever


@pytest.fixture(scope="session")
def docker_client():
    import docker
    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture(scope="session")
def terminal_image(docker_client) -> str:
    """The general terminal image, built (offline if need be) when missing."""
    from nextstate import containers
    return containers.ensure_image("terminal", client=docker_client)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """nextstate's wheel, built offline with the machine's setuptools (``--no-build-isolation``)
    from a copy of the source tree, so the checkout stays clean."""
    base = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, base / "src", ignore=IGNORE)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(base / "dist"), str(base / "src")], check=True, cwd=base)
    [built] = (base / "dist").glob("nextstate-*.whl")
    return built


HARBOR_VENV = Path(os.environ.get("NEXTSTATE_HARBOR_VENV", "/tmp/harbor-venv"))


@pytest.fixture(scope="session")
def harbor_python() -> Path:
    """The Python of a venv with ``harbor`` installed (it needs Python >= 3.12; this machine's is
    3.11): ``NEXTSTATE_HARBOR_VENV`` (default /tmp/harbor-venv), made with pyenv's 3.12 and
    ``pip install harbor`` when missing. Skipped, with the reason, where neither can be had."""
    python = HARBOR_VENV / "bin" / "python"
    if not python.exists():
        pyenv = shutil.which("pyenv")
        versions = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True).stdout.split() \
            if pyenv else []
        found = next((v for v in versions if v.startswith(("3.12", "3.13"))), None)
        if found is None:
            pytest.skip("harbor needs Python >= 3.12 and this machine has none (pyenv has no 3.12 or 3.13)")
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        # that version's own python: under pyenv, `python` on PATH is the running version's
        made = subprocess.run([str(Path(root) / "versions" / found / "bin" / "python"), "-m", "venv", str(HARBOR_VENV)],
                              capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"could not make a Python {found} venv for harbor: {made.stderr.strip()[-300:]}")
    if subprocess.run([str(python), "-c", "import harbor"], capture_output=True).returncode != 0:
        got = subprocess.run([str(python), "-m", "pip", "install", "-q", "harbor==0.26.0"],
                             capture_output=True, text=True)
        if got.returncode != 0:
            pytest.skip(f"pip could not install harbor in {HARBOR_VENV}: {got.stderr.strip()[-300:]}")
    return python
