"""Terminal tasks: a shell in a sandbox, graded by the task's hidden tests.

Task directories of two formats load as written:

* **terminal-bench**: ``task.yaml`` (``instruction``, ``difficulty``,
  ``category``, ``tags``, ``max_agent_timeout_sec``, ``max_test_timeout_sec``,
  optional ``network`` (a task on terminal-bench's own images has it unless it says ``false``, as
  terminal-bench's harness gives it; nextstate's own tasks have none unless they ask), ``user`` and
  ``parser_name``: ``swebench`` grades with :func:`~envs.terminal.env.swebench_verdict`, any other
  with pytest's summary), a ``Dockerfile`` or a
  ``docker-compose.yaml`` (the agent's service: its build context, Dockerfile,
  environment and user), ``run-tests.sh``, ``tests/`` and ``solution.sh`` or
  ``solution.yaml`` (commands typed into a tmux pane).
* **Harbor** (terminal-bench 2.0): ``task.toml`` (``schema_version`` or
  ``version`` 1.x; ``[task]`` ``name``, ``keywords``; ``[agent]``/``[verifier]``
  ``timeout_sec`` and ``user``; ``[verifier]`` ``env``; ``[environment]``
  ``network_mode`` (``public`` by default, as Harbor's; or the older ``allow_internet``),
  ``memory_mb``, ``cpus``, ``gpus``, ``storage_mb`` (the sandbox's disk limit),
  ``build_timeout_sec``, ``docker_image`` (a prebuilt image), ``workdir`` (the sandbox's
  working directory)), ``instruction.md``,
  ``environment/`` (``Dockerfile`` or ``docker-compose.yaml`` with a ``main``
  service), ``tests/test.sh`` (writes ``/logs/verifier/reward.txt`` or
  ``reward.json``) and ``solution/solve.sh``.

nextstate's own tasks (the built-in set) are terminal-bench tasks whose
Dockerfile, if any, builds on ``ARG BASE=nextstate/terminal:latest`` /
``FROM ${BASE}``.

Images are built on first use; ``FROM`` references that cannot be pulled here
(``ghcr.io/laude-institute/t-bench/*``) are mapped to local images by
``containers/base-images.yaml``; a SWE-bench instance image
(``swebench/sweb.eval.*``) is built here from the task's row by ``build-swe``
(:func:`envs.swe.images.swebench_base`). Harbor tasks and tasks with an image of their
own (not built on ``${BASE}``) run as root, as terminal-bench and Harbor run
them; the others run as the sandbox's ``agent``; ``user`` in the task file (or
the compose service) and the env's ``user`` argument (which wins) say
otherwise. The tests enter the sandbox only at grading time, at ``/tests``
(``TEST_DIR``), and run as the task's user. A ``run-tests.sh`` that names
terminal-bench's harness scripts (``setup-uv-pytest.sh``, ``run-uv-pytest.sh``)
gets nextstate's offline versions of them (``harness/``) in ``TEST_DIR``
unless the task's ``tests/`` has its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import tomllib
from pathlib import Path
from typing import Any

import yaml

from nextstate.envs.base import Task, read_rows

BUILTIN_TASKS = Path(__file__).parent / "tasks"
TEST_DIR = "/tests"
DEFAULT_RUN_TESTS = '#!/bin/bash\npython3 -m pytest "$TEST_DIR" -rA\n'
#: nextstate's offline versions of the scripts terminal-bench's harness puts in ``$TEST_DIR``.
HARNESS_DIR = Path(__file__).parent / "harness"
HARNESS_SCRIPTS = ("setup-uv-pytest.sh", "run-uv-pytest.sh")
_YAML_FIELDS = ("difficulty", "tags", "max_agent_timeout_sec", "max_test_timeout_sec", "network", "user",
                "parser_name")
# docker-compose variables terminal-bench and Harbor set, as this environment lays the sandbox out.
_COMPOSE_VARS = {"T_BENCH_TEST_DIR": TEST_DIR, "T_BENCH_CONTAINER_LOGS_PATH": "/logs",
                 "T_BENCH_CONTAINER_AGENT_LOGS_PATH": "/agent-logs"}
_build_lock = threading.Lock()
_built: dict[str, tuple[str, str] | Exception] = {}



# -- loading -----------------------------------------------------------------------------
def is_task_dir(d: Path) -> bool:
    """Whether ``d`` is a terminal-bench (``task.yaml``) or Harbor (``task.toml``) task."""
    return (d / "task.yaml").is_file() or (d / "task.toml").is_file()


def load_terminal_tasks(path: str | os.PathLike[str],
                        broken: list[tuple[str, str]] | None = None) -> list[Task]:
    """Tasks from a task directory, a directory of them, or a JSONL/parquet index.

    Index rows either point to a task directory (``path``, relative to the
    index file) or embed the task: ``id``, ``instruction``, ``tests``
    (``{file name: text}``, or the text of ``test_outputs.py``), and
    optionally ``run_tests``, ``solution`` and the ``task.yaml`` fields.
    With ``broken``, a task directory that cannot be read is appended to it as
    ``(name, reason)`` instead of raising.
    """
    path = Path(path)
    if path.is_file():
        return [_task_from_row(row, path.parent, f"{path}:{i + 1}")
                for i, row in enumerate(read_rows(path))]
    if is_task_dir(path):
        dirs = [path]
    elif path.is_dir():
        dirs = [d for d in sorted(path.iterdir()) if is_task_dir(d)]
    else:
        raise FileNotFoundError(f"no terminal tasks at {path}")
    tasks = []
    for d in dirs:
        try:
            tasks.append(_task_from_dir(d))
        except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError, tomllib.TOMLDecodeError) as e:
            if broken is None:
                raise
            broken.append((d.name, f"{type(e).__name__}: {e}"))
    return tasks


def _task_from_dir(d: Path) -> Task:
    d = d.resolve()
    data: dict[str, Any] = {"dir": str(d), "tests": {}, "build": None, "image_ref": None, "env": {},
                            "services": [], "solution": None, "solution_keys": None}
    if (d / "task.toml").is_file() and not (d / "task.yaml").is_file():
        data["user"] = "root"  # as Harbor runs its tasks
        return _harbor_task(d, data)
    meta = yaml.safe_load((d / "task.yaml").read_text()) or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{d / 'task.yaml'} is not a mapping")
    instruction = meta.get("instruction") or next(
        (x.get("description") for x in meta.get("descriptions") or []), None)
    if not instruction:
        raise ValueError(f"{d / 'task.yaml'} has no instruction")
    data["format"] = "terminal-bench"
    _environment(d, data)
    if data["image_ref"] or (data["build"] and not _builds_on_base_arg(data["build"])):
        # terminal-bench's images (not ours: `ARG BASE=nextstate/...`) run as root, with the network its
        # harness gives every task (its compose services are on a bridge network)
        data.update(user="root", network=True)
    data.update({k: meta[k] for k in _YAML_FIELDS if meta.get(k) is not None})
    run_tests = d / "run-tests.sh"
    data["run_tests"] = run_tests.read_text() if run_tests.is_file() else DEFAULT_RUN_TESTS
    if (d / "solution.sh").is_file():
        data["solution"] = (d / "solution.sh").read_text()
    elif (d / "solution.yaml").is_file():
        data["solution_keys"] = _solution_yaml(d / "solution.yaml")
    return Task(d.name, str(instruction).strip(), data, str(meta.get("category", "")))


def _harbor_task(d: Path, data: dict[str, Any]) -> Task:
    meta = tomllib.loads((d / "task.toml").read_text())
    schema = str(meta.get("schema_version") or meta.get("version") or "1.0")
    if not re.fullmatch(r"1(\.\d+)*", schema):
        raise ValueError(f"task.toml: schema_version {schema!r} is not read here (Harbor's 1.x is)")
    if not (d / "instruction.md").is_file():
        raise ValueError(f"{d} has task.toml but no instruction.md")
    instruction = (d / "instruction.md").read_text().strip()
    about, head = meta.get("metadata") or {}, meta.get("task") or {}
    agent, verifier, env = meta.get("agent") or {}, meta.get("verifier") or {}, meta.get("environment") or {}
    data["format"] = "harbor"
    fields = {"difficulty": about.get("difficulty"), "tags": about.get("tags") or head.get("keywords"),
              "harbor_name": head.get("name"),
              "max_agent_timeout_sec": agent.get("timeout_sec"),
              "max_test_timeout_sec": verifier.get("timeout_sec"),
              "network": harbor_network(env),
              "user": agent.get("user") or meta.get("user") or env.get("user"),
              "verifier_user": verifier.get("user"),
              "memory": f"{int(env['memory_mb'])}m" if env.get("memory_mb") else _size(env.get("memory")),
              "cpus": float(env["cpus"]) if env.get("cpus") else None,
              "gpus": int(env["gpus"]) if env.get("gpus") else None,
              "disk": f"{int(env['storage_mb'])}m" if env.get("storage_mb") else _size(env.get("storage")),
              "build_timeout": float(env["build_timeout_sec"]) if env.get("build_timeout_sec") else None,
              "workdir": env.get("workdir"),
              "verifier_env": verifier.get("env") or {}}
    # Harbor's compose variables (its own spelling; terminal-bench's are in _COMPOSE_VARS too).
    harbor_vars = {"ENV_VERIFIER_LOGS_PATH": "/logs/verifier", "ENV_AGENT_LOGS_PATH": "/logs/agent",
                   "CPUS": str(env.get("cpus") or 1), "MEMORY": fields["memory"] or "2048m"}
    _environment(d / "environment", data, service="main", extra_vars=harbor_vars)
    if env.get("docker_image"):  # a prebuilt image, used as Harbor uses it (no build)
        data.update(build=None, image_ref=str(env["docker_image"]))
    data.update({k: v for k, v in fields.items() if v is not None})
    test_sh = d / "tests" / "test.sh"
    data["run_tests"] = test_sh.read_text() if test_sh.is_file() else None
    solution = d / "solution"
    if (solution / "solve.sh").is_file():
        data["solution"] = (solution / "solve.sh").read_text()
        data["solution_dir"] = str(solution)
    return Task(d.name, instruction, data, str(about.get("category", "")))


def _size(value: Any) -> str | None:
    """Harbor's older ``memory``/``storage`` sizes (``"4G"``, ``"512M"``) as Docker sizes (``"4g"``)."""
    if value is None:
        return None
    found = re.fullmatch(r"\s*(\d+)\s*([KMGT])i?B?\s*", str(value), re.I)
    if not found:
        raise ValueError(f"task.toml: {value!r} is not a size such as '4G' or '512M'")
    return f"{found.group(1)}{found.group(2).lower()}"


def _environment(d: Path, data: dict[str, Any], service: str | None = None,
                 extra_vars: dict[str, str] | None = None) -> None:
    """The image of a task from its directory: a docker-compose.yaml's agent service (``service``,
    which must be there; else ``client``, ``main`` or the first), else a Dockerfile."""
    compose = d / "docker-compose.yaml" if (d / "docker-compose.yaml").is_file() else None
    if compose is None:
        if (d / "Dockerfile").is_file():
            data["build"] = {"context": str(d), "dockerfile": None}
        return
    spec = yaml.safe_load(compose.read_text()) or {}
    services = spec.get("services") or {}
    if not isinstance(services, dict) or not services:
        raise ValueError(f"{compose} has no services")
    if service is not None and service not in services:
        raise ValueError(f"{compose} has no {service!r} service, the one the agent works in "
                         f"(it has {', '.join(map(str, services))})")
    name = service or next((n for n in ("client", "main") if n in services), next(iter(services)))
    svc = _substitute(services[name] or {}, {**_COMPOSE_VARS, **(extra_vars or {}), "CONTEXT_DIR": str(d)})
    build = svc.get("build")
    if isinstance(build, str):
        build = {"context": build}
    if isinstance(build, dict):
        context = (d / (build.get("context") or ".")).resolve()
        data["build"] = {"context": str(context), "dockerfile": build.get("dockerfile")}
    elif svc.get("image"):
        data["image_ref"] = svc["image"]
    elif (d / "Dockerfile").is_file():
        data["build"] = {"context": str(d), "dockerfile": None}
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in map(str, env))
    data["env"] = {str(k): str(v) for k, v in env.items() if v not in (None, "")}
    if svc.get("user") is not None:
        data["user"] = str(svc["user"])
    data["services"] = [n for n in services if n != name]
    data["service"] = name


def harbor_network(environment: dict[str, Any]) -> bool:
    """Whether a Harbor task's sandbox has the network: ``[environment]`` ``network_mode`` (``public``, the
    default, or ``allowlist``, whose list is not enforced here: the whole network; ``no-network``: none), else
    the older ``allow_internet``."""
    mode = environment.get("network_mode")
    if mode is None:
        return bool(environment.get("allow_internet", True))
    if mode not in ("public", "allowlist", "no-network"):
        raise ValueError(f"task.toml: [environment] network_mode {mode!r} is not public, allowlist or no-network")
    return mode != "no-network"


def _builds_on_base_arg(build: dict[str, Any]) -> bool:
    """Whether a task's Dockerfile builds on nextstate's image (``ARG BASE`` / ``FROM ${BASE}``)."""
    text = (Path(build["context"]) / (build.get("dockerfile") or "Dockerfile")).read_text()
    return re.search(r"^\s*FROM\s+\$\{?BASE\b", text, re.M | re.I) is not None


def _substitute(value: Any, known: dict[str, str]) -> Any:
    """``${VAR}`` / ``${VAR:-default}`` in a compose value: ``known``, else the default, else ''."""
    if isinstance(value, dict):
        return {k: _substitute(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, known) for v in value]
    if not isinstance(value, str):
        return value
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: known.get(m.group(1), m.group(2) or ""), value)


def _solution_yaml(path: Path) -> list[dict[str, Any]]:
    """terminal-bench's ``solution.yaml``: a list of ``command`` (keystrokes), ``block``,
    ``append_enter``, ``min_timeout_sec``, ``max_timeout_sec``."""
    steps = yaml.safe_load(path.read_text()) or []
    if not isinstance(steps, list) or not all(isinstance(s, dict) and "command" in s for s in steps):
        raise ValueError(f"{path}: expected a list of {{command: ...}} entries")
    return [{"command": str(s["command"]), "block": bool(s.get("block", False)),
             "append_enter": bool(s.get("append_enter", True)),
             "min_timeout_sec": float(s.get("min_timeout_sec") or 0.1),
             "max_timeout_sec": float(s.get("max_timeout_sec") or 180.0)} for s in steps]


def _task_from_row(row: dict[str, Any], base: Path, where: str) -> Task:
    ref = row.get("path") or row.get("task_dir")
    if ref:
        task = _task_from_dir((base / ref).resolve())
        task.id = str(row.get("id") or task.id)
        return task
    task_id, instruction = row.get("id") or row.get("task_id"), row.get("instruction")
    if not task_id or not instruction:
        raise ValueError(f"{where}: a row needs `path`, or `id` and `instruction`")
    tests = row.get("tests") or {}
    if isinstance(tests, str):
        tests = {"test_outputs.py": tests}
    data = {k: row[k] for k in _YAML_FIELDS if row.get(k) is not None}
    data.update(format="terminal-bench", dir=None, build=None, image_ref=None, env={}, services=[],
                tests=dict(tests), run_tests=row.get("run_tests") or DEFAULT_RUN_TESTS,
                solution=row.get("solution"), solution_keys=None)
    return Task(str(task_id), str(instruction).strip(), data, str(row.get("category") or ""))


def task_image(task: Task) -> tuple[str, str] | None:
    """``(image, its working directory)`` of a task with its own image (built once per
    process; a failed build fails again without retrying), else None."""
    build, ref = task.data.get("build"), task.data.get("image_ref")
    if not build and not ref:
        return None
    from nextstate import containers
    from nextstate.containers.build import known_name, local_base
    key = json.dumps([build, ref])
    with _build_lock:
        if key not in _built:
            try:
                if build:
                    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
                    slug = re.sub(r"[^a-z0-9_.-]+", "-", task.id.lower()).strip("-.") or "task"
                    image = containers.build_image(build["context"], f"nextstate/task-{slug}-{digest}:latest",
                                                   dockerfile=build.get("dockerfile"),
                                                   timeout=task.data.get("build_timeout"))
                else:
                    local = local_base(ref) or ref
                    image = containers.ensure_image(name) if (name := known_name(local)) else local
                config = containers.connect().api.inspect_image(image).get("Config") or {}
                _built[key] = (image, config.get("WorkingDir") or "")
            except Exception as e:  # noqa: BLE001 -- remembered, raised for every episode of the task
                _built[key] = e
        found = _built[key]
    if isinstance(found, Exception):
        raise found
    return found
