"""What needs no veRL does not import it, and what imports it says nothing about accelerators.

``python -m nextstate.train --help`` and a dry run import no veRL and print no warning. The local
backend (``nextstate.train.local``: its PPO loss is veRL's) imports veRL, whose platform manager
logs two warnings at import on a host without an accelerator; a filter in ``train/__init__.py``
keeps them out. Each command runs in a fresh interpreter (``-X importtime`` lists, on stderr,
every module it imported) from a directory that holds nothing of the project.
"""

import subprocess
import sys
from pathlib import Path

import pytest

IMPORT_TIME = "import time:"


def _run(cwd: Path, *args: str) -> tuple[str, set[str], list[str]]:
    """``python -X importtime ARGS``: its stdout, the modules it imported, and its other stderr lines."""
    out = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stderr.splitlines()
    modules = {line.rpartition("|")[2].strip() for line in lines if line.startswith(IMPORT_TIME)}
    return out.stdout, modules, [line for line in lines if not line.startswith(IMPORT_TIME)]


def _verl(modules: set[str]) -> set[str]:
    return {m for m in modules if m == "verl" or m.startswith("verl.")}


@pytest.mark.parametrize("args, expect", [
    (["--help"], "--dry-run"),
    (["--env", "terminal", "--dry-run"], "family: terminal"),
])
def test_the_launcher_imports_no_verl(tmp_path, args, expect):
    stdout, modules, other = _run(tmp_path, "-m", "nextstate.train", *args)
    assert expect in stdout
    assert "nextstate.train" in modules and _verl(modules) == set()
    assert [line for line in other if "warning" in line.lower()] == []


def test_the_local_backend_imports_verl_without_platform_warnings(tmp_path):
    _, modules, other = _run(tmp_path, "-c", "import nextstate.train.local")
    assert "verl.trainer.ppo.core_algos" in modules   # the filter has something to keep out
    assert [line for line in other if "warning" in line.lower() or "accelerator" in line.lower()] == []
