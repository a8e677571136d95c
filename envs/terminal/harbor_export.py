"""Terminal tasks written as Harbor task directories (``python -m envs export-harbor terminal``).

Each task becomes ``OUT/<id>/``, in the layout :func:`envs.terminal.formats.load_terminal_tasks`
reads back and Harbor's harness runs:

* ``task.toml``: ``[task]`` ``name`` (``nextstate/<id>``) and ``keywords``; ``[metadata]``
  (difficulty, category, tags); ``[agent]`` / ``[verifier]`` ``timeout_sec`` and ``user`` (the
  task's user: ``agent`` for nextstate's own tasks); ``[verifier]`` ``env``; ``[environment]``
  limits (``memory_mb``, ``cpus``, ``storage_mb``) where the task sets them;
* ``instruction.md``;
* ``environment/``: the task's own build context (its Dockerfile on ``nextstate/terminal``), or a
  Dockerfile ``FROM`` the sandbox image; a procedural task's ``setup`` as a ``RUN`` line; and
  ``/solution`` made writable by a task user other than root (Harbor copies it in as root; nextstate's
  oracle writes it as the task's user);
* ``tests/``: the task's tests, its ``run-tests.sh`` (with the harness scripts it names), and a
  ``test.sh`` that runs it and writes ``/logs/verifier/reward.txt``: the fraction of tests pytest's
  ``-rA`` summary passed (nextstate scores ``2 * passed/total - 1``; Harbor's reward ``r`` reads
  back as ``2r - 1``, the same);
* ``solution/solve.sh``: the reference solution (``solution.sh`` as it is; otherwise the oracle's
  actions as shell lines).
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path
from typing import Any

from nextstate.envs.base import Task
from nextstate.envs.terminal.env import DEFAULT_TEST_TIMEOUT, REWARD_DIR, TerminalEnv, _harness_files
from nextstate.envs.terminal.formats import DEFAULT_RUN_TESTS

SANDBOX_IMAGE = "nextstate/terminal:latest"
SANDBOX_USER = "agent"            # the user of the sandbox image (containers/terminal/Dockerfile)
#: The files of a terminal-bench task folder that are not its build context's.
_TASK_FILES = ("task.yaml", "task.toml", "run-tests.sh", "solution.sh", "solution.yaml", "solution", "tests",
               "instruction.md", "docker-compose.yaml")
TEST_SH = f"""#!/bin/bash
# Harbor's verifier entry (written by nextstate's export-harbor): run the task's run-tests.sh, then
# write the reward: the fraction of the tests in pytest's last -rA summary that passed.
export TEST_DIR="${{TEST_DIR:-/tests}}"
mkdir -p {REWARD_DIR}
log=$(mktemp)
bash --noprofile --norc "$TEST_DIR/run-tests.sh" > "$log" 2>&1
rc=$?
cat "$log"
tac "$log" | sed '/short test summary info/q' | awk '
  /^(PASSED|FAILED|ERROR) +/ {{ if ($1 == "PASSED") {{ if (!($2 in s)) s[$2] = 1 }} else s[$2] = 0 }}
  END {{ t = 0; p = 0; for (n in s) {{ t++; p += s[n] }}; if (t) printf "%g\\n", p / t; else print 0 }}' \\
  > {REWARD_DIR}/reward.txt
exit $rc
"""


def export_tasks(tasks: list[Task], out: str | Path) -> list[Path]:
    """Write ``tasks`` as Harbor task directories under ``out``; returns them. A task that cannot
    be written (a multi-container task, one without a reference solution) raises ``ValueError``."""
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    return [export_task(task, dest / _slug(task.id)) for task in tasks]


def export_task(task: Task, d: Path) -> Path:
    """One task as the Harbor task directory ``d`` (replaced if it exists)."""
    if task.data.get("services"):
        raise ValueError(f"task {task.id}: multi-container tasks are not exported")
    if d.exists():
        shutil.rmtree(d)
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    user = str(task.data.get("user") or SANDBOX_USER)
    (d / "task.toml").write_text(task_toml(task, user))
    (d / "instruction.md").write_text(task.instruction.rstrip() + "\n")
    _environment(task, d / "environment", user)
    _tests(task, d / "tests")
    (d / "solution" / "solve.sh").write_text(solve_sh(task))
    return d


def task_toml(task: Task, user: str) -> str:
    """``task.toml`` of ``task`` (Harbor's schema 1.x)."""
    data = task.data
    lines = ['schema_version = "1.1"', "", "[task]", f"name = {_q('nextstate/' + _slug(task.id))}"]
    tags = [str(t) for t in data.get("tags") or []]
    lines += [f"keywords = [{', '.join(map(_q, tags))}]", "", "[metadata]", 'source = "nextstate"']
    for key, value in (("difficulty", data.get("difficulty")), ("category", task.category)):
        if value:
            lines.append(f"{key} = {_q(str(value))}")
    if tags:
        lines.append(f"tags = [{', '.join(map(_q, tags))}]")
    lines += ["", "[agent]", f"timeout_sec = {float(data.get('max_agent_timeout_sec') or 600):g}",
              f"user = {_q(user)}", "", "[verifier]",
              f"timeout_sec = {float(data.get('max_test_timeout_sec') or DEFAULT_TEST_TIMEOUT):g}",
              f"user = {_q(str(data.get('verifier_user') or user))}"]
    env = data.get("verifier_env") or {}
    if env:
        lines.append("env = { " + ", ".join(f"{_q(str(k))} = {_q(str(v))}" for k, v in env.items()) + " }")
    lines += ["", "[environment]"]
    if data.get("build_timeout"):
        lines.append(f"build_timeout_sec = {float(data['build_timeout']):g}")
    for key, name in (("memory", "memory_mb"), ("disk", "storage_mb")):
        if data.get(key):
            lines.append(f"{name} = {_megabytes(str(data[key]))}")
    if data.get("cpus"):
        lines.append(f"cpus = {float(data['cpus']):g}")
    if data.get("network"):
        lines.append('network_mode = "public"')
    return "\n".join(lines) + "\n"


def _environment(task: Task, env_dir: Path, user: str) -> None:
    """``environment/``: the task's build context, or a Dockerfile on the sandbox image."""
    build, ref = task.data.get("build"), task.data.get("image_ref")
    if build:
        context = Path(build["context"])
        # a context that is the task's own folder leaves out what the agent must not see
        hidden = shutil.ignore_patterns(*_TASK_FILES) if str(context) == task.data.get("dir") else None
        shutil.copytree(context, env_dir, dirs_exist_ok=True, ignore=hidden)
        named = build.get("dockerfile")
        if named and named != "Dockerfile":
            shutil.move(env_dir / named, env_dir / "Dockerfile")
        dockerfile = (env_dir / "Dockerfile").read_text().rstrip("\n")
    else:
        dockerfile = f"FROM {ref or SANDBOX_IMAGE}"
    if task.data.get("setup"):
        dockerfile += f"\nRUN {task.data['setup']}"
    if user != "root":
        dockerfile += (f"\nUSER root\nRUN install -d -o {shlex.quote(user)} -g {shlex.quote(user)} /solution"
                       f"\nUSER {shlex.quote(user)}")
    (env_dir / "Dockerfile").write_text(dockerfile + "\n")


def _tests(task: Task, tests_dir: Path) -> None:
    """``tests/``: the task's tests, ``run-tests.sh`` and the harness scripts it names, ``test.sh``."""
    d = task.data.get("dir")
    if d and (Path(d) / "tests").is_dir():
        shutil.copytree(Path(d) / "tests", tests_dir, dirs_exist_ok=True)
    for name, text in (task.data.get("tests") or {}).items():
        (tests_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (tests_dir / name).write_text(text)
    for name, source in _harness_files(task).items():
        (tests_dir / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, tests_dir / name)
    (tests_dir / "run-tests.sh").write_text(task.data.get("run_tests") or DEFAULT_RUN_TESTS)
    (tests_dir / "test.sh").write_text(TEST_SH)


def solve_sh(task: Task) -> str:
    """``solve.sh``: the task's ``solution.sh`` as it is, else its oracle's actions as shell."""
    if task.data.get("solution") and not task.data.get("solution_dir"):
        return task.data["solution"]
    actions = TerminalEnv.oracle_actions(TerminalEnv.__new__(TerminalEnv), task, "gold")
    return "#!/bin/bash\n# The reference solution's actions, as nextstate's oracle plays them.\n" + "".join(
        _shell(a) + "\n" for a in actions if a["name"] != "finish")


def _shell(action: dict[str, Any]) -> str:
    args = action.get("arguments") or {}
    if action["name"] == "bash":
        return str(args["command"])
    if action["name"] == "write_file":
        path = shlex.quote(str(args["path"]))
        return f'mkdir -p "$(dirname {path})" && printf %s {shlex.quote(str(args["content"]))} > {path}'
    raise ValueError(f"the oracle's action {action['name']!r} has no shell form")


def _slug(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", task_id).strip("-.") or "task"


def _q(text: str) -> str:
    """A TOML basic string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _megabytes(size: str) -> int:
    """A Docker size (``"2048m"``, ``"4g"``) in megabytes."""
    found = re.fullmatch(r"(\d+)([kmgt]?)", size.strip().lower())
    if not found:
        raise ValueError(f"{size!r} is not a size such as '4g' or '512m'")
    scale = {"k": 1 / 1024, "": 1 / 2 ** 20, "m": 1, "g": 1024, "t": 2 ** 20}[found.group(2)]
    return max(1, int(int(found.group(1)) * scale))
