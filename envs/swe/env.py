"""SWE tasks: resolve a repository's issue with a shell and a file editor, graded like SWE-bench.

Each episode gets the instance's repository at its base commit in
``/testbed`` (see :mod:`envs.swe.instances`). The tools are ``bash`` (a
persistent shell), ``str_replace_editor`` (:mod:`envs.swe.editor`, run inside
the sandbox) and ``submit``. At submit or truncation the episode's patch is
``git diff`` of ``/testbed`` (untracked files included) against the base
commit, and :func:`envs.swe.grading.grade` grades it in a fresh container:
+1 when resolved, -1 otherwise (an empty patch is not graded). The per-test
report goes into ``info["outcome"]``.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

from nextstate.envs.actions import ToolCall, tool_schema
from nextstate.envs.base import NextStateEnv, Outcome, Task, ToolResult
from nextstate.containers.protocol import SandboxError
from nextstate.envs.swe.grading import Grade, grade, summary
from nextstate.envs.swe.specs import ACTIVATE, CONDA, ENV_NAME
from nextstate.envs.swe.instances import (OFFLINE_IMAGE, TESTBED, InstanceError, checkout_command, ensure_image,
                                harness_image, is_offline, load_instances, sandbox_user)
from nextstate.envs.validate import check_oracles

EDITOR_SOURCE = Path(__file__).with_name("editor.py").read_text()
EDITOR_COMMANDS = ["view", "create", "str_replace", "insert", "undo_edit"]
DIFF_FILE = "/tmp/nextstate-model.patch"
MAX_PATCH_BYTES = 5 << 20
SUBMIT = {"name": "submit", "arguments": {}}

INSTRUCTION = """\
The repository {repo} is checked out at {testbed} (commit {commit}). Resolve the issue below \
by changing the repository's source files. Hidden tests will check your change; do not \
modify the existing tests.

<issue>
{issue}
</issue>
{hints}
Use `bash` to explore and run code (a persistent shell that starts in {testbed}{env}) and \
`str_replace_editor` to view and edit files.{tests} Call `submit` when you are done: the diff of \
{testbed} against the base commit is what gets graded."""


def instance_task(instance: dict[str, Any], show_hints: bool = False) -> Task:
    """The task for one SWE-bench instance (``data`` holds the whole instance)."""
    hints = instance.get("hints_text") or ""
    hint_block = f"\n<hints>\n{hints.strip()}\n</hints>\n" if show_hints and hints.strip() else ""
    test_cmd = test_command(instance)
    env = "" if is_offline(instance) else f", with the repository's Python env `{ENV_NAME}` activated"
    tests = (f" The repository's tests run with `{test_cmd}` (add test files or node ids to narrow it)."
             if test_cmd else "")
    text = INSTRUCTION.format(repo=instance["repo"], testbed=TESTBED, commit=instance["base_commit"][:12],
                              issue=instance["problem_statement"].strip(), hints=hint_block, env=env,
                              tests=tests)
    return Task(instance["instance_id"], text, dict(instance), category=instance["repo"])


def test_command(instance: dict[str, Any]) -> str | None:
    """The test command of the instance's eval script (the line after swebench's start marker), files dropped."""
    from swebench.harness.constants import START_TEST_OUTPUT

    lines = (instance.get("eval_script") or "").splitlines()
    for i, line in enumerate(lines[:-1]):
        if START_TEST_OUTPUT in line:
            words = lines[i + 1].split()
            kept = [w for w in words if not ("/" in w or w.endswith(".py") or "::" in w)]
            return " ".join(kept) or None
    return None


def cap(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its start and its end."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters omitted ...]\n{text[-half:]}"


class SWEEnv(NextStateEnv):
    """A repository at its base commit; the diff at ``submit`` (or truncation) is graded by its tests.

    Args (besides :class:`~envs.base.NextStateEnv`'s):
        grade_timeout: seconds the instance's test run may take.
        grader_memory: memory limit of the grading container.
        grade_network: whether the grading container has network (default True, as swebench's
            harness grades: its eval scripts reinstall the repository with pip). A row's own
            ``grade_network`` field overrides it for that instance.
        max_output_chars: observations are cut to this many characters.
        show_hints: include the instance's ``hints_text`` in the instruction.
    """

    family = "swe"
    default_max_steps = 20
    image = OFFLINE_IMAGE
    fresh_sandbox = ("an episode edits the repository, files of the instance's image that a reset cannot "
                     "restore in place: every reset would fail")
    tools = [
        tool_schema("bash", "Run a command in a persistent bash shell (working directory and variables "
                    "persist; it starts in /testbed). Returns its output and exit code.",
                    {"command": ("string", "The command line to run."),
                     "timeout": ("number", "Seconds before the command is killed (optional).")},
                    required=["command"]),
        tool_schema("str_replace_editor", "View, create and edit files. `view` shows a file with line "
                    "numbers (or a directory two levels deep); `create` writes a file; `str_replace` "
                    "replaces `old_str`, which must occur exactly once, with `new_str`; `insert` puts "
                    "`new_str` after line `insert_line`; `undo_edit` reverts the last edit of the file.",
                    {"command": {"type": "string", "enum": EDITOR_COMMANDS, "description": "What to do."},
                     "path": ("string", "File or directory, absolute or relative to /testbed."),
                     "file_text": ("string", "The content of the file (create)."),
                     "old_str": ("string", "The exact text to replace, whitespace included (str_replace)."),
                     "new_str": ("string", "The replacement (str_replace) or the text to insert (insert)."),
                     "insert_line": ("integer", "Insert after this line; 0 inserts at the top (insert)."),
                     "view_range": {"type": "array", "items": {"type": "integer"},
                                    "description": "[first, last] lines to show; last -1 means the end (view)."}},
                    required=["command", "path"]),
        tool_schema("submit", "Submit your change and end the episode; the diff of /testbed against "
                    "the base commit is graded by the hidden tests."),
    ]

    def __init__(self, tasks: Any = None, *, grade_timeout: float = 1800.0, grader_memory: str = "2g",
                 grade_network: bool = True, max_output_chars: int = 16000, show_hints: bool = False, **kwargs: Any):
        self.show_hints = show_hints
        kwargs.setdefault("backend", "docker")
        super().__init__(tasks, **kwargs)
        self.grade_timeout = grade_timeout
        self.grader_memory = grader_memory
        self.grade_network = grade_network
        self.max_output_chars = max_output_chars
        self.submitted = False
        self.start_commit: str | None = None  # HEAD once checked out: the base, or a SWE-bench image's setup commit
        self._run_id = uuid.uuid4().hex[:12]
        self._client: Any = None

    # -- hooks ---------------------------------------------------------------------------------
    def load_tasks(self, source: Any) -> list[Task]:
        if isinstance(source, Task) or (isinstance(source, (list, tuple)) and source
                                        and all(isinstance(t, Task) for t in source)):
            return super().load_tasks(source)
        return [instance_task(row, self.show_hints) for row in load_instances(source)]

    def sandbox_overrides(self, task: Task) -> dict[str, Any]:
        instance = task.data
        image = harness_image(instance)
        ensure_image(image, instance["instance_id"])
        overrides = {"image": image, "user": sandbox_user(instance)}
        if not is_offline(instance):
            overrides["workdir"] = TESTBED
        return overrides

    def start_episode(self, task: Task) -> Any:
        if self.sandbox.backend != "docker":
            raise InstanceError("SWE tasks need Docker sandboxes (their repositories live in images)")
        self.submitted = False
        ready = self.sandbox.run(checkout_command(task.data), timeout=300)
        if not ready.ok:
            raise SandboxError(f"could not check out {task.data['repo']} at "
                               f"{task.data['base_commit'][:12]}: {ready.output[-500:]}")
        head = self.sandbox.run(f"cd {TESTBED} && git rev-parse HEAD", timeout=60)
        self.start_commit = head.output.split()[-1] if head.ok and head.output.split() else None
        if not is_offline(task.data):  # the shell starts inside the instance's env, as SWE-bench's harness does
            self.sandbox.run(f"if [ -f {CONDA}/bin/activate ]; then {ACTIVATE}; fi; cd {TESTBED}", timeout=60)
        return None

    def call_tool(self, call: ToolCall) -> ToolResult:
        args = call.arguments
        if call.name == "submit":
            self.submitted = True
            return ToolResult("Submitted: your change will now be graded.", 0, done=True,
                              extra={"command": "submit"})
        if call.name == "bash":
            command, label = args["command"], args["command"]
            result = self.command_result(self.run(command, args.get("timeout")))
        else:
            payload = base64.b64encode(json.dumps({**args, "root": TESTBED}).encode()).decode()
            source = base64.b64encode(EDITOR_SOURCE.encode()).decode()
            command = (f'printf %s {payload} | base64 -d | '
                       f'python3 -I -S -c "$(printf %s {source} | base64 -d)"')
            label = f"str_replace_editor {args['command']} {args['path']}"
            result = self.command_result(self.sandbox.run(command, timeout=60))
        result.output = cap(result.output, self.max_output_chars)
        result.extra["command"] = label
        return result

    def compute_outcome(self) -> Outcome:
        assert self.task is not None
        instance = self.task.data
        patch, problem = self.model_patch()
        details: dict[str, Any] = {"instance_id": instance["instance_id"], "submitted": self.submitted,
                                   "model_patch": patch}
        if problem or not patch.strip():
            return Outcome(-1.0, {**details, "resolved": False, "reason": problem or "empty patch"})
        result = self.grade_patch(instance, patch)
        return Outcome(1.0 if result.resolved else -1.0, {**details, **result.to_dict()})

    def grade_patch(self, instance: dict[str, Any], patch: str) -> Grade:
        """Grades ``patch`` (``""``: the base commit as it is) for ``instance`` in a fresh container."""
        if self._client is None:
            from nextstate import containers
            self._client = containers.connect()
        run_id = self.pool.run_id if self.pool is not None else self._run_id
        network = instance.get("grade_network", self.grade_network)
        return grade(instance, patch, client=self._client, run_id=run_id, timeout=self.grade_timeout,
                     memory=self.grader_memory, network=bool(network))

    # -- the episode's patch ------------------------------------------------------------------------
    def model_patch(self) -> tuple[str, str | None]:
        """``git diff`` of /testbed against the episode's start (the base commit, or a SWE-bench image's setup
        commit on it, whose edits are the image's, not the agent's), new files included; or why there is none."""
        assert self.task is not None
        base = self.start_commit or self.task.data["base_commit"]
        ran = self.sandbox.run(f"cd {TESTBED} && git add -A && "
                               f"git -c core.quotepath=off diff --text --cached {base} > {DIFF_FILE}",
                               timeout=120)
        if not ran.ok:
            return "", f"could not compute the diff of {TESTBED}: {ran.output[-300:]}"
        raw = self.sandbox.read_file(DIFF_FILE)
        if len(raw) > MAX_PATCH_BYTES:
            return "", f"the patch is {len(raw)} bytes, more than the limit of {MAX_PATCH_BYTES}"
        return raw.decode("utf-8", errors="replace"), None

    def oracle_actions(self, task: Task, kind: str) -> list[dict[str, Any]]:
        """Scripted actions: ``"gold"`` applies the instance's own patch and submits, ``"noop"`` submits."""
        if kind == "noop":
            return [SUBMIT]
        if kind != "gold":
            raise ValueError(f"unknown oracle {kind!r}: use gold or noop")
        patch = task.data["patch"]
        patch += "" if patch.endswith("\n") else "\n"
        apply = f"cd {TESTBED} && git apply --verbose - <<'NEXTSTATE_GOLD_PATCH'\n{patch}NEXTSTATE_GOLD_PATCH"
        return [{"name": "bash", "arguments": {"command": apply}}, SUBMIT]

    def close(self) -> None:
        super().close()
        if self._client is not None:
            self._client.close()
            self._client = None


def check_swe(env: NextStateEnv, task: Task) -> str | None:
    """The gold patch must resolve, an empty one must not, and at the base commit (with the
    test patch) every FAIL_TO_PASS test must fail and every PASS_TO_PASS test pass."""
    assert isinstance(env, SWEEnv)
    reason = check_oracles(env, task)
    if reason:
        return reason
    base = env.grade_patch(task.data, "")
    status = base.tests_status
    if not status:
        return f"the tests do not run at the base commit: {summary(base)}"
    passing = sorted(status["FAIL_TO_PASS"]["success"])
    if passing:
        return f"FAIL_TO_PASS tests already pass at the base commit: {', '.join(passing)}"
    failing = sorted(status["PASS_TO_PASS"]["failure"])
    if failing:
        return f"PASS_TO_PASS tests fail at the base commit: {', '.join(failing)}"
    return None
