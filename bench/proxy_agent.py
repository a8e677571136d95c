"""The CPU demo of the training proxy: a stand-alone agent that learns through ``train.proxy`` alone.

``python -m bench.proxy_agent --output runs/proxy_demo [--model WARM_START] [--json]``

The agent is written here, not taken from nextstate: it talks to the model only through the
``openai`` SDK, and uses nextstate only for a sandbox and the tasks (the Gymnasium
:class:`envs.terminal.TerminalEnv` on the 4-word ``procedural`` family, two steps per episode).
It builds its own chat (the task, then each answer and the tool's output, as the CPU demo's
warm start saw them: no system turn, no tool list) and reports each episode's outcome with
``POST /v1/sessions/{id}/outcome``.

The model behind the proxy is the CPU demo's warm start (``train.sft.warm_start`` with the
terminal ``cpu_demo`` settings: the "hasty" behaviour that reads the note half of the time),
made once in ``OUTPUT/warm_start`` unless ``--model`` names one. The proxy runs as
``python -m train.proxy --judge rules --wait-outcome --batch 32 ...`` (printed): every turn's
reward is its session's outcome plus the rule judge's vote on its next state (the env loop's
``R_t = o + vote``, with no group baseline), a PPO step every 32 such turns.

Held-out success is measured as in the env demo: ``--heldout`` instances (seeds 1000000+,
never trained on) at temperature 0.5, before any training and after every ``--eval-every``
training episodes, sent as ``X-Turn-Type: side`` turns, which the proxy serves and never
trains on. Training episodes use the training seeds 0, 1, 2, ... in order. Prints one JSON
object: held-out success at each evaluation (with the weights version that served it),
training success per round, the proxy's training steps and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai

from nextstate.envs.terminal import TerminalEnv, procedural

STOP = ["</tool_call>"]


class Agent:
    """Plays one episode at a time in its own env (a sandbox leased from a shared pool)."""

    def __init__(self, client: openai.OpenAI, env: TerminalEnv, model: str, temperature: float, max_tokens: int):
        self.client, self.env, self.model = client, env, model
        self.temperature, self.max_tokens = temperature, max_tokens

    def play(self, task: Any, session: str, side: bool) -> float:
        """One episode of ``task`` as session ``session`` (``side``: served, not trained on);
        its outcome (+1 success, -1 failure)."""
        obs, _ = self.env.reset(options={"task": task})
        messages = [{"role": "user", "content": self.env.present(obs).text}]
        headers = {"X-Session-Id": session, "X-Turn-Type": "side" if side else "main"}
        for i in range(self.env.max_steps):
            answer = self.client.chat.completions.create(
                model=self.model, messages=messages, temperature=self.temperature, max_tokens=self.max_tokens,
                stop=STOP, extra_headers=headers)
            text = answer.choices[0].message.content or ""
            obs, reward, terminated, truncated, info = self.env.step(text)
            ran = info["next_state"].get("valid", True)
            messages += [{"role": "assistant", "content": text},
                         {"role": "tool", "content": self.env.present(obs).text, "tool_call_id": f"call_{i}"}
                         if ran else {"role": "user", "content": self.env.present(obs).text}]
            if "aborted" in info:
                raise RuntimeError(f"the sandbox failed: {info['aborted']}")
            if terminated or truncated:
                return reward
        return -1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_warm_start(output: Path) -> Path:
    """The CPU demo's warm start (``python -m train --env terminal`` makes the same one)."""
    from nextstate.train.config import load_config
    from nextstate.train.sft import warm_start
    return warm_start(load_config("terminal", cpu_demo=True), output, progress=False)


def proxy_command(model: str, output: Path, port: int, batch: int, lr: float, temperature: float,
                  max_tokens: int) -> list[str]:
    return [sys.executable, "-m", "nextstate.train.proxy", "--model", model, "--output", str(output), "--port", str(port),
            "--judge", "rules", "--wait-outcome", "--batch", str(batch), "--max-tokens", str(max_tokens),
            "--served-name", "demo", "--set", f"train.lr={lr}", "--set", "train.kl_coef=0.01",
            "--set", f"rollout.temperature={temperature}", "--set", "train.micro_batch_size=16"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.proxy_agent", description=__doc__.splitlines()[0])
    p.add_argument("--output", required=True, help="run folder (the proxy's records in OUTPUT/proxy)")
    p.add_argument("--model", default=None, help="the warm start (default: the CPU demo's, made in OUTPUT/warm_start)")
    p.add_argument("--episodes", type=int, default=320, help="training episodes")
    p.add_argument("--eval-every", type=int, default=80, help="training episodes between held-out evaluations")
    p.add_argument("--heldout", type=int, default=64, help="held-out instances per evaluation")
    p.add_argument("--parallel", type=int, default=16, help="episodes at once (sandboxes)")
    p.add_argument("--batch", type=int, default=32, help="the proxy's --batch: judged turns per PPO step")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--max-tokens", type=int, default=80)
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    args = p.parse_args(argv)
    if min(args.episodes, args.eval_every, args.heldout, args.parallel, args.batch) < 1:
        print("error: --episodes, --eval-every, --heldout, --parallel and --batch must be at least 1", file=sys.stderr)
        return 2
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    t_warm = time.monotonic()
    model = args.model or str(demo_warm_start(out / "warm_start"))
    warm_s = time.monotonic() - t_warm
    port = free_port()
    command = proxy_command(model, out / "proxy", port, args.batch, args.lr, args.temperature, args.max_tokens)
    say("proxy:", " ".join(command[1:]))
    log = open(out / "proxy.log", "w")
    proxy = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    base = f"http://127.0.0.1:{port}"
    pool = TerminalEnv.make_pool(args.parallel)
    envs = [TerminalEnv(tasks="procedural:train", pool=pool, max_steps=2) for _ in range(args.parallel)]
    free = list(envs)
    lock = threading.Lock()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=600)
    train_tasks = procedural.load("procedural:train")
    heldout_tasks = procedural.load("procedural:heldout")[:args.heldout]
    t0 = time.monotonic()

    def health() -> dict:
        return httpx.get(f"{base}/health", timeout=60).json()

    def episode(task: Any, side: bool) -> float:
        with lock:
            env = free.pop()
        try:
            sid = f"{'eval' if side else 'train'}-{task.id}-{uuid.uuid4().hex[:6]}"
            outcome = Agent(client, env, "demo", args.temperature, args.max_tokens).play(task, sid, side)
            if not side:
                httpx.post(f"{base}/v1/sessions/{sid}/outcome", json={"outcome": outcome}, timeout=60).raise_for_status()
            return outcome
        finally:
            with lock:
                free.append(env)

    def run(tasks: list, side: bool) -> float:
        with ThreadPoolExecutor(args.parallel) as ex:
            outcomes = list(ex.map(lambda t: episode(t, side), tasks))
        return sum(o > 0 for o in outcomes) / len(outcomes)

    def settle() -> dict:
        """Wait until the proxy trains nothing: the evaluation sees one weights version."""
        while (h := health())["training"] or h["judging"]:
            time.sleep(0.5)
        return h

    result: dict[str, Any] = {"proxy_command": " ".join(command[1:]), "episodes": args.episodes,
                              "heldout": args.heldout, "parallel": args.parallel, "evals": [], "train_success": []}
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{base}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proxy.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the proxy did not start (see {out / 'proxy.log'})")
            time.sleep(0.5)
        t0 = time.monotonic()
        done = 0
        while True:
            h = settle()
            success = run(heldout_tasks, side=True)
            result["evals"].append({"train_episodes": done, "version": h["version"], "success": success,
                                    "minutes": round((time.monotonic() - t0) / 60, 2)})
            say(f"held-out success {success:.3f} after {done} training episodes (version {h['version']}, "
                f"{(time.monotonic() - t0) / 60:.1f} min)")
            if done >= args.episodes:
                break
            n = min(args.eval_every, args.episodes - done)
            rate = run(train_tasks[done:done + n], side=False)
            result["train_success"].append(round(rate, 3))
            done += n
            say(f"training episodes {done}: success {rate:.3f}")
        h = settle()
        result.update(wall_minutes=round((time.monotonic() - t0) / 60, 2), warm_start_minutes=round(warm_s / 60, 2),
                      trained_steps=h["trained_steps"], version=h["version"],
                      proxy_sessions=h["sessions"], proxy_turns=h["turns"],
                      before=result["evals"][0]["success"], after=result["evals"][-1]["success"])
    finally:
        proxy.terminate()
        try:
            proxy.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proxy.kill()
        log.close()
        for env in envs:
            env.close()
        pool.close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
