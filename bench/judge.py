"""What the step judge costs a rollout, measured with it off and on in the same run.

``python -m bench.judge --json`` prints one JSON object. N parallel episodes
(default 16) of a real Docker terminal task are played by a scripted policy
that answers after a fixed generation delay; the judge is a local
OpenAI-compatible server (:class:`agents.testing.ScriptedOpenAIServer`,
standing in for an LLM server) that answers each request after a fixed delay.
After a warm-up run, judge-off and judge-on runs alternate (each starting from
a warm pool with the previous run's containers gone) and the medians compare.
Because judge requests run in the background, the judge should add little
more than its last answer's delay to an episode (``judge_wait_s_mean``: the
time episodes spent waiting for their judges after their last step): the goal
is ``wall_on_s / wall_off_s <= 1.1``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from bench import report
from nextstate import containers
from nextstate.train.rollout import collect
from nextstate.agents.openai_policy import OpenAIPolicy
from nextstate.agents.testing import Reply, ScriptedOpenAIServer, ScriptedPolicy
from nextstate.containers.pool import SandboxPool
from nextstate.envs.terminal import TerminalEnv, load_terminal_tasks
from nextstate.judges.prm import StepJudge

TASK = {"id": "bench-notes", "instruction": "Create /app/notes.txt with two lines: alpha, then beta.",
        "tests": "import pathlib\n\ndef test_notes():\n"
                 "    assert pathlib.Path('/app/notes.txt').read_text().split() == ['alpha', 'beta']\n"}
SCRIPT = [
    '<tool_call>{"name": "bash", "arguments": {"command": "echo alpha > /app/notes.txt"}}</tool_call>',
    '<tool_call>{"name": "bash", "arguments": {"command": "echo beta >> /app/notes.txt && '
    'cat /app/notes.txt"}}</tool_call>',
    '<tool_call>{"name": "finish", "arguments": {}}</tool_call>',
]


def settle(pool: SandboxPool, timeout: float = 300.0) -> None:
    """Wait until the pool is warm and the previous run's containers are removed, so that
    neither mode pays for the other's cleanup."""
    pool.wait_ready(timeout)
    client, deadline = containers.connect(), time.monotonic() + timeout
    try:
        while len(containers.project_containers(client, pool.run_id)) > pool.size:
            if time.monotonic() > deadline:
                raise TimeoutError("old sandboxes were not removed in time")
            time.sleep(0.2)
    finally:
        client.close()


async def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "tasks.jsonl"
        index.write_text(json.dumps(TASK) + "\n")
        tasks = load_terminal_tasks(index)
    policy = ScriptedPolicy(SCRIPT, delay=args.policy_delay)
    answer = Reply("The command worked and moves the task forward. \\boxed{1}", delay=args.judge_delay)
    walls: dict[str, list[float]] = {"off": [], "on": []}
    last: dict[str, list] = {}
    with SandboxPool(args.image, size=args.episodes) as pool, ScriptedOpenAIServer(answer) as server:
        judge = StepJudge(OpenAIPolicy(server.url, model="judge"), m=args.m,
                          max_concurrency=args.episodes * 3)
        async def episodes(with_judge: bool) -> tuple[float, list]:
            settle(pool)
            start = time.monotonic()
            trajs = await collect(lambda: TerminalEnv(tasks, pool=pool), policy, tasks,
                                  n_samples=args.episodes, parallel=args.episodes,
                                  judge=judge if with_judge else None, progress=False)
            return time.monotonic() - start, trajs

        await episodes(True)  # warm-up (judge on: it touches every path): imports, connections
        for r in range(args.repeats):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                wall, last[mode] = await episodes(mode == "on")
                walls[mode].append(wall)
        requests = len(server.requests)
    off, on = statistics.median(walls["off"]), statistics.median(walls["on"])
    steps = [s for t in last["on"] for s in t.steps]
    return {
        "episodes": args.episodes, "steps_per_episode": len(SCRIPT), "repeats": args.repeats,
        "policy_delay_s": args.policy_delay, "judge_delay_s": args.judge_delay, "judge_m": args.m,
        "wall_off_s": round(off, 3), "wall_on_s": round(on, 3), "ratio": round(on / off, 4),
        "pair_ratios": [round(a / b, 4) for a, b in zip(walls["on"], walls["off"])],
        "judge_overhead_s": round(on - off, 3),
        "goal_ratio": 1.1, "meets_goal": on / off <= 1.1,
        "walls_off_s": [round(w, 3) for w in walls["off"]],
        "walls_on_s": [round(w, 3) for w in walls["on"]],
        "judge_wait_s_mean": round(statistics.mean(t.info["timing"]["judge_wait"]
                                                   for t in last["on"]), 3),
        "judge_requests": requests,
        "steps_with_votes": sum(len(s.votes) == args.m for s in steps), "steps": len(steps),
        "finished": sum(t.status == "finished" for t in last["on"] + last["off"]),
        "solved": sum(t.outcome == 1.0 for t in last["on"] + last["off"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=16, help="parallel episodes per run")
    ap.add_argument("--policy-delay", type=float, default=1.5, help="seconds per generation")
    ap.add_argument("--judge-delay", type=float, default=0.2, help="seconds per judge answer")
    ap.add_argument("--m", type=int, default=3, help="judge votes per step (one request, n=m)")
    ap.add_argument("--repeats", type=int, default=4,
                    help="off/on pairs, in alternating order (medians reported)")
    ap.add_argument("--image", default="nextstate/terminal:latest")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = asyncio.run(run(args))
    report(result, args.json)


if __name__ == "__main__":
    main()
