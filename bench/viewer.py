"""How fast the run viewer opens a big run: time to first render and to open an episode.

``python -m bench.viewer --json`` prints one JSON object. It writes a run of
about 10,000 agent steps with the project's own code (the agent loop's
:func:`~train.rollout.collect` with its :class:`~agents.recorder.Recorder`,
:func:`~train.batch.build_batch` for the advantages, the trainer's file
layout), serves it with ``python -m viewer`` and drives Debian's Chromium
through Playwright:

* ``cold_render_s``: from starting ``python -m viewer`` to the rendered
  overview (indexing included);
* ``first_render_s``: loading the page of a running server until the overview
  and the first page of the episode list are drawn (median of 3);
* ``open_episode_s``: clicking an episode row until its steps are drawn
  (median of 5 different episodes).

Goal: under 2 s each. The policy and the judge are test doubles (no model can
run here at this scale): the policy picks its actions with a seeded RNG, the
judge votes with one; everything else is the project's own code.
:func:`write_run` also makes the fixture runs of ``tests/test_viewer.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import report
from nextstate.train.rollout import collect, heldout
from nextstate.agents.policy import Generation, Policy
from nextstate.agents.recorder import Recorder
from nextstate.envs.actions import ToolCall, tool_schema
from nextstate.envs.base import NextStateEnv, Outcome, Task, ToolResult
from nextstate.judges.prm import StepJudge
from nextstate.train.batch import build_batch
from nextstate.train.config import AdvantageConfig

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--metrics-recording-only", "--mute-audio"]


class LogEnv(NextStateEnv):
    """An in-process env (no sandbox): ``run`` prints a log excerpt, ``finish`` ends the
    episode; the outcome is 1 when ``run`` was called with ``fix`` in its command."""

    family = "terminal"
    default_max_steps = 6
    lease_at_reset = False
    tools = [tool_schema("run", "Run a shell command.", {"command": "string"}),
             tool_schema("finish", "End the episode.")]

    def start_episode(self, task: Task) -> None:
        self.fixed = False

    def call_tool(self, call: ToolCall) -> ToolResult:
        if call.name == "finish":
            return ToolResult("finished", done=True)
        cmd = str(call.arguments.get("command", ""))
        self.fixed = self.fixed or "fix" in cmd
        lines = [f"[{i:03d}] {cmd}: worker {i % 7} processed batch {i * 13} in {i * 0.37:.2f}s"
                 for i in range(1, 9)]
        return ToolResult("\n".join(lines), exit_code=0 if "fix" in cmd or "ls" in cmd else 1)

    def compute_outcome(self) -> Outcome:
        if self.fixed:
            return Outcome(1.0, {"fixed": True, "tests": {"test_worker_ok": "passed"}})
        return Outcome(0.0, {"fixed": False, "tests": {"test_worker_ok": "failed"},
                             "reason": "./fix.sh was never run",
                             "log_tail": "FAILED test_worker_ok - AssertionError: worker 3 still fails"})


COMMANDS = ["ls -la /app", "cat /app/config.yaml", "python -m pytest -q", "./fix.sh --apply", "grep -rn TODO /app"]


class DicePolicy(Policy):
    """Stands in for a model: picks a command, an invalid answer or ``finish`` with a seeded RNG.
    Token ids are a few fixed numbers (enough for the trainer to count the step as trainable)."""

    name = "dice"

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    async def generate(self, messages: list[dict], tools: list[dict] | None = None,
                       **sampling: Any) -> Generation:
        turn = sum(m["role"] == "assistant" for m in messages)
        roll = self.rng.random()
        if turn >= 1 and roll < 0.25 + 0.1 * turn:
            text = '<tool_call>{"name": "finish", "arguments": {}}</tool_call>'
        elif roll > 0.93:
            text = "I think I should look at the logs first."
        else:
            cmd = self.rng.choice(COMMANDS)
            text = f'Let me try this.\n<tool_call>{{"name": "run", "arguments": {{"command": "{cmd}"}}}}</tool_call>'
        ids = list(range(1, 1 + len(text) // 8))
        return Generation(text=text, prompt_ids=[1] * (10 + 20 * turn), response_ids=ids,
                          logprobs=[-1.5] * len(ids), ids_from_server=True)


class DiceJudge(Policy):
    """Stands in for a judge model: ``m`` answers, each ending in a seeded-random ``\\boxed{v}``."""

    name = "dice-judge"

    def __init__(self, seed: int = 1):
        self.rng = random.Random(seed)

    async def generate(self, messages: list[dict], tools: list[dict] | None = None, **kw: Any) -> Generation:
        v = self.rng.choice([1, 1, 0, -1])
        why = {1: "The command ran and moved the task forward.", 0: "Neutral: nothing learned.",
               -1: "The command failed; the next state shows an error."}[v]
        hint = " [HINT_START]Run ./fix.sh before finishing.[HINT_END]" if v < 0 else ""
        return Generation(text=f"{why}{hint}\n\\boxed{{{v}}}")


def _png(color: tuple[int, int, int], label: str) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (320, 200), color)
    draw = ImageDraw.Draw(img)
    draw.rectangle([20, 20, 300, 60], fill=(255, 255, 255))
    draw.text((30, 32), label, fill=(0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def record_gui_episode(rec: Recorder, out: Path, group_id: str) -> None:
    """One two-step GUI episode whose screenshots are PNG files beside rollouts.jsonl, referenced
    by relative path; the first screenshot is also inline base64 in the messages (older runs)."""
    shots = out / "screens"
    shots.mkdir(exist_ok=True)
    names = []
    for i, (color, label) in enumerate([((40, 90, 160), "desktop"), ((30, 140, 80), "editor open"),
                                        ((160, 60, 40), "file saved")]):
        path = shots / f"{group_id.replace('@', '_')}_{i}.png"
        path.write_bytes(_png(color, label))
        names.append(str(path.relative_to(out)))
    where = {"group_id": group_id, "task_id": group_id.split("@")[0], "sample": 0}
    first = base64.b64encode((out / names[0]).read_bytes()).decode()
    actions = [{"name": "click", "arguments": {"x": 120, "y": 40}}, {"name": "hotkey", "arguments": {"keys": ["ctrl", "s"]}}]
    for i, action in enumerate(actions):
        messages = [{"role": "system", "content": "You operate a desktop."},
                    {"role": "user", "content": [{"type": "text", "text": "Save the file."},
                                                 {"type": "image", "image": first if i == 0 else names[i]}]}]
        rec.record("step", {**where, "step": i, "role": "agent", "messages": messages,
                            "text": json.dumps(action), "action": action,
                            "next_state": {"valid": True, "output": f"did {action['name']}"},
                            "observation": {"image": names[i + 1]}, "reward": 0.0})
        rec.record("judge", {**where, "step": i, "votes": [1, 1, 0], "score": 1, "mean": 2 / 3,
                             "hint": None, "error": None, "prompt": f"Judge the GUI step {i}.",
                             "raw": ["fine \\boxed{1}", "fine \\boxed{1}", "unsure \\boxed{0}"]})
    rec.record("trajectory", {**where, "status": "finished", "error": None, "outcome": 1.0, "steps": 2,
                              "step_scores": [1.0, 1.0]})


def write_run(out: str | Path, *, train_steps: int = 2, tasks_per_step: int = 3, samples: int = 4,
              max_steps: int = 6, judge_votes: int = 3, gui: bool = True, seed: int = 0,
              metrics_log: bool = False, min_agent_steps: int = 0, heldout_tasks: int = 0) -> dict[str, Any]:
    """A training run folder in the layout of ``python -m train``: rollouts.jsonl (agent loop
    and recorder), advantages.jsonl (build_batch's step log), metrics.jsonl, config.json.
    ``train_steps`` training steps, or more until ``min_agent_steps`` agent steps are written.
    With ``heldout_tasks``, that many held-out tasks are evaluated (``train.rollout.heldout``)
    before the first step and after each, as the local trainer does."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = [Task(f"logs-{i:03d}", f"Find why worker {i} fails and fix it.") for i in range(max(8, tasks_per_step))]
    policy, judge = DicePolicy(seed), StepJudge(DiceJudge(seed + 1), m=judge_votes, max_concurrency=64)
    rec, adv = Recorder(out / "rollouts.jsonl"), Recorder(out / "advantages.jsonl")
    (out / "config.json").write_text(json.dumps({"env": {"family": "terminal", "max_steps": max_steps},
                                                 "rollout": {"tasks_per_step": tasks_per_step,
                                                             "samples_per_task": samples}}, indent=2))
    metrics = None
    if metrics_log:
        from nextstate.train.metrics import MetricsLog
        metrics = MetricsLog(out)
    steps = 0
    held = [Task(f"held-{i:03d}", f"Find why worker {100 + i} fails and fix it.") for i in range(heldout_tasks)]

    def evaluate(step: int) -> dict[str, Any]:
        return asyncio.run(heldout(lambda: LogEnv(held, max_steps=max_steps), policy, held, step=step,
                                   parallel=16, recorder=rec)) if held else {}

    def log(step: int, row: dict[str, Any]) -> None:
        if metrics is not None:
            metrics.log(step, row)
        else:
            with (out / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"step": step, **row}) + "\n")

    try:
        if held:
            log(0, evaluate(0))
        k = 0
        while k < train_steps or steps < min_agent_steps:
            chosen = [tasks[(k * tasks_per_step + j) % len(tasks)] for j in range(tasks_per_step)]
            trajs = asyncio.run(collect(lambda: LogEnv(tasks, max_steps=max_steps), policy, chosen,
                                        n_samples=samples, parallel=16, judge=judge, recorder=rec,
                                        batch_tag=f"s{k + 1}", progress=False))
            batch = build_batch(trajs, AdvantageConfig(), weight=1.0, role="agent")
            for row in batch.step_log:
                adv.record("advantage", {"train_step": k + 1, **row})
            steps += sum(len(t.steps) for t in trajs)
            log(k + 1, {**batch.metrics, **evaluate(k + 1)})
            k += 1
        if gui:
            record_gui_episode(rec, out, f"desktop-save@s{k}")
            steps += 2
    finally:
        rec.close()
        adv.close()
        if metrics is not None:
            metrics.close()
    return {"agent_steps": steps, "rollouts_mb": round((out / "rollouts.jsonl").stat().st_size / 1e6, 2)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_viewer(run: Path, port: int) -> subprocess.Popen:
    """``python -m viewer RUN --port PORT`` in a subprocess, once it answers."""
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "nextstate.viewer", str(run), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).read()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the viewer exited: {proc.stdout.read()}")
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the viewer did not answer within 60 s")


def launch_chromium(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def measure(run: Path) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    port = free_port()
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        t0 = time.monotonic()
        proc = start_viewer(run, port)
        try:
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("body[data-ready] #episodes tr.episode-row")
            cold = time.monotonic() - t0
            first = []
            for _ in range(3):
                t = time.monotonic()
                page.goto(f"http://127.0.0.1:{port}/?r={_}")
                page.wait_for_selector("body[data-ready] #episodes tr.episode-row")
                first.append(time.monotonic() - t)
            opened = []
            for i in range(5):
                page.select_option("select[data-f=sort]", "steps:desc")
                row = page.locator("tr.episode-row").nth(i * 7)
                t = time.monotonic()
                row.click()
                page.wait_for_selector("#steps .step")
                opened.append(time.monotonic() - t)
                n_steps = page.locator("#steps .step").count()
                page.go_back()
                page.wait_for_selector("#episodes tr.episode-row")
        finally:
            proc.terminate()
            proc.wait(10)
            browser.close()
    return {"cold_render_s": round(cold, 3), "first_render_s": round(statistics.median(first), 3),
            "open_episode_s": round(statistics.median(opened), 3),
            "open_episode_max_s": round(max(opened), 3), "steps_in_last_opened": n_steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.viewer", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10_000, help="agent steps in the synthetic run (about)")
    p.add_argument("--run", help="measure this run folder instead of writing a synthetic one")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-viewer-") as tmp:
        figures: dict[str, Any] = {}
        if args.run:
            run = Path(args.run)
        else:
            run = Path(tmp) / "run"
            t = time.monotonic()
            # 16 episodes per training step, about 3.2 agent steps each
            figures.update(write_run(run, train_steps=1, min_agent_steps=args.steps, tasks_per_step=4,
                                     samples=4, max_steps=6, gui=True))
            figures["write_s"] = round(time.monotonic() - t, 1)
        from nextstate.viewer import RunIndex
        t = time.monotonic()
        index = RunIndex(run)
        index.refresh()
        figures["index_s"] = round(time.monotonic() - t, 3)
        figures["episodes"] = len(index.episodes)
        figures.update(measure(run))
        figures["goal_s"] = 2.0
    report(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
