"""Benchmark: what the training proxy adds to serving, and whether a weight swap stalls it.

``python -m bench.proxy [--sessions 1,8,32] [--turns 3] [--max-tokens 16] [--json]``.
``C`` sessions run at once, each ``--turns`` turns (the answer and a tool result appended
each turn), against the same ``tiny`` model three ways:

* ``bare`` -- ``HFPolicy.generate`` called directly (no HTTP, no proxy);
* ``proxy`` -- the same requests through ``train.proxy`` with the ``openai`` SDK (HTTP, session
  matching, recording, the rule judge), training off;
* ``proxy_train`` -- the same, training on (a PPO step every ``--batch`` judged turns, its
  weights swapped in between generation batches).

Per mode and ``C``: requests/s and latency p50/p99 (ms); ``added_p50``/``added_p99``: the
proxy's latency over bare's, in %. The requests are seeded, so bare and proxy (training off)
generate the same tokens. The modes alternate within each level, ``--repeat`` rounds, so a
drifting machine load hits them alike. With training on: ``swap_ms`` (the longest weight
swap), the p50 latency of the requests in flight during a swap and of the others, and
``stall_ms``, their difference: what a swap cost a request that met it. Everything runs in one
process on this machine's CPU, the client included; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from bench import ms_percentile, report
from judges.rules import RuleJudge
from train.config import Config
from train.proxy import ProxyTrainer, TrainingProxy, serving

Ask = Callable[[int, int, list[dict]], Awaitable[str]]


async def sessions(concurrency: int, turns: int, ask: Ask) -> tuple[list[tuple[float, float]], float]:
    """``concurrency`` sessions of ``turns`` turns each; ``([(start, end)] per request, wall seconds)``."""
    spans: list[tuple[float, float]] = []

    async def one(k: int) -> None:
        messages = [{"role": "user", "content": f"Task {k}: list the files and count them."}]
        for t in range(turns):
            t0 = time.monotonic()
            text = await ask(k, t, messages)
            spans.append((t0, time.monotonic()))
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"exit code: {(k + t) % 2}\nfile_{t}.txt"}]

    t0 = time.monotonic()
    await asyncio.gather(*(one(k) for k in range(concurrency)))
    return spans, time.monotonic() - t0


def figures(spans: list[tuple[float, float]], wall: float, base: dict | None = None) -> dict[str, Any]:
    lat = [b - a for a, b in spans]
    out = {"requests": len(spans), "rps": round(len(spans) / wall, 2),
           "p50_ms": ms_percentile(lat, 0.5, 1), "p99_ms": ms_percentile(lat, 0.99, 1)}
    if base:
        out["added_p50"] = f"{100 * (out['p50_ms'] / base['p50_ms'] - 1):+.1f}%"
        out["added_p99"] = f"{100 * (out['p99_ms'] / base['p99_ms'] - 1):+.1f}%"
    return out


def stalls(spans: list[tuple[float, float]], swaps: list[tuple[float, float]]) -> dict[str, Any]:
    """Latency of the requests in flight during a weight swap against the others, and the swaps."""
    hit = [b - a for a, b in spans if any(a < s1 and b > s0 for s0, s1 in swaps)]
    rest = [b - a for a, b in spans if not any(a < s1 and b > s0 for s0, s1 in swaps)]
    out = {"swaps": len(swaps), "swap_ms": round(1000 * max((b - a for a, b in swaps), default=0), 1)}
    if hit and rest:
        out.update(during_swap_p50_ms=ms_percentile(hit, 0.5, 1), other_p50_ms=ms_percentile(rest, 0.5, 1))
        out["stall_ms"] = round(out["during_swap_p50_ms"] - out["other_p50_ms"], 1)
    return out


def run(levels: list[int], turns: int, max_tokens: int, batch: int, repeat: int) -> dict[str, Any]:
    """Bare, proxy and proxy with training, side by side: for each level, each mode in turn,
    ``repeat`` rounds (the machine's load drifts; the rounds are pooled)."""
    import openai

    from agents.hf_policy import HFPolicy

    sampling = {"max_tokens": max_tokens, "temperature": 1.0}
    bare_policy = HFPolicy("tiny", max_new_tokens=max_tokens)

    async def bare(k: int, t: int, messages: list[dict]) -> str:
        return (await bare_policy.generate(messages, seed=1000 * k + t, **sampling)).text

    def through(url: str, c: int) -> tuple[list, float]:
        client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)

        async def ask(k: int, t: int, messages: list[dict]) -> str:
            r = await client.chat.completions.create(model="tiny", messages=messages, seed=1000 * k + t, **sampling)
            return r.choices[0].message.content or ""

        async def go() -> tuple[list, float]:
            try:
                return await sessions(c, turns, ask)
            finally:
                await client.close()

        return asyncio.run(go())

    with tempfile.TemporaryDirectory() as plain_dir, tempfile.TemporaryDirectory() as train_dir:
        plain = TrainingProxy(HFPolicy("tiny", max_new_tokens=max_tokens), Path(plain_dir), judge=RuleJudge(),
                              model_name="tiny", max_tokens=max_tokens)
        cfg = Config()
        cfg.train.kl_coef, cfg.train.lr = 0.0, 1e-4
        policy = HFPolicy("tiny", max_new_tokens=max_tokens)
        trainer = ProxyTrainer(policy, cfg, Path(train_dir), batch=batch, save_every=10**9)
        training = TrainingProxy(policy, Path(train_dir), judge=RuleJudge(), trainer=trainer, model_name="tiny",
                                 max_tokens=max_tokens)
        out: dict[str, Any] = {"model": "tiny", "turns": turns, "max_tokens": max_tokens, "batch": batch,
                               "repeat": repeat, "bare": {}, "proxy": {}, "proxy_train": {}}
        with serving(plain) as plain_url, serving(training) as train_url:
            asyncio.run(sessions(1, 1, bare))   # warm-ups, not timed
            through(plain_url, 1)
            through(train_url, 1)
            for c in levels:
                got: dict[str, list] = {"bare": [], "proxy": [], "proxy_train": []}
                walls = dict.fromkeys(got, 0.0)
                first_swap = len(trainer.swaps)
                for _ in range(repeat):
                    for mode, go in (("bare", lambda: asyncio.run(sessions(c, turns, bare))),
                                     ("proxy", lambda: through(plain_url, c)),
                                     ("proxy_train", lambda: through(train_url, c))):
                        spans, wall = go()
                        got[mode] += spans
                        walls[mode] += wall
                base = figures(got["bare"], walls["bare"])
                out["bare"][str(c)] = base
                out["proxy"][str(c)] = figures(got["proxy"], walls["proxy"], base)
                out["proxy_train"][str(c)] = {**figures(got["proxy_train"], walls["proxy_train"], base),
                                              **stalls(got["proxy_train"], trainer.swaps[first_swap:])}
        out["proxy_train"]["training_steps"] = trainer.steps
    asyncio.run(bare_policy.aclose())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="1,8,32", help="concurrency levels, comma-separated")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8, help="judged turns per training step (training on)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds per level (modes alternate)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    levels = [int(x) for x in args.sessions.split(",")]
    report(run(levels, args.turns, args.max_tokens, args.batch, args.repeat), args.json)


if __name__ == "__main__":
    main()
