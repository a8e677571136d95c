"""A plain (not editable) install works from any directory: configs and templates are package data.

The venv sees the machine's packages (``--system-site-packages``) and the build
uses them (``--no-deps --no-build-isolation``), so the test is offline; it
builds from a copy of the source tree, so the checkout stays clean, and runs
every command from a directory that holds nothing of the project.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", "runs", ".pytest_cache")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    source = base / "src"
    shutil.copytree(ROOT, source, ignore=IGNORE)
    venv = base / "venv"
    # no pip of its own: the machine's pip and setuptools install into the venv
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(source)],
                   check=True, cwd=base)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return python, elsewhere, env


def _run(installed, *args):
    python, cwd, env = installed
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_installed_package_is_the_one_imported(installed):
    out = _run(installed, "-c", "import nextstate.configs, nextstate.judges, nextstate.train as t; "
                                "print(t.__file__); print(nextstate.configs.__file__)")
    assert out.returncode == 0, out.stderr
    assert all("site-packages" in line and str(ROOT) not in line for line in out.stdout.splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("args, expect", [
    (["-m", "nextstate.train", "--env", "terminal", "--dry-run"], "family: terminal"),
    (["-m", "nextstate.train", "--env", "terminal", "--backend", "verl", "--dry-run"], "nextstate:"),
    (["-m", "nextstate.envs", "validate", "toolcall"], "0 failed"),
])
def test_commands_work_from_an_unrelated_directory(installed, args, expect):
    out = _run(installed, *args)
    assert out.returncode == 0, out.stderr[-2000:]
    assert expect in out.stdout
