"""Benchmark: what the training proxy adds to serving, and whether a weight swap stalls it.

``python -m bench.proxy [--sessions 1,8,32] [--turns 3] [--max-tokens 16] [--json]``.
``C`` sessions run at once, each ``--turns`` turns (the answer and a tool result appended
each turn), against the same ``tiny`` model five ways:

* ``bare`` -- ``HFPolicy.generate`` called directly (no HTTP, no proxy);
* ``http`` -- the same engine behind a plain OpenAI-compatible endpoint (:func:`plain_app`: the
  proxy's request parsing and answer format on FastAPI and uvicorn, no sessions, recording,
  judge or training), through the ``openai`` SDK: what a user would run instead of the proxy;
* ``proxy`` -- the same requests through ``train.proxy`` with the ``openai`` SDK (HTTP, session
  matching, recording, the rule judge), training off;
* ``proxy_train`` -- the same, training on (a PPO step every ``--batch`` judged turns, its
  weights swapped in between generation batches);
* ``http_train`` -- the fair control for ``proxy_train``: the plain server with the same learner
  beside it (:class:`train.proxy.ProxyTrainer`, offered each answer the proxy would judge when
  its session's next request arrives, so the same PPO steps and swaps run at the same points),
  without the proxy's sessions, recording and judge.

``--samples 1,4,8`` measures group sampling instead (:func:`group_run`): the proxy, training
off, with ``N`` candidates per main-line request, ranked by rule, by the listwise judge on the
served model choosing the best, or by that judge with a random choice; ``added_p50`` is then over
``N = 1``.

Per mode and ``C``: requests/s, latency p50/p99 (ms), ``cpu_ms`` (the process's CPU time per
request, every thread: client, server, model, judges and learner; mostly torch's threads, which
spin while they wait, so it is too coarse for the proxy's own bookkeeping), and the generation
batches the model ran (``batches``; ``joined``: requests that joined a running batch).
``added_p50``/``added_p99``: the latency over bare's, in %; ``added_p50_http``/``added_p99_http``:
over ``http``'s; for ``proxy_train`` also ``added_p50_http_train``/``added_p99_http_train``: over
``http_train``'s (what the proxy adds when both share the CPU with the same learner). The requests
are seeded (``seed(k, t)``), so every mode but the two training ones generates the same tokens.
The modes alternate within each level, ``--repeat`` rounds, so a drifting machine load hits them
alike. With training on (both training modes): ``update_ms`` and ``swap_ms`` (the longest PPO step
and weight swap), the p50 latency of the requests in flight during a swap, of those in flight
during a PPO step (but no swap) and of the others; ``stall_ms`` (swap minus others: what a swap
cost a request that met it) and ``update_cost_ms`` (the same for a PPO step). Everything runs in
one process on this machine's CPU, the client and the learner included; figures are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from bench import ms_percentile, report
from nextstate.judges.rules import RuleJudge
from nextstate.train.config import Config
from nextstate.train.proxy import (BadRequest, ChatRequest, ProxyTrainer, TrainingProxy, assistant_message, finish_reason,
                         parse_request, serving, usage)
from nextstate.train.sessions import Session, Turn

Ask = Callable[[int, int, list[dict]], Awaitable[str]]


TURNS_PER_SEED_BLOCK = 1000   # session k's turns are seeded k*1000, k*1000 + 1, ...


def seed(k: int, t: int) -> int:
    """The sampling seed of session ``k``'s turn ``t`` (every mode sends the same)."""
    return TURNS_PER_SEED_BLOCK * k + t


def session_turn(sampling_seed: int) -> tuple[int, int]:
    """``(k, t)`` of a request sent with ``seed(k, t)``."""
    return divmod(sampling_seed, TURNS_PER_SEED_BLOCK)


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


def sessions_through(url: str, concurrency: int, turns: int, sampling: dict[str, Any]) -> tuple[list, float]:
    """:func:`sessions` sent to the OpenAI-compatible server at ``url`` with the ``openai`` SDK."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)

    async def ask(k: int, t: int, messages: list[dict]) -> str:
        r = await client.chat.completions.create(model="tiny", messages=messages, seed=seed(k, t), **sampling)
        return r.choices[0].message.content or ""

    async def go() -> tuple[list, float]:
        try:
            return await sessions(concurrency, turns, ask)
        finally:
            await client.close()

    return asyncio.run(go())


def plain_app(policy: Any, max_tokens: int, trainer: ProxyTrainer | None = None, turns: int = 0) -> Any:
    """The baseline a user would run instead of the proxy: ``policy`` behind a minimal
    OpenAI-compatible ``POST /v1/chat/completions`` (non-streaming), with the proxy's request
    parsing and answer format, and nothing else (no sessions, recording, judge or training).

    With ``trainer`` (the control for training on): each answer the training proxy would judge
    (every turn of a ``turns``-turn session but the last, read off the request's seed) is offered
    to it with reward 1 when the session's next request arrives, as the proxy offers it once its
    next state is judged, so ``trainer`` runs the PPO steps and weight swaps the proxy's would, at
    the same points of the request stream."""
    app = FastAPI()
    answered: dict[int, Turn] = {}   # each session's latest answer, offered at its next request

    def offer(req: ChatRequest) -> None:
        k, t = session_turn(req.sampling["seed"])
        if t > 0 and k in answered:
            trainer.offer(Session(f"s{k}", f"s{k}", True), answered.pop(k), 1.0, None)

    def answer(req: ChatRequest, gen: Any, reply: dict) -> None:
        k, t = session_turn(req.sampling["seed"])
        if t < turns - 1:
            answered[k] = Turn(t, req.messages, gen, reply, req.sampling["temperature"])

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Any:
        try:
            req = parse_request(await request.body(), {}, max_tokens)
        except BadRequest as e:
            return JSONResponse({"error": {"message": str(e), "code": e.status}}, status_code=e.status)
        if trainer is not None:
            offer(req)
        gen = await policy.generate(req.messages, req.tools, **req.sampling)
        reply = assistant_message(gen.text, req.tools)
        if trainer is not None:
            answer(req, gen, reply)
        return JSONResponse({"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
                             "created": int(time.time()), "model": "tiny",
                             "choices": [{"index": 0, "message": reply, "finish_reason": finish_reason(gen, reply),
                                          "logprobs": None}], "usage": usage(gen)})

    return app


def figures(spans: list[tuple[float, float]], wall: float, over: dict[str, dict] | None = None) -> dict[str, Any]:
    """Requests/s and latency p50/p99; ``added_p50<suffix>``/``added_p99<suffix>``: over the
    figures ``over[suffix]`` (suffix ``""``: bare, ``"_http"``...), in %."""
    lat = [b - a for a, b in spans]
    out = {"requests": len(spans), "rps": round(len(spans) / wall, 2),
           "p50_ms": ms_percentile(lat, 0.5, 1), "p99_ms": ms_percentile(lat, 0.99, 1)}
    for suffix, base in (over or {}).items():
        for q in ("p50", "p99"):
            out[f"added_{q}{suffix}"] = f"{100 * (out[f'{q}_ms'] / base[f'{q}_ms'] - 1):+.1f}%"
    return out


def stalls(spans: list[tuple[float, float]], swaps: list[tuple[float, float]],
           updates: list[tuple[float, float]]) -> dict[str, Any]:
    """Latency of the requests in flight during a weight swap, during a PPO step (but no swap),
    and the others; the longest step and swap."""
    def meets(a: float, b: float, spans: list[tuple[float, float]]) -> bool:
        return any(a < s1 and b > s0 for s0, s1 in spans)

    swap = [b - a for a, b in spans if meets(a, b, swaps)]
    update = [b - a for a, b in spans if not meets(a, b, swaps) and meets(a, b, updates)]
    rest = [b - a for a, b in spans if not meets(a, b, swaps) and not meets(a, b, updates)]
    out = {"swaps": len(swaps), "swap_ms": round(1000 * max((b - a for a, b in swaps), default=0), 1),
           "update_ms": round(1000 * max((b - a for a, b in updates), default=0), 1)}
    if rest:
        out["other_p50_ms"] = ms_percentile(rest, 0.5, 1)
        if swap:
            out["during_swap_p50_ms"] = ms_percentile(swap, 0.5, 1)
            out["stall_ms"] = round(out["during_swap_p50_ms"] - out["other_p50_ms"], 1)
        if update:
            out["during_update_p50_ms"] = ms_percentile(update, 0.5, 1)
            out["update_cost_ms"] = round(out["during_update_p50_ms"] - out["other_p50_ms"], 1)
    return out


def run(levels: list[int], turns: int, max_tokens: int, batch: int, repeat: int,
        learner_nice: int = 10) -> dict[str, Any]:
    """Bare, plain HTTP (without and with the learner), proxy and proxy with training, side by
    side: for each level, each mode in turn, ``repeat`` rounds (the machine's load drifts; the
    rounds are pooled)."""
    from nextstate.agents.hf_policy import HFPolicy

    sampling = {"max_tokens": max_tokens, "temperature": 1.0}
    bare_policy = HFPolicy("tiny", max_new_tokens=max_tokens)
    http_policy = HFPolicy("tiny", max_new_tokens=max_tokens)

    async def bare(k: int, t: int, messages: list[dict]) -> str:
        return (await bare_policy.generate(messages, seed=seed(k, t), **sampling)).text

    def through(url: str, c: int) -> tuple[list, float]:
        return sessions_through(url, c, turns, sampling)

    def settle() -> None:
        """Wait until the training proxy's judges and both learners' steps are done, so that
        they do not run under the next mode's requests."""
        while training.pending or trainer.busy.is_set() or control.busy.is_set():
            time.sleep(0.01)

    cfg = Config()
    cfg.train.kl_coef, cfg.train.lr = 0.0, 1e-4
    with tempfile.TemporaryDirectory() as plain_dir, tempfile.TemporaryDirectory() as train_dir, \
            tempfile.TemporaryDirectory() as control_dir:
        plain = TrainingProxy(HFPolicy("tiny", max_new_tokens=max_tokens), Path(plain_dir), judge=RuleJudge(),
                              model_name="tiny", max_tokens=max_tokens)
        policy = HFPolicy("tiny", max_new_tokens=max_tokens)
        trainer = ProxyTrainer(policy, cfg, Path(train_dir), batch=batch, save_every=10**9, nice=learner_nice)
        training = TrainingProxy(policy, Path(train_dir), judge=RuleJudge(), trainer=trainer, model_name="tiny",
                                 max_tokens=max_tokens)
        control_policy = HFPolicy("tiny", max_new_tokens=max_tokens)
        control = ProxyTrainer(control_policy, cfg, Path(control_dir), batch=batch, save_every=10**9, nice=learner_nice)
        policies = {"bare": bare_policy, "http": http_policy, "http_train": control_policy, "proxy": plain.policy,
                    "proxy_train": policy}
        learners = {"http_train": control, "proxy_train": trainer}
        out: dict[str, Any] = {"model": "tiny", "turns": turns, "max_tokens": max_tokens, "batch": batch,
                               "repeat": repeat, "learner_nice": learner_nice, **{mode: {} for mode in policies}}
        with serving(plain_app(http_policy, max_tokens)) as http_url, serving(plain) as plain_url, \
                serving(training) as train_url, \
                serving(plain_app(control_policy, max_tokens, control, turns)) as control_url:
            asyncio.run(sessions(1, 1, bare))   # warm-ups, not timed
            for url in (http_url, control_url, plain_url, train_url):
                through(url, 1)
            modes = {"bare": lambda c: asyncio.run(sessions(c, turns, bare)), "http": lambda c: through(http_url, c),
                     "http_train": lambda c: through(control_url, c), "proxy": lambda c: through(plain_url, c),
                     "proxy_train": lambda c: through(train_url, c)}
            for c in levels:
                got: dict[str, list] = {mode: [] for mode in policies}
                walls = dict.fromkeys(got, 0.0)
                before = {mode: (p.batcher.batches, p.batcher.joined) for mode, p in policies.items()}
                first_swap = {mode: len(learner.swaps) for mode, learner in learners.items()}
                cpu = dict.fromkeys(got, 0.0)
                for _ in range(repeat):
                    for mode, go in modes.items():
                        t0 = time.process_time()
                        spans, wall = go(c)
                        settle()
                        cpu[mode] += time.process_time() - t0
                        got[mode] += spans
                        walls[mode] += wall
                fig = {"bare": figures(got["bare"], walls["bare"])}
                fig["http"] = figures(got["http"], walls["http"], {"": fig["bare"]})
                over = {"": fig["bare"], "_http": fig["http"]}
                fig["http_train"] = figures(got["http_train"], walls["http_train"], over)
                fig["proxy"] = figures(got["proxy"], walls["proxy"], over)
                fig["proxy_train"] = figures(got["proxy_train"], walls["proxy_train"],
                                             {**over, "_http_train": fig["http_train"]})
                for mode, learner in learners.items():
                    fig[mode].update(stalls(got[mode], learner.swaps[first_swap[mode]:],
                                            learner.updates[first_swap[mode]:]))
                for mode, p in policies.items():
                    out[mode][str(c)] = {**fig[mode], "cpu_ms": round(1000 * cpu[mode] / len(got[mode]), 2),
                                         "batches": p.batcher.batches - before[mode][0],
                                         "joined": p.batcher.joined - before[mode][1]}
        for mode, learner in learners.items():
            out[mode]["training_steps"] = learner.steps
        control.close()
    for p in (bare_policy, http_policy, control_policy):
        asyncio.run(p.aclose())
    return out


GROUP_MODES = {"rules_best": ("rules", "best"), "listwise_best": ("listwise", "best"),
               "listwise_random": ("listwise", "random")}


def group_run(levels: list[int], samples: list[int], turns: int, max_tokens: int, repeat: int) -> dict[str, Any]:
    """What ``--samples N`` costs: the proxy (training off) answering each main-line request with
    ``N`` candidates sampled in one batch, ranked three ways (``GROUP_MODES``): the rule ranker,
    the listwise judge on the served model itself (``--judge policy``, answering ``max_tokens``
    tokens) choosing the best, and the same judge with ``random`` choice (the ranking runs after
    the answer). ``N = 1`` is the proxy without group sampling (one mode). For each level the
    configurations alternate, ``repeat`` rounds; ``added_p50``/``added_p99``: over ``N = 1``."""
    from nextstate.agents.hf_policy import HFPolicy
    from nextstate.train.config import GroupConfig
    from nextstate.train.proxy.group import make_ranker

    sampling = {"max_tokens": max_tokens, "temperature": 1.0}
    configs: dict[str, TrainingProxy] = {}
    dirs = []
    for n in samples:
        for mode, (ranker, choose) in (GROUP_MODES.items() if n > 1 else [("none", (None, None))]):
            dirs.append(tempfile.TemporaryDirectory())
            policy = HFPolicy("tiny", max_new_tokens=max_tokens)
            group = GroupConfig(samples=n, ranker=ranker or "rules", choose=choose or "best")
            rank = make_ranker(ranker, policy, max_tokens=max_tokens) if ranker else None
            configs[f"{n}/{mode}"] = TrainingProxy(policy, Path(dirs[-1].name), judge=RuleJudge(), model_name="tiny",
                                                   max_tokens=max_tokens, group=group, ranker=rank)
    out: dict[str, Any] = {"model": "tiny", "turns": turns, "max_tokens": max_tokens, "repeat": repeat,
                           "samples": samples, **{name: {} for name in configs}}
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(serving(proxy)) for name, proxy in configs.items()}
        for url in urls.values():
            sessions_through(url, 1, 1, sampling)   # warm-up, not timed
        for c in levels:
            got: dict[str, list] = {name: [] for name in configs}
            walls = dict.fromkeys(configs, 0.0)
            before = {name: proxy.policy.batcher.batches for name, proxy in configs.items()}
            for _ in range(repeat):
                for name, url in urls.items():
                    spans, wall = sessions_through(url, c, turns, sampling)
                    while configs[name].pending:   # a random choice's rankings finish before the next config
                        time.sleep(0.01)
                    got[name] += spans
                    walls[name] += wall
            base = figures(got["1/none"], walls["1/none"]) if "1/none" in got else None
            for name, proxy in configs.items():
                fig = figures(got[name], walls[name], {"": base} if base and not name.startswith("1/") else None)
                out[name][str(c)] = {**fig, "batches": proxy.policy.batcher.batches - before[name]}
    for d in dirs:
        d.cleanup()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="1,8,32", help="concurrency levels, comma-separated")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8, help="judged turns per training step (training on)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds per level (modes alternate)")
    ap.add_argument("--learner-nice", type=int, default=10, help="the learner thread's priority below serving")
    ap.add_argument("--samples", default=None,
                    help="group sizes N, comma-separated (e.g. 1,4,8): measure --samples N instead (training off)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    levels = [int(x) for x in args.sessions.split(",")]
    if args.samples:
        samples = [int(x) for x in args.samples.split(",")]
        if min(samples) < 1:
            ap.error("--samples sizes must be at least 1")
        report(group_run(levels, samples, args.turns, args.max_tokens, args.repeat), args.json)
        return
    report(run(levels, args.turns, args.max_tokens, args.batch, args.repeat, args.learner_nice), args.json)


if __name__ == "__main__":
    main()
