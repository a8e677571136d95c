"""Grading a patch for a SWE-bench instance in a fresh container.

The grader never reuses the agent's sandbox: it starts a new container of the
instance's image (labelled ``role=grader`` with the run's owner labels, and
always removed), puts the repository at the base commit, applies the patch
with SWE-bench's own fallbacks (``git apply``, ``--3way``, ``--reject``, then
``patch --fuzz``), runs the instance's eval script (which applies the
``test_patch`` and runs the tests) under a timeout, and grades the log with
swebench's parser and report (every FAIL_TO_PASS test must pass and every
PASS_TO_PASS test keep passing).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from nextstate.containers.docker_sandbox import DockerSandbox
from nextstate.containers.protocol import Sandbox, SandboxError, SandboxSpec
from nextstate.envs.swe.instances import TESTBED, checkout_command, make_test_spec, sandbox_user

#: What a test log says when the tests reached for a network they did not have (psf/requests' tests call
#: httpbin.org and an unroutable address for their timeouts).
NETWORK_SIGNS = ("Temporary failure in name resolution", "Name or service not known", "Network is unreachable",
                 "Failed to establish a new connection", "No route to host", "nodename nor servname")
PATCH_FILE = "/tmp/nextstate-grade.patch"
EVAL_FILE = "/tmp/nextstate-eval.sh"
LOG_FILE = "/tmp/nextstate-eval.log"
LOG_TAIL = 3000


@dataclass
class Grade:
    """The verdict on one patch: ``resolved``, or the ``reason`` it is not."""

    resolved: bool
    reason: str | None = None
    patch_applied: bool = False
    apply_command: str | None = None
    tests_status: dict[str, Any] = field(default_factory=dict)
    test_timed_out: bool = False
    network_failure: bool = False
    log_tail: str = ""
    elapsed: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def grade(instance: dict[str, Any], patch: str, *, client: Any, run_id: str,
          timeout: float = 1800.0, memory: str = "2g", cpus: float = 1.0, network: bool = True) -> Grade:
    """Grades ``patch`` (``""``: the base commit as it is) in a new container on ``client``
    (with network by default, as swebench's harness grades)."""
    import docker

    from nextstate import containers

    spec = make_test_spec(instance)
    sandbox_spec = SandboxSpec(image=spec.image, user=sandbox_user(instance), workdir="/", network=network,
                               memory=memory, cpus=cpus, pids_limit=1024, default_timeout=120)
    start = time.monotonic()
    try:
        sandbox = DockerSandbox(sandbox_spec, client, containers.owner_labels(run_id, role="grader"))
    except docker.errors.DockerException as e:
        raise SandboxError(f"could not start a grading container of {spec.image}: {e}") from e
    try:
        result = _grade_in(sandbox, instance, spec, patch, timeout)
    finally:
        sandbox.close()
    result.elapsed = round(time.monotonic() - start, 3)
    return result


def _grade_in(sandbox: Sandbox, instance: dict[str, Any], spec: Any, patch: str,
              timeout: float) -> Grade:
    ready = sandbox.run(checkout_command(instance), timeout=300)
    if not ready.ok:  # the image, not the patch, is at fault: no grade
        raise SandboxError(f"the grader could not check out {instance['base_commit'][:12]} in "
                           f"{spec.image}: {ready.output[-500:]}")
    applied_with = None
    if patch.strip():
        applied_with, output = _apply(sandbox, patch)
        if applied_with is None:
            return Grade(False, "the patch does not apply", log_tail=output[-LOG_TAIL:])
    sandbox.write_file(EVAL_FILE, spec.eval_script, 0o755)
    ran = sandbox.run(f"bash {EVAL_FILE} > {LOG_FILE} 2>&1", timeout=timeout)
    log = sandbox.read_file(LOG_FILE).decode("utf-8", errors="replace")
    applied = applied_with is not None
    if ran.timed_out:
        return Grade(False, f"the tests timed out after {timeout:g}s", applied, applied_with,
                     test_timed_out=True, log_tail=log[-LOG_TAIL:])
    report = log_report(spec, patch, log)
    if not report.get("patch_successfully_applied"):
        reason = report.get("infra_failure_reason") or "the test run produced no test results"
        return _with_network(Grade(False, reason, applied, applied_with, log_tail=log[-LOG_TAIL:]), log)
    resolved = bool(report["resolved"])
    return _with_network(Grade(resolved, None if resolved else "some tests fail", applied, applied_with,
                               report.get("tests_status", {}), log_tail=log[-LOG_TAIL:]), log)


def network_failures(log: str) -> list[str]:
    """The :data:`NETWORK_SIGNS` a test log shows."""
    return [sign for sign in NETWORK_SIGNS if sign in log]


def _with_network(grade_: Grade, log: str) -> Grade:
    """An unresolved grade whose log shows network failures says so: the tests need the internet."""
    signs = network_failures(log)
    if not grade_.resolved and signs:
        grade_.network_failure = True
        grade_.reason = (f"{grade_.reason}, and the tests failed to reach the network ({'; '.join(signs)}): "
                         "this instance's tests need the internet, so the verdict says nothing about the patch")
    return grade_


def _apply(sandbox: Sandbox, patch: str) -> tuple[str | None, str]:
    """Applies ``patch`` in /testbed with SWE-bench's fallbacks; the command that worked, and output."""
    from swebench.harness.run_evaluation import GIT_APPLY_CMDS

    sandbox.write_file(PATCH_FILE, patch)
    output = ""
    for attempt, command in enumerate(GIT_APPLY_CMDS):
        if attempt:  # a failed try (--reject above all) can leave half a patch behind
            sandbox.run(f"cd {TESTBED} && git checkout -- . && git clean -fdq", timeout=120)
        ran = sandbox.run(f"cd {TESTBED} && {command} {PATCH_FILE}", timeout=120)
        output += f"$ {command}\n{ran.output}\n"
        if ran.ok:
            return command, output
    return None, output


def log_report(spec: Any, patch: str, log: str) -> dict[str, Any]:
    """swebench's evaluation report on one test log of the instance of ``spec`` (a ``TestSpec``)."""
    from swebench.harness.grading import get_eval_report

    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(log)
        f.flush()
        prediction = {"instance_id": spec.instance_id, "model_patch": patch,
                      "model_name_or_path": "nextstate"}
        report = get_eval_report(spec, prediction, f.name, include_tests_status=True)
    return report[spec.instance_id]


def summary(grade_: Grade) -> str:
    """One line for logs: resolved, or why not and which tests failed."""
    if grade_.resolved:
        return "resolved"
    failed = [name for key in ("FAIL_TO_PASS", "PASS_TO_PASS")
              for name in grade_.tests_status.get(key, {}).get("failure", [])]
    return f"{grade_.reason}" + (f": {', '.join(failed[:5])}" if failed else "")

