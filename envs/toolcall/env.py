"""Math problems with a sandboxed Python tool; the answer is checked with math-verify.

Rows come from JSONL or parquet files in DAPO-Math style (``prompt`` as text
or a chat list, ``answer`` or ``reward_model.ground_truth``) or AIME style
(``ID``/``id``, ``Problem``/``problem``, ``Answer``/``answer``).
The model runs code with ``python`` (a fresh ``python3`` process in the
sandbox each call) and ends with ``answer`` (``finish`` is accepted as an
alias); a plain reply containing ``\\boxed{...}`` also counts as the answer.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from nextstate.envs.actions import NoToolCall, ToolCall, parse_action, tool_schema
from nextstate.envs.base import NextStateEnv, Outcome, Task, ToolResult, read_rows

log = logging.getLogger(__name__)
BUILTIN_TASKS = Path(__file__).parent / "tasks"
GUIDE = ("Use the `python` tool to compute (each call runs a fresh python3 process; print what you "
         "need). When you are sure, call `answer` with the final answer in \\boxed{}.")
_ANSWER_ARG = {"type": ["string", "number"], "description": "The final answer, e.g. \\boxed{42}."}
_FINISH = tool_schema("finish", "Same as answer.", {"answer": _ANSWER_ARG})


def load_math_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Problems from a JSONL/parquet file, or from every such file in a directory."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet"))
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(f"no math problems at {path}")
    return [math_task(row, f"{f.stem}-{i}", f"{f}:{i + 1}")
            for f in files for i, row in enumerate(read_rows(f))]


def math_task(row: dict[str, Any], default_id: str, where: str = "row") -> Task:
    """One problem from a DAPO-Math or AIME style row."""
    prompt = _first(row, "prompt", "problem", "Problem", "question")
    if isinstance(prompt, list):  # a chat: the user turns
        prompt = "\n\n".join(str(m.get("content", "")) for m in prompt if m.get("role", "user") == "user")
    answer = _first(row, "answer", "Answer")
    if answer is None:
        answer = (row.get("reward_model") or {}).get("ground_truth")
    if not prompt or answer is None or str(answer).strip() == "":
        raise ValueError(f"{where}: a row needs a problem (prompt/problem) and an answer")
    task_id = _first(row, "id", "ID", "task_id") or (row.get("extra_info") or {}).get("index") or default_id
    category = str(row.get("category") or row.get("data_source") or "")
    return Task(str(task_id), str(prompt).strip(), {"answer": str(answer).strip()}, category)


def _first(row: dict[str, Any], *keys: str) -> Any:
    return next((row[k] for k in keys if row.get(k) is not None), None)


def answers_match(answer: str, reference: str) -> bool:
    """Whether ``answer`` equals ``reference`` mathematically (fractions, LaTeX, 1,000 == 1000...)."""
    return _verifier.check(_as_latex(answer), _as_latex(reference))


class _Verifier:
    """math-verify in a helper ``python3`` process.

    Its timeouts use SIGALRM, which only works on a main thread, and a hung
    sympy call (``\\boxed{9^{9^{9^9}}}``) holds the GIL: run in-process from an
    episode thread it could freeze the whole trainer. The helper answers one
    JSON line per request; one that does not answer in time is killed.
    """

    SERVER = (
        "import json, sys\n"
        "from math_verify import parse, verify\n"
        "for line in sys.stdin:\n"
        "    answer, reference = json.loads(line)\n"
        "    try:\n"
        "        gold, pred = parse(reference, parsing_timeout=5), parse(answer, parsing_timeout=5)\n"
        "        ok = bool(gold and pred and verify(gold, pred, timeout_seconds=5))\n"
        "    except Exception:\n"
        "        ok = False\n"
        "    print(json.dumps(ok), flush=True)\n")

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def check(self, answer: str, reference: str) -> bool:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen([sys.executable, "-c", self.SERVER], text=True,
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(json.dumps([answer, reference]) + "\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
                reply = proc.stdout.readline() if ready else ""
            except OSError:
                reply = ""
            if reply:
                return bool(json.loads(reply))
            log.warning("math-verify gave no verdict on %.200r (exit code %s); counted as wrong",
                        answer, proc.poll())
            proc.kill()
            proc.wait()
            self._proc = None
            return False


_verifier = _Verifier()


def _as_latex(text: str) -> str:
    text = text.strip()
    return text if "\\boxed" in text or "$" in text else f"\\boxed{{{text}}}"


class ToolCallEnv(NextStateEnv):
    """A math problem, a Python tool in a sandbox (leased on first use), +1/-1 for the answer."""

    family = "toolcall"
    default_max_steps = 10
    lease_at_reset = False
    tools = [
        tool_schema("python", "Run a Python 3 program in a sandbox and return what it prints.",
                    {"code": ("string", "The program; print() the results you need."),
                     "timeout": ("number", "Seconds before it is killed (optional).")},
                    required=["code"]),
        tool_schema("answer", "Submit the final answer; this ends the episode.", {"answer": _ANSWER_ARG}),
    ]

    def load_tasks(self, source: Any) -> list[Task]:
        if source is None or isinstance(source, (str, os.PathLike)):
            return load_math_tasks(BUILTIN_TASKS if source is None else source)
        return super().load_tasks(source)

    def parse(self, action: Any) -> ToolCall:
        try:
            call = parse_action(action, [*self.tools, _FINISH])
        except NoToolCall:
            text = action.get("content") if isinstance(action, dict) else action
            if isinstance(text, str) and "\\boxed" in text:  # a plain final reply
                return ToolCall("answer", {"answer": text})
            raise
        if call.name == "finish":
            call.name = "answer"
        return call

    def start_episode(self, task: Task) -> Any:
        self.answer: str | None = None
        return GUIDE

    def call_tool(self, call: ToolCall) -> ToolResult:
        if call.name == "answer":
            self.answer = str(call.arguments["answer"])
            return ToolResult("Answer submitted.", done=True)
        code = base64.b64encode(call.arguments["code"].encode()).decode()
        command = (f'f=$(mktemp /tmp/code-XXXXXX.py) && printf %s {code} | base64 -d > "$f" '
                   f'&& python3 "$f"; rc=$?; rm -f "$f"; (exit $rc)')
        return self.command_result(self.run(command, call.arguments.get("timeout")))

    def compute_outcome(self) -> Outcome:
        assert self.task is not None
        reference = self.task.data["answer"]
        if self.answer is None:
            return Outcome(-1.0, {"reason": "no answer was given", "answer": None, "reference": reference})
        correct = answers_match(self.answer, reference)
        return Outcome(1.0 if correct else -1.0,
                       {"answer": self.answer, "reference": reference, "correct": correct})

    def oracle_actions(self, task: Task, kind: str) -> list[dict[str, Any]]:
        """gold: answer the reference; noop: answer ``\\boxed{}``."""
        answer = task.data["answer"] if kind == "gold" else "\\boxed{}"
        return [{"name": "answer", "arguments": {"answer": answer}}]
