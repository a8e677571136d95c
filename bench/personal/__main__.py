"""Benchmark: the personal-agent track (OpenClaw-RL's student and teacher) through the training proxy.

``python -m bench.personal [--model tiny|smollm2] [--users student teacher] [--variants none rl opd combine]
[--rubrics off rules llm] [--seeds 0 1 2] [--interactions N] [--json]``

For every user, variant, rubric and seed, one fresh ``train.proxy`` (built by its own command
line, :func:`train.proxy.__main__.build`, served over HTTP in this process) and one simulated
user. An interaction is one session: the user asks about a new generated case, the model answers
(the **first answer**, which the user's rule scorer scores, 0 to 1 in steps of 0.25), the user
replies in words (a correction, a re-ask, approval, or nothing), and that reply goes to the proxy
as the session's next request (answered in at most 16 tokens, then the session ends): the first
answer's next state.
The proxy's judge and hint source are the bench's rule readers of the reply and the rubric
(:mod:`bench.personal.judge`). Variants (``--mode``): ``none`` (no training: the control), ``rl``
(binary RL on the reply's vote), ``opd`` (the correction as the hint), ``combine``; each with the
evolving rubric ``--rubric off``, ``rules`` or ``llm`` (the served model as its LLM). ``none``
runs once, with ``off``.

Per user and ``variant/rubric`` the JSON holds the seed-mean score of the first answers over the
interactions in ``--blocks`` equal blocks (``curve``), ``first`` and ``last`` (the first and last
block), ``gain`` (last minus first) with its Student-t 95% interval over seeds (``gain_ci95``),
``mean`` with ``mean_ci95``, and the per-seed runs (scores, reply counts, training steps, rubric
versions); then ``gain_over_none`` (each variant's gain minus the control's), the model, its
protocol, and the paper's reported trend. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import report as show
from bench.learning import ci95

VARIANTS = ("none", "rl", "opd", "combine")
RUBRICS = ("off", "rules", "llm")
FOLLOW_UP_TOKENS = 16   # the answer to the reply ends the session: never scored nor trained, so kept short
RUBRIC_EVERY = 3       # the proxy's default bound: user messages between two rubric changes
PAPER_INTERACTIONS = {"student": 36, "teacher": 24}
PAPER = ("OpenClaw-RL (arXiv 2603.10165), personal track: with the combined method (binary RL + OPD), an LLM "
         "scorer saw the first answers' score change visibly after 36 student and 24 teacher interactions")
# the proxy's settings per model: tiny's rate as the proxy's CPU demo, smollm2's as bench.learning's
MODELS = {
    "tiny": {"max_tokens": 48, "batch": 4, "set": ["train.lr=3e-4", "train.micro_batch_size=16"]},
    "smollm2": {"max_tokens": 160, "batch": 4, "set": ["train.lr=1e-5", "train.micro_batch_size=2"]},
}


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m bench.personal", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", choices=list(MODELS))
    p.add_argument("--users", nargs="+", default=list(PAPER_INTERACTIONS), help="registered users (student, teacher)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--rubrics", nargs="+", default=["off", "rules"], choices=RUBRICS,
                   help="the evolving judge: off, rules (the rule baseline), llm (the served model)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--interactions", type=int, help="per run (default: the paper's, 36 student, 24 teacher)")
    p.add_argument("--blocks", type=int, default=4, help="blocks of the score curve")
    p.add_argument("--comment-rate", type=float, default=0.5,
                   help="the share of answers the user comments on (else it says 'Okay.')")
    p.add_argument("--batch", type=int, help="the proxy's --batch (default: the model's)")
    p.add_argument("--output", help="keep the runs here (default: a temporary directory)")
    p.add_argument("--json", action="store_true")
    return p


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with ``args`` (one line), else None."""
    if args.interactions is not None and args.interactions < 1:
        return "--interactions must be at least 1"
    if args.blocks < 1 or (args.interactions is not None and args.blocks > args.interactions):
        return "--blocks must be from 1 to --interactions"
    if not 0 <= args.comment_rate <= 1:
        return "--comment-rate must be from 0 to 1"
    if args.batch is not None and args.batch < 1:
        return "--batch must be at least 1"
    from bench.personal.users import USERS   # the proxy's package: imported only once the numbers are good

    unknown = [u for u in args.users if u not in USERS]
    return f"unknown user {unknown[0]!r}; registered: {', '.join(sorted(USERS))}" if unknown else None


def runs_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The ``(variant, rubric)`` pairs to run: ``none`` (nothing trains, so no judge) once, without a rubric."""
    return [("none", "off")] * ("none" in args.variants) + \
        [(v, r) for v in args.variants if v != "none" for r in args.rubrics]


def proxy_argv(args: argparse.Namespace, variant: str, rubric: str, seed: int, out: Path) -> list[str]:
    """The proxy's command line for one run (``none``: ``--no-train``)."""
    m = MODELS[args.model]
    argv = ["--model", args.model, "--output", str(out), "--judge", "policy" if rubric == "llm" else "none",
            "--hint-source", "none", "--rubric", rubric, "--rubric-every", str(RUBRIC_EVERY),
            "--batch", str(args.batch or m["batch"]), "--seed", str(seed), "--max-tokens", str(m["max_tokens"]),
            "--learner-nice", "0"]
    argv += ["--no-train"] if variant == "none" else ["--mode", variant]
    return argv + [x for s in m["set"] for x in ("--set", s)]


def run_one(args: argparse.Namespace, user_name: str, variant: str, rubric: str, seed: int,
            out: Path) -> dict[str, Any]:
    """One run: a fresh proxy, ``interactions`` sessions of the user; the first answers' scores."""
    import httpx
    import openai

    from nextstate.train.proxy.__main__ import build, parser as proxy_parser
    from nextstate.train.proxy.app import serving

    from bench.personal.judge import ReplyHints, ReplyJudge
    from bench.personal.users import make_user

    start = time.monotonic()
    proxy = build(proxy_parser().parse_args(proxy_argv(args, variant, rubric, seed, out)))
    proxy.judge = ReplyJudge()   # the rule reader of the user's reply (and of the rubric)
    proxy.hinter = ReplyHints() if variant in ("opd", "combine") else None
    user = make_user(user_name, comment_rate=args.comment_rate)
    rng = random.Random(f"{user_name}-{seed}")
    n = args.interactions or PAPER_INTERACTIONS[user_name]
    max_tokens = MODELS[args.model]["max_tokens"]
    scores, kinds = [], {"approval": 0, "correction": 0, "reask": 0, "silent": 0}
    with serving(proxy) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        for i in range(n):
            case = user.case(rng)
            messages = [{"role": "user", "content": user.ask(case)}]
            headers = {"X-Session-Id": f"{user_name}-{i}", "X-Turn-Type": "main"}
            first = client.chat.completions.create(model=args.model, messages=messages, temperature=1.0,
                                                   max_tokens=max_tokens, seed=seed * 100000 + i,
                                                   extra_headers=headers)
            text = first.choices[0].message.content or ""
            scores.append(user.score(text, case))
            kind, words = user.reply(text, case, rng)
            kinds[kind] += 1
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": words}]
            client.chat.completions.create(model=args.model, messages=messages, temperature=1.0,
                                           max_tokens=FOLLOW_UP_TOKENS,
                                           extra_headers={**headers, "X-Session-Done": "true"})
        base = url.removesuffix("/v1")
        while (h := httpx.get(f"{base}/health", timeout=60).json())["judging"] or h["training"]:
            time.sleep(0.2)
    result = {"seed": seed, "scores": scores, "replies": kinds, "trained_steps": h["trained_steps"],
              "version": h["version"], **({"rubric_version": h["rubric_version"]} if "rubric_version" in h else {}),
              "wall_s": round(time.monotonic() - start, 1)}
    (out / "result.json").write_text(json.dumps(result) + "\n")   # a finished run survives an interrupted bench
    return result


def blocks(scores: list[float], k: int) -> list[float]:
    """The mean of ``scores`` in ``k`` consecutive blocks of (nearly) equal size."""
    n = len(scores)
    edges = [round(i * n / k) for i in range(k + 1)]
    return [sum(scores[a:b]) / (b - a) for a, b in zip(edges, edges[1:]) if b > a]


def summarize(runs: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """Seed means of one variant's runs: the block curve, first, last, gain and mean with their 95% intervals."""
    curves = [blocks(r["scores"], k) for r in runs]
    gains = [c[-1] - c[0] for c in curves]
    means = [sum(r["scores"]) / len(r["scores"]) for r in runs]
    seed_mean = [round(sum(c[j] for c in curves) / len(curves), 4) for j in range(len(curves[0]))]
    return {"curve": seed_mean, "first": seed_mean[0], "last": seed_mean[-1],
            "gain": round(sum(gains) / len(gains), 4), "gain_ci95": ci95(gains),
            "mean": round(sum(means) / len(means), 4), "mean_ci95": ci95(means), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problem = check(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    import logging

    from nextstate.train.config import ConfigError
    logging.getLogger("nextstate").setLevel(logging.WARNING)
    started = time.monotonic()
    root = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="bench-personal-"))
    users: dict[str, Any] = {}
    try:
        for user in args.users:
            found: dict[str, list[dict[str, Any]]] = {}
            for seed in args.seeds:
                for variant, rubric in runs_of(args):
                    name = f"{variant}/{rubric}"
                    print(f"[bench.personal] {user} {name} seed {seed}", file=sys.stderr, flush=True)
                    try:
                        run = run_one(args, user, variant, rubric, seed, root / user / f"{variant}-{rubric}-seed{seed}")
                    except Exception as e:   # a proxy that cannot start or answer: one line, not a traceback
                        first = str(e).splitlines()[0] if str(e) else ""
                        print(f"error: {user} {name} seed {seed}: {type(e).__name__}: {first}", file=sys.stderr)
                        return 2 if isinstance(e, ConfigError) else 1
                    found.setdefault(name, []).append(run)
            variants = {name: summarize(runs, args.blocks) for name, runs in found.items()}
            control = variants.get("none/off")
            users[user] = {"interactions": args.interactions or PAPER_INTERACTIONS[user], "variants": variants,
                           **({"gain_over_none": {name: round(v["gain"] - control["gain"], 4)
                                                  for name, v in variants.items() if name != "none/off"}}
                              if control else {})}
    finally:
        if not args.output:
            shutil.rmtree(root, ignore_errors=True)
    m = MODELS[args.model]
    show({"users": users, "model": args.model,
          "protocol": {"scorer": "rules (0 to 1 in steps of 0.25; no LLM)", "users": "rule-written replies",
                       "judge": "rules: bench.personal.judge.ReplyJudge / ReplyHints",
                       "comment_rate": args.comment_rate, "batch": args.batch or m["batch"],
                       "max_tokens": m["max_tokens"], "follow_up_tokens": FOLLOW_UP_TOKENS, "set": m["set"],
                       "temperature": 1.0, "rubric_every": RUBRIC_EVERY, "blocks": args.blocks},
          "paper": PAPER, "seeds": args.seeds, "wall_s": round(time.monotonic() - started, 1)}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
