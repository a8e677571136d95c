"""The house rules of the layout: imports flow one way down the floors (the sandbox runtime
``containers`` -> ``envs`` -> ``agents`` -> ``judges`` -> ``train`` -> ``viewer`` -> ``bench``), no
two modules need each other, and the imports users already write keep working."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ["containers", "envs", "agents", "judges", "train", "viewer", "bench"]


def _modules() -> dict[str, Path]:
    """Every project module (``envs.terminal.env`` -> its file); task data and the files that run
    inside containers (``containers/<image>/``) are not modules of the project."""
    found = {}
    for top in FLOORS:
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "tasks" in rel.parts or (top == "containers" and len(rel.parts) > 2):
                continue
            name = ".".join(rel.with_suffix("").parts)
            if top != "bench":            # bench/ runs from the checkout; the rest is installed as nextstate.*
                name = "nextstate." + name
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports, at the top or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in wanted:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _floor(module: str) -> str:
    return module.removeprefix("nextstate.").split(".")[0]


def test_no_import_runs_up_a_floor():
    floor = {top: i for i, top in enumerate(FLOORS)}
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                    if floor[_floor(b)] > floor[_floor(a)])
    assert upward == []


def test_no_circle_of_modules():
    """Tarjan's strongly connected components: every one must be a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert circles == []


def test_the_graph_sees_imports_inside_functions():
    """The checks above would pass vacuously on a graph that missed lazy imports."""
    assert "nextstate.containers.disks" in GRAPH["nextstate.containers.docker_sandbox"]   # inside a method
    assert "nextstate.envs.terminal.procedural" in GRAPH["nextstate.agents.tiny"]      # inside a function


@pytest.mark.parametrize("statement", [
    "from nextstate.envs.pool import SandboxPool, EnvCache, PoolTimeout",
    "from nextstate.containers.sandbox import Sandbox, SandboxSpec, CommandResult",
    "from nextstate.envs.terminal import TerminalEnv, load_terminal_tasks",
    "from nextstate.envs.toolcall import ToolCallEnv",
    "from nextstate.envs.swe import SWEEnv",
    "from nextstate.envs.gui import GUIEnv",
    "from nextstate.containers import reap, owner_labels, ensure_image",
    "from nextstate.containers.pool import SandboxPool",
    "from nextstate.agents import make_policy",
    "from nextstate.viewer import RunIndex, export, image_ref, main, make_server, to_json",
    "from nextstate.train.proxy import TrainingProxy, ProxyTrainer, make_app, serving",
    "from nextstate.train.wiring import make_envs, make_judge, make_hinter, load_tasks",
])
def test_public_imports_keep_working(statement):
    exec(statement, {})


def test_the_gymnasium_ids_are_registered_by_importing_envs():
    import gymnasium

    from nextstate import envs  # noqa: F401

    for family, cls in [("Terminal", "nextstate.envs.terminal.env:TerminalEnv"),
                        ("ToolCall", "nextstate.envs.toolcall.env:ToolCallEnv"),
                        ("SWE", "nextstate.envs.swe.env:SWEEnv"), ("GUI", "nextstate.envs.gui.env:GUIEnv")]:
        assert gymnasium.spec(f"nextstate/{family}-v0").entry_point == cls
        module, _, attr = cls.partition(":")
        assert hasattr(importlib.import_module(module), attr)


def test_containers_cli_takes_build_swe_from_the_swe_family():
    """``python -m containers build-swe`` comes from the ``nextstate.containers`` entry point."""
    from importlib.metadata import entry_points

    (command,) = [e for e in entry_points(group="nextstate.containers") if e.name == "build-swe"]
    assert command.value == "nextstate.envs.swe.images:add_command"


def test_every_package_folder_is_installed_under_nextstate():
    """pyproject.toml lists the packages by hand (a folder maps to ``nextstate.<folder>``): a new package
    folder left out of the list would be missing from a non-editable install."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    installed = [top for top in FLOORS if top != "bench"] + ["configs"]
    folders = {".".join(("nextstate",) + path.parent.relative_to(ROOT).parts)
               for top in installed for path in (ROOT / top).rglob("__init__.py")
               if "tasks" not in path.parts and not (top == "containers" and len(path.relative_to(ROOT).parts) > 2)}
    assert folders == set(setuptools["packages"])
    assert setuptools["package-dir"] == {f"nextstate.{top}": top for top in installed}
