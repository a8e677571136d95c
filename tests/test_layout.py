"""The house rules of the layout: imports flow one way down the floors (the sandbox runtime
``containers`` -> ``envs`` -> ``agents`` -> ``judges`` -> ``train`` -> ``bench``), no two modules
need each other, and the imports users already write keep working."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ["containers", "envs", "agents", "judges", "train", "bench"]


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


def test_no_import_runs_up_a_floor():
    floor = {top: i for i, top in enumerate(FLOORS)}
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                    if floor[b.split(".")[0]] > floor[a.split(".")[0]])
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
    assert "containers.disks" in GRAPH["containers.sandbox"]          # imported inside a method
    assert "envs.terminal.procedural" in GRAPH["agents.tiny"]          # inside a function


@pytest.mark.parametrize("statement", [
    "from envs.pool import SandboxPool, EnvCache, PoolTimeout",
    "from envs.sandbox import Sandbox, SandboxSpec, CommandResult",
    "from envs.terminal import TerminalEnv, load_terminal_tasks",
    "from envs.toolcall import ToolCallEnv",
    "from envs.swe import SWEEnv",
    "from envs.gui import GUIEnv",
    "from containers import reap, owner_labels, ensure_image",
    "from containers.pool import SandboxPool",
    "from agents import make_policy",
])
def test_public_imports_keep_working(statement):
    exec(statement, {})


def test_the_gymnasium_ids_are_registered_by_importing_envs():
    import gymnasium

    import envs  # noqa: F401

    for family, cls in [("Terminal", "envs.terminal.env:TerminalEnv"), ("ToolCall", "envs.toolcall.env:ToolCallEnv"),
                        ("SWE", "envs.swe.env:SWEEnv"), ("GUI", "envs.gui.env:GUIEnv")]:
        assert gymnasium.spec(f"nextstate/{family}-v0").entry_point == cls
        module, _, attr = cls.partition(":")
        assert hasattr(importlib.import_module(module), attr)


def test_containers_cli_takes_build_swe_from_the_swe_family():
    """``python -m containers build-swe`` comes from the ``nextstate.containers`` entry point."""
    from importlib.metadata import entry_points

    (command,) = [e for e in entry_points(group="nextstate.containers") if e.name == "build-swe"]
    assert command.value == "envs.swe.images:add_command"
