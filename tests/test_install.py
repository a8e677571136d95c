"""A plain (not editable) install works from any directory: configs and templates are package data.

The venv sees the machine's packages (``--system-site-packages``) and the install of the wheel
(conftest's ``wheel``: built offline from a copy of the source tree, so the checkout stays clean)
uses them (``--no-deps``), so the test is offline; every command runs from a directory that holds
nothing of the project. The wheel's own checks (one top-level name, what the core and the extras
need) read it without installing it.
"""

import os
import subprocess
import sys
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel):
    base = tmp_path_factory.mktemp("install")
    venv = base / "venv"
    # no pip of its own: the machine's pip installs into the venv
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, cwd=base)
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


def _read(wheel: Path, name: str) -> str:
    """A file of the wheel's ``.dist-info`` folder (``METADATA``, ``top_level.txt``)."""
    with zipfile.ZipFile(wheel) as z:
        [path] = [n for n in z.namelist() if n.split("/")[0].endswith(".dist-info") and n.endswith("/" + name)]
        return z.read(path).decode()


def _needs(meta: Message, extra: str | None = None) -> set[str]:
    """The distributions installing nextstate (``extra`` None) or ``nextstate[extra]`` brings,
    nextstate's own extras (``nextstate[train]`` in ``[verl]``) followed."""
    names: set[str] = set()
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and (extra is None or not req.marker.evaluate({"extra": extra})):
            continue
        if canonicalize_name(req.name) == "nextstate":
            for inner in req.extras:
                names |= _needs(meta, inner)
        else:
            names.add(canonicalize_name(req.name))
    return names


def test_the_wheel_installs_one_top_level_name(wheel):
    """``nextstate`` only: no top-level ``agents`` beside the OpenAI Agents SDK's, no ``envs`` or ``train``."""
    assert _read(wheel, "top_level.txt").split() == ["nextstate"]
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"nextstate"}


def test_the_core_needs_neither_torch_nor_verl(wheel):
    meta = Parser().parsestr(_read(wheel, "METADATA"))
    core = _needs(meta)
    assert "gymnasium" in core and not core & {"torch", "verl"}, sorted(core)
    for extra in ("train", "verl"):
        assert {"torch", "verl"} <= _needs(meta, extra), extra
