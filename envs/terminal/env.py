"""The terminal env: a shell in a sandbox, graded by the task's hidden tests.

The task formats it reads (terminal-bench, Harbor, nextstate's own and the procedural
families) are :mod:`envs.terminal.formats`'s.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import os
import re
import shlex
from pathlib import Path
from typing import Any

from nextstate.containers.protocol import CommandResult, Sandbox, SandboxError
from nextstate.envs.actions import ActionError, ToolCall, tool_schema
from nextstate.envs.base import NextStateEnv, Outcome, Task, ToolResult
from nextstate.envs.terminal import outdir, procedural
from nextstate.envs.terminal.formats import (BUILTIN_TASKS, DEFAULT_RUN_TESTS, HARNESS_DIR, HARNESS_SCRIPTS, TEST_DIR,
                                             load_terminal_tasks, task_image)

FALLBACK_TEST_DIR = "/tmp/tests"  # where the user cannot make /tests
TEST_LOG = "/tmp/test-output.log"
REWARD_DIR = "/logs/verifier"
DEFAULT_TEST_TIMEOUT = 60.0
#: The fallback's own time limit (at least the task's): the task's script may have spent the task's on installing.
FALLBACK_TEST_TIMEOUT = 120.0
TMUX_SESSION = "ns"
ENTER_KEYS = ("Enter", "C-m", "KPEnter")
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR) +(\S+)", re.M)
_TEST_DIR_PREFIX = re.compile(r"^((\.\./)+|/)(tmp/)?tests/")
# A test script line that fetches something (uv, pip, apt, curl): it cannot work offline.
_DOWNLOADS = re.compile(r"^[^#\n]*(\bcurl\b|\bwget\b|\buvx?\b|\bpip3? install|\bapt(-get)? (update|install))",
                        re.M)
# A test runner that is not there: no pytest for python3, or a runner command not found.
_RUNNER_MISSING = re.compile(r"No module named pytest|\b(pytest|py\.test|uvx?|python3?): (command )?not found")
# pip's retries of an index it cannot connect to (they name its path, not its host), and the index it names.
_PIP_UNREACHABLE = re.compile(r"connection broken by '(NewConnectionError|ConnectTimeoutError).*': /\S*simple/")
_PIP_INDEX = re.compile(r"Looking in indexes: https?://([^/:\s,]+)")
#: Shell wildcards (space or comma separated) of the hosts the network lets through, where a proxy filters it
#: and answers for the others itself (an HTTP error, not a failed connection); unset: not filtered.
REACHABLE_HOSTS = "NEXTSTATE_REACHABLE_HOSTS"
# A URL's host on a line that says error (requests' "404 Client Error: Not Found for url: http://HOST/...").
_ERROR_URL_HOST = re.compile(r"^.*error.*?\bhttps?://([A-Za-z0-9.-]+)", re.I | re.M)
# The sandbox's own addresses: a test that cannot reach one found no server the agent was to start.
_LOOPBACK = re.compile(r"(localhost|127\.|0\.0\.0\.0$|::1$|\[::1\])")
# pytest's last line ("3 passed, 1 failed in 0.5s", "no tests ran") or header: the tests ran.
_PYTEST_RAN = r"(^|[ =])[0-9]+ (passed|failed|errors?|skipped)\b.* in [0-9.]+s|no tests ran|test session starts"


# -- grading -------------------------------------------------------------------------------
def parse_pytest_summary(text: str) -> dict[str, str]:
    """``{test id: "passed" | "failed"}`` from pytest's ``-rA`` short summary lines."""
    tests: dict[str, str] = {}
    for status, name in _SUMMARY_LINE.findall(text):
        name = _TEST_DIR_PREFIX.sub("", name)  # pytest names files relative to the workdir
        if status == "PASSED":
            tests.setdefault(name, "passed")
        else:  # FAILED, or ERROR (also a passed test whose teardown failed)
            tests[name] = "failed"
    return tests


@functools.cache
def _registry_unreachable() -> bool:
    """Whether downloads fail here (``NEXTSTATE_OFFLINE``, else a registry probe; once per process)."""
    try:
        from nextstate import containers
        from nextstate.containers.build import is_offline
        return is_offline(containers.connect())
    except Exception:  # noqa: BLE001 -- no engine to ask: assume the worst
        return True


def _harbor_reward(sandbox: Sandbox) -> tuple[float | None, dict[str, Any]]:
    """Harbor's reward: ``reward.txt`` (a number) or ``reward.json`` (``reward``, else the
    mean of its numbers), and the raw values."""
    for name in ("reward.txt", "reward.json"):
        try:
            raw = sandbox.read_file(f"{REWARD_DIR}/{name}").decode(errors="replace").strip()
        except FileNotFoundError:
            continue
        try:
            if name == "reward.txt":
                return float(raw), {"reward_file": name}
            values = json.loads(raw)
            if isinstance(values, (int, float)):
                return float(values), {"reward_file": name}
            numbers = {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}
            value = numbers.get("reward", sum(numbers.values()) / len(numbers) if numbers else None)
            return value, {"reward_file": name, "rewards": numbers}
        except (ValueError, AttributeError, TypeError):
            return None, {"reward_file": name, "reason": f"{name} is not a reward: {raw[:200]!r}"}
    return None, {"reason": f"the tests wrote no {REWARD_DIR}/reward.txt or reward.json"}


def harbor_outcome(reward: float) -> float:
    """Harbor's reward (1 pass, 0 fail, fractions between) as an outcome in [-1, 1]: ``2r - 1``."""
    return max(-1.0, min(1.0, 2.0 * reward - 1.0))


def _fallback_command(sandbox: Sandbox, task: Task) -> tuple[str, str] | None:
    """For a test script that downloads (uv, pip, apt-get, curl) where nothing can be
    downloaded: ``python3 -m pytest $TEST_DIR/test_outputs.py -rA`` and why (else None).
    A Harbor task's fallback writes ``reward.txt`` as test.sh would (1 when pytest passes)."""
    harbor = task.data.get("format") == "harbor"
    script, name = task.data.get("run_tests"), "tests/test.sh" if harbor else "run-tests.sh"
    if script is None:
        why = f"the task has no {name}"
    elif _DOWNLOADS.search(script) and (not sandbox.spec.network or _registry_unreachable()):
        why = f"{name} downloads (uv, pip, apt-get or curl), which cannot work here, and ran no tests"
    else:
        return None
    command = f"python3 -m pytest {'$TEST_DIR/test_outputs.py' if _has_test_outputs(task) else '$TEST_DIR'} -rA"
    why += f": ran `{command}` instead"
    if harbor:
        command += f"; rc=$?; [ $rc = 0 ] && r=1 || r=0; echo $r > {REWARD_DIR}/reward.txt; exit $rc"
    return command, why


_SWEBENCH_VERDICT = re.compile(r"SWEBench results starts here\s+(PASSED|FAILED)\s+SWEBench results ends here")


def swebench_verdict(sandbox: Sandbox, task: Task) -> tuple[dict[str, str], dict[str, Any]]:
    """terminal-bench's ``swebench`` parser: ``{instance id: passed | failed}`` from the verdict that the
    task's ``parser.py`` prints, and what the verdict came from. That script needs swebench from the
    package registry (``uv run``), which a sandbox cannot reach; where it printed none, the verdict is
    that of swebench's own log parser and report (the same library and functions), run on this host on
    the test log with the task's row (``tests/config.json``). No row: ``{}``."""
    log = sandbox.read_file(TEST_LOG).decode(errors="replace")
    config = Path(task.data.get("dir") or ".", "tests", "config.json")
    row = json.loads(config.read_text()) if config.is_file() else {}
    name = row.get("instance_id", task.id)
    if said := _SWEBENCH_VERDICT.findall(log):
        return {name: "passed" if said[-1] == "PASSED" else "failed"}, {"verdict_from": "the task's parser.py"}
    if not row:
        return {}, {"reason": "parser.py printed no verdict, and the task has no tests/config.json to grade "
                              "its log with"}
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    from nextstate.envs.swe.grading import log_report
    from nextstate.envs.swe.instances import load_instances, make_test_spec
    spec = make_test_spec(load_instances([row])[0])
    report = log_report(spec, "nextstate", f"{START_TEST_OUTPUT}\n{log}\n{END_TEST_OUTPUT}")
    return ({name: "passed" if report.get("resolved") else "failed"},
            {"verdict_from": "swebench's log parser on this host (parser.py printed no verdict)",
             "swebench_tests": report.get("tests_status", {})})


def _runner_failure(run: CommandResult, log: str) -> str | None:
    """Why the test runner could not start (exit 126/127, or no pytest to run), else None."""
    if run.timed_out:
        return None
    found = _RUNNER_MISSING.search(log)
    if not found and run.exit_code not in (126, 127):
        return None
    said = found.group(0) if found else (log.strip().splitlines() or ["no output"])[-1][-200:]
    return f"the test runner could not start (exit {run.exit_code}: {said})"


def _unreachable_host(log: str) -> str | None:
    """The first host, other than this sandbox's own loopback, that the tests' output says they could
    not reach (a test that needs the internet where there is none: the infrastructure's failure).
    pip's retries name only the index's path: their host is the index pip says it looks in, else PyPI.
    Where ``NEXTSTATE_REACHABLE_HOSTS`` names the hosts the network lets through, an error line that
    names a URL of another host counts too (a filtering proxy answers for such hosts itself)."""
    from nextstate.containers.build import UNREACHABLE_HOST
    for found in re.finditer(UNREACHABLE_HOST, log):
        host = next(g for g in found.groups() if g)
        if not _LOOPBACK.match(host):
            return host
    if _PIP_UNREACHABLE.search(log):
        index = _PIP_INDEX.search(log)
        return index.group(1) if index else "pypi.org"
    reachable = os.environ.get(REACHABLE_HOSTS, "").replace(",", " ").split()
    if reachable:
        for host in _ERROR_URL_HOST.findall(log):
            if not _LOOPBACK.match(host) and not any(fnmatch.fnmatch(host.lower(), p.lower()) for p in reachable):
                return host
    return None


def _has_test_outputs(task: Task) -> bool:
    """Whether the task's tests include ``test_outputs.py``."""
    d = task.data.get("dir")
    return ("test_outputs.py" in task.data.get("tests", {})
            or bool(d and (Path(d) / "tests" / "test_outputs.py").is_file()))


def _harness_files(task: Task) -> dict[str, Path]:
    """``{path under TEST_DIR: file}`` of nextstate's harness scripts a terminal-bench task's
    ``run-tests.sh`` names and its own tests lack (with the offline ``uv`` they put on PATH)."""
    script, d = task.data.get("run_tests") or "", task.data.get("dir")
    own = set(task.data.get("tests", {})) | ({p.name for p in (Path(d) / "tests").iterdir()}
                                             if d and (Path(d) / "tests").is_dir() else set())
    files = {name: HARNESS_DIR / name for name in HARNESS_SCRIPTS if name in script and name not in own}
    if files:
        files[".nextstate-uv/uv"] = HARNESS_DIR / "uv"
    return files


def grade_terminal_task(sandbox: Sandbox, task: Task) -> Outcome:
    """Install the tests at ``/tests`` and run them as the task's user (Harbor's ``[verifier]``
    ``user`` when it names another).

    terminal-bench: ``run-tests.sh`` (with the harness scripts it names: :func:`_harness_files`),
    scored ``2 * passed/total - 1`` from pytest's summary. Harbor: ``tests/test.sh``, scored from
    the reward it writes (:func:`harbor_outcome`).
    """
    data, harbor = task.data, task.data.get("format") == "harbor"
    # A local sandbox is this machine: its /tests and /logs are not the sandbox's to replace. In a
    # container they are emptied, not removed: an image's directory removed and made again could
    # not be restored by a verified reset (:meth:`DockerSandbox.reset`).
    prepare = (f"d={FALLBACK_TEST_DIR}; rm -rf $d; mkdir -p $d" if sandbox.backend == "local" else
               f"mkdir -p {REWARD_DIR}; find {REWARD_DIR} -mindepth 1 -delete; d={TEST_DIR}; "
               f"mkdir -p $d 2>/dev/null && [ -w $d ] && find $d -mindepth 1 -delete 2>/dev/null "
               f"|| {{ d={FALLBACK_TEST_DIR}; rm -rf $d; mkdir -p $d; }}")
    try:
        found = sandbox.run(f"rm -f {TEST_LOG}; {prepare}; echo $d", timeout=30)
        test_dir = (found.stdout.strip().splitlines() or [FALLBACK_TEST_DIR])[-1]
        if data.get("dir") and (Path(data["dir"]) / "tests").is_dir():
            sandbox.copy_in(Path(data["dir"]) / "tests", test_dir)
        for name, text in data.get("tests", {}).items():
            sandbox.write_file(f"{test_dir}/{name}", text)
        if not harbor:
            sandbox.write_file(f"{test_dir}/run-tests.sh", data.get("run_tests") or DEFAULT_RUN_TESTS, 0o755)
            for name, source in _harness_files(task).items():
                sandbox.write_file(f"{test_dir}/{name}", source.read_text(), 0o755)
    except SandboxError as e:
        if not sandbox.is_alive():
            raise
        return Outcome(-1.0, {"reason": f"could not install the tests: {e}", "tests": {}})
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (data.get("verifier_env") or {}).items())
    timeout = float(data.get("max_test_timeout_sec") or DEFAULT_TEST_TIMEOUT)

    as_user = data.get("verifier_user")
    if as_user and as_user != (sandbox.spec.user or "root"):  # Harbor's [verifier] user: the tests' own
        sandbox.run(f"chmod -R a+rwX {REWARD_DIR} {test_dir} 2>/dev/null", timeout=30)
    else:
        as_user = None

    def run_tests(command: str, limit: float) -> CommandResult:
        if as_user:
            command = f"runuser -u {shlex.quote(str(as_user))} -- bash -c {shlex.quote(command)}"
        return sandbox.run(f"(cd {sandbox.spec.workdir} && export TEST_DIR={test_dir} {env} && {command}) "
                           f">{TEST_LOG} 2>&1", timeout=limit)

    def log_tail() -> str:
        """The last 3000 bytes of what the tests printed."""
        return sandbox.run(f"tail -c 3000 {TEST_LOG}", timeout=30).stdout

    script = f"{test_dir}/test.sh" if harbor else f"{test_dir}/run-tests.sh"
    swebench = data.get("parser_name") == "swebench"
    fallback = None if swebench else _fallback_command(sandbox, task)
    run = None
    if data.get("run_tests") is not None:
        run = run_tests(f"bash --noprofile --norc {script}", timeout)
        if fallback and not (run.timed_out or sandbox.run(
                f"grep -qE {shlex.quote(_PYTEST_RAN)} {TEST_LOG}", timeout=30).exit_code):
            fallback = None  # the script ran its tests after all
    script_log = ""   # what the script said before its fallback ran: a host it could not reach
    if fallback:
        if run is not None:
            script_log = log_tail()
        sandbox.run(f"rm -f {REWARD_DIR}/reward.txt {REWARD_DIR}/reward.json", timeout=30)
        timeout = max(timeout, FALLBACK_TEST_TIMEOUT)
        run = run_tests(fallback[0], timeout)
    assert run is not None
    # Only the last summary section counts: output the agent's code printed comes before it.
    summary = sandbox.run(f"tac {TEST_LOG} | sed '/short test summary info/q' | tac", timeout=30)
    tests, extra = swebench_verdict(sandbox, task) if swebench else (parse_pytest_summary(summary.stdout), {})
    passed = sum(v == "passed" for v in tests.values())
    details: dict[str, Any] = {"tests": tests, "passed": passed, "total": len(tests),
                               "exit_code": run.exit_code, "timed_out": run.timed_out, **extra}
    if fallback:
        details["tests_fallback"] = fallback[1]

    def unreachable() -> str | None:
        """A host the tests' output (``details["log_tail"]``), or the script's before its fallback, says
        they could not reach."""
        return _unreachable_host(details["log_tail"] + "\n" + script_log)

    if harbor:
        reward, extra = _harbor_reward(sandbox)
        details.update(extra)
        if reward is None or not math.isfinite(reward):
            details["log_tail"] = log_tail()
            no_reward = details.get("reason") or f"{extra.get('reward_file')} holds no finite reward"
            if run.timed_out:
                details["reason"] = f"the tests timed out after {timeout:g} s: {details.get('reason')}"
            elif host := unreachable():
                details["reason"] = f"the tests could not reach {host} ({no_reward})"
            elif reward is None and (runner := _runner_failure(run, details["log_tail"])):
                details["reason"] = runner
            details.setdefault("reason", no_reward)
            return Outcome(-1.0, details)
        details["harbor_reward"] = reward
        if reward < 1:
            details["log_tail"] = log_tail()
            if host := unreachable():
                details["reason"] = f"the tests could not reach {host} (reward {reward:g})"
        return Outcome(harbor_outcome(reward), details)
    if passed < len(tests) or not tests:
        details["log_tail"] = log_tail()
        if host := unreachable():
            failed = ", ".join(name for name, status in tests.items() if status != "passed")
            details["reason"] = f"the tests could not reach {host}" + (f" (failed: {failed})" if failed else "")
    if not tests:
        why = (f"the tests timed out after {timeout:g} s" if run.timed_out
               else _runner_failure(run, details["log_tail"]) or f"the test script exited with {run.exit_code}")
        details["reason"] = details.get("reason") or f"no pytest results found: {why}"
        return Outcome(-1.0, details)
    return Outcome(2.0 * passed / len(tests) - 1.0, details)


# -- tmux ------------------------------------------------------------------------------------
def _typed(keys: list[str], block: bool) -> list[str]:
    """``keys`` for ``tmux send-keys``; a blocking command line ends ``; tmux wait-for -S ...`` on the same
    line, before its Enter (as terminal-bench's harness types it)."""
    if not block:
        return keys
    while keys and keys[-1] in ENTER_KEYS:
        keys = keys[:-1]
    return [*keys, f"; tmux wait-for -S {TMUX_SESSION}-done", "Enter"]


# The done signal can reach tmux before the command's last output does: once it came, wait (at most 5 s)
# until the screen no longer ends with the typed line.
_SETTLE = (f"i=0; while [ $i -lt 100 ] && tmux capture-pane -p -t {TMUX_SESSION} | grep -v '^ *$' | tail -n 1 "
           f"| grep -q 'wait-for -S {TMUX_SESSION}-done *$'; do sleep 0.05; i=$((i + 1)); done")


def tmux_script(keys: list[str], *, wait: float = 1.0, block: bool = False, timeout: float = 30.0,
                capture: bool = True) -> str:
    """Shell that types ``keys`` into the sandbox's tmux pane (made on first use) and prints the screen.

    Each key is a tmux key name (``Enter``, ``C-c``, ``Escape``, ``Up``...) or literal
    text, as ``tmux send-keys`` takes them. ``block``: the keys are a command line;
    wait until it finishes (at most ``timeout`` s) instead of ``wait`` s.
    """
    s = TMUX_SESSION
    lines = [f"tmux has-session -t {s} 2>/dev/null || tmux new-session -d -s {s} -x 160 -y 48 || exit 1",
             f"tmux send-keys -t {s} -- {' '.join(shlex.quote(k) for k in _typed(keys, block))}",
             f"timeout {timeout:g} tmux wait-for {s}-done && {{ {_SETTLE}; }}" if block else f"sleep {wait:g}"]
    if capture:
        lines.append(f"tmux capture-pane -p -t {s} | sed -e :a -e '/^\\n*$/{{$d;N;ba' -e '}}'")
    return "(\n" + "\n".join(lines) + "\n)"  # a subshell: `exit` must not end the sandbox's shell


def solution_keys_script(steps: list[dict[str, Any]], timeout: float) -> str:
    """Shell that plays terminal-bench's ``solution.yaml`` in the tmux pane within ``timeout`` s: a blocking
    step that does not finish in time (its ``max_timeout_sec`` or what is left) is interrupted with C-c,
    and the steps after it are not typed (exit 124)."""
    s = TMUX_SESSION
    lines = [f"tmux has-session -t {s} 2>/dev/null || tmux new-session -d -s {s} -x 160 -y 48 || exit 1",
             f"end=$((SECONDS + {int(timeout)}))"]
    for i, step in enumerate(steps, 1):
        keys = [step["command"], *(["Enter"] if step["append_enter"] else [])]
        lines.append(f"tmux send-keys -t {s} -- {' '.join(shlex.quote(k) for k in _typed(keys, step['block']))}")
        if step["block"]:
            most = max(1, int(step["max_timeout_sec"]))
            lines.append(f"t=$((end - SECONDS)); [ $t -gt {most} ] && t={most}; [ $t -lt 1 ] && t=1")
            lines.append(f"timeout $t tmux wait-for {s}-done || {{ tmux send-keys -t {s} C-c; "
                         f"echo 'solution.yaml step {i} did not finish in time: interrupted' >&2; exit 124; }}")
            lines.append(_SETTLE)
        else:
            lines.append(f"sleep {step['min_timeout_sec']:g}")
    lines.append(f"tmux capture-pane -p -t {s}")
    return "(\n" + "\n".join(lines) + "\n)"


TMUX_TOOL = tool_schema(
    "tmux", "Type keystrokes into an interactive terminal (a tmux pane, for programs such as vim, "
    "less or a REPL) and return its screen. Each key is literal text or a tmux key name "
    "(Enter, C-c, Escape, Up, Tab...).",
    {"keys": {"type": ["array", "string"], "items": {"type": "string"},
              "description": "The keys to send, in order, e.g. [\"ls -la\", \"Enter\"]."},
     "wait": ("number", "Seconds to wait before reading the screen (default 1)."),
     "block": ("boolean", "The keys are a command line: wait until it finishes (optional).")},
    required=["keys"])


# -- the environment -------------------------------------------------------------------------
class TerminalEnv(NextStateEnv):
    """A persistent shell in a sandbox; ``finish`` (or the step limit) runs the hidden tests.

    Args (besides :class:`~envs.base.NextStateEnv`'s):
        user: run every task as this user (default: the task's, see the module doc).
        tmux: also offer the ``tmux`` tool (keystrokes into a tmux pane, the screen back),
            the way terminal-bench's Terminus agent acts.
        network: give a task's sandbox the network its format gives it (terminal-bench's images and
            Harbor's ``public`` tasks have it); False: no sandbox has it (``env.network=none``).
    """

    family = "terminal"
    default_max_steps = 10
    tools = [
        tool_schema("bash", "Run a command in a persistent bash shell (the working directory and "
                    "variables persist). Returns its output and exit code.",
                    {"command": ("string", "The command line to run."),
                     "timeout": ("number", "Seconds before the command is killed (optional).")},
                    required=["command"]),
        tool_schema("write_file", "Create or overwrite a text file (parent directories are created).",
                    {"path": ("string", "File path, absolute or relative to the current directory."),
                     "content": ("string", "The complete new content of the file.")}),
        tool_schema("finish", "Call this when the task is complete; the result is then checked."),
    ]

    def __init__(self, tasks: Any = None, *, user: str | None = None, tmux: bool = False, network: bool = True,
                 **kwargs: Any):
        self.user, self.network = user, network
        self.broken_tasks: list[tuple[str, str]] = []
        if tmux:
            self.tools = [*type(self).tools[:-1], TMUX_TOOL, type(self).tools[-1]]
        super().__init__(tasks, **kwargs)

    @classmethod
    def load_task_set(cls, source: Any) -> tuple[list[Task], list[tuple[str, str]]]:
        """The tasks of ``source`` that load, and ``(name, reason)`` of those that do not."""
        broken: list[tuple[str, str]] = []
        if procedural.is_procedural(source):
            return procedural.load(source), broken
        if outdir.is_outdir(source):
            return outdir.load(source), broken
        if source is None or isinstance(source, (str, os.PathLike)):
            return load_terminal_tasks(BUILTIN_TASKS if source is None else source, broken), broken
        return NextStateEnv.load_tasks(cls.__new__(cls), source), broken

    def load_tasks(self, source: Any) -> list[Task]:
        tasks, self.broken_tasks = self.load_task_set(source)
        if not tasks and self.broken_tasks:
            name, why = self.broken_tasks[0]
            raise ValueError(f"no task in {source} could be loaded ({len(self.broken_tasks)} broken; "
                             f"{name}: {why})")
        return tasks

    def skip_reason(self, task: Task) -> str | None:
        others = task.data.get("services")
        if others:
            return (f"docker-compose.yaml has services besides {task.data.get('service')!r} "
                    f"({', '.join(others)}); multi-container tasks are not supported")
        if task.data.get("gpus"):
            return f"the task asks for {task.data['gpus']} GPU(s); terminal sandboxes have none"
        return None

    @classmethod
    def has_own_image(cls, task: Task) -> bool:
        return bool(task.data.get("build") or task.data.get("image_ref"))

    def sandbox_overrides(self, task: Task) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        built = task_image(task)
        if built:
            overrides["image"] = built[0]
            if built[1]:
                overrides["workdir"] = built[1]
        if task.data.get("network") and self.network:
            overrides["network"] = True
        user = self.user or task.data.get("user")
        if user:
            overrides["user"] = str(user)
        if task.data.get("env"):
            overrides["env"] = dict(task.data["env"])
        for key in ("memory", "cpus", "disk", "workdir"):
            if task.data.get(key):
                overrides[key] = task.data[key]
        return overrides

    def start_episode(self, task: Task) -> None:
        """Run the task's ``setup`` command, if it has one (procedural tasks do)."""
        if task.data.get("setup"):
            r = self.sandbox.run(task.data["setup"], timeout=30)
            if r.exit_code != 0:
                raise SandboxError(f"setup of task {task.id} failed: {r.output[-500:]}")

    def command_timeout_cap(self) -> float:
        assert self.task is not None
        return float(self.task.data.get("max_agent_timeout_sec") or self.step_timeout)

    def call_tool(self, call: ToolCall) -> ToolResult:
        args = call.arguments
        if call.name == "bash":
            return self.command_result(self.run(args["command"], args.get("timeout")))
        if call.name == "write_file":
            try:
                self.sandbox.write_file(args["path"], args["content"])
            except ValueError as e:   # a path bash cannot hold
                raise ActionError(f"{str(e)[0].upper()}{str(e)[1:]}.") from None
            except SandboxError as e:
                if not self.sandbox.is_alive():
                    raise
                return ToolResult(f"Could not write {args['path']}: {e}", exit_code=1)
            return ToolResult(f"Wrote {len(args['content'].encode())} bytes to {args['path']}.", 0)
        if call.name == "tmux":
            return self._tmux(args)
        return ToolResult("Finished: the result will now be checked.", done=True)

    def _tmux(self, args: dict[str, Any]) -> ToolResult:
        keys = [args["keys"]] if isinstance(args["keys"], str) else [str(k) for k in args["keys"]]
        cap = self.command_timeout_cap()
        wait = min(max(float(args.get("wait") or 1.0), 0.0), cap)
        script = tmux_script(keys, wait=wait, block=bool(args.get("block")), timeout=cap)
        r = self.sandbox.run(script, timeout=cap + 15)
        if r.exit_code != 0 and not r.stdout.strip():
            return ToolResult(f"tmux failed: {r.output.strip()[-500:]}", r.exit_code, timed_out=r.timed_out)
        return ToolResult(r.stdout.rstrip("\n"), timed_out=r.timed_out, extra={"truncated": r.truncated})

    def compute_outcome(self) -> Outcome:
        assert self.task is not None
        return grade_terminal_task(self.sandbox, self.task)

    def oracle_actions(self, task: Task, kind: str) -> list[dict[str, Any]]:
        """gold: run the reference solution (``solution.sh``/``solve.sh`` in the workdir, or
        ``solution.yaml`` typed into tmux), then finish; noop: finish at once."""
        finish = {"name": "finish", "arguments": {}}
        if kind == "noop":
            return [finish]
        if task.data.get("oracle"):
            return list(task.data["oracle"])
        timeout = float(task.data.get("max_agent_timeout_sec") or 600)
        if task.data.get("solution_keys"):
            steps = task.data["solution_keys"]
            budget = min(sum(s["max_timeout_sec"] if s["block"] else s["min_timeout_sec"] for s in steps) + 30,
                         timeout)
            return [{"name": "bash", "arguments": {"command": solution_keys_script(steps, budget),
                                                   "timeout": budget + 15}}, finish]
        if not task.data.get("solution"):
            name = "solution/solve.sh" if task.data.get("format") == "harbor" else "solution.sh or solution.yaml"
            raise ValueError(f"task {task.id} has no {name}")
        actions = []
        if task.data.get("solution_dir"):  # Harbor runs solve.sh from /solution, next to its files
            root = Path(task.data["solution_dir"])
            for f in sorted(p for p in root.rglob("*") if p.is_file()):
                try:
                    content = f.read_text()
                except UnicodeDecodeError:
                    raise ValueError(f"task {task.id}: solution file {f.name} is not text") from None
                actions.append({"name": "write_file",
                                "arguments": {"path": f"/solution/{f.relative_to(root)}", "content": content}})
            run = "bash /solution/solve.sh"
        else:
            actions.append({"name": "write_file",
                            "arguments": {"path": "/tmp/solution.sh", "content": task.data["solution"]}})
            run = "bash /tmp/solution.sh; rc=$?; rm -f /tmp/solution.sh; (exit $rc)"
        return [*actions, {"name": "bash", "arguments": {"command": run, "timeout": timeout}}, finish]
