"""The training proxy's command line: ``python -m train.proxy`` from the repository root,
``python -m nextstate.train.proxy`` or ``nextstate-proxy`` anywhere.

The trainer's settings are a :class:`~train.config.Config` built as ``python -m train`` builds
its own: the proxy's defaults, then the flags, then ``--set key=value`` overrides, validated; a
bad one is reported on one line with exit code 2. The judge and the hint source are the ones
the env loop makes from a config (:func:`train.wiring.make_judge`, :func:`~train.wiring.make_hinter`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import nextstate.train.proxy as package
from nextstate.train import checkpoint
from nextstate.train.config import Config, ConfigError, config_from_dict, judge_overrides, merge, parse_overrides
from nextstate.train.proxy.app import serve
from nextstate.train.proxy.group import make_ranker
from nextstate.train.proxy.rubric import Rubric, load_versions, make_source
from nextstate.train.proxy.service import JUDGE_TEMPLATES, TrainingProxy
from nextstate.train.proxy.trainer import ProxyTrainer
from nextstate.train.wiring import judge_backend, make_hinter, make_judge

MODES = ("rl", "opd", "combine")
DEFAULTS = ["train.kl_coef=0.0",        # no reference model unless asked for (--set train.kl_coef=...)
            "rollout.temperature=1.0"]  # the learner's log-probs: turns sampled at another temperature do not train


def parser() -> argparse.ArgumentParser:
    """The proxy's flags."""
    p = argparse.ArgumentParser(prog="python -m train.proxy", description=package.__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a preset (tiny, smollm2, ...), a local path or a hub name")
    p.add_argument("--output", required=True, help="run folder (rollouts.jsonl, metrics, checkpoints)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--judge", default="rules", help="rules | policy | none | an OpenAI-compatible URL")
    p.add_argument("--votes", type=int, default=1, help="m: judge answers per turn")
    p.add_argument("--hints", action="store_true", help="ask the LLM judge for hindsight hints")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer <key>")
    p.add_argument("--mode", choices=MODES, default="rl",
                   help="rl: the vote; opd: hinted turns only, the teacher's token advantages; combine: both")
    p.add_argument("--hint-source", default=None,
                   help="OPD's hints: rules | policy | none | a URL (default: --judge's LLM, else rules)")
    p.add_argument("--wait-outcome", action="store_true",
                   help="judged turns train once their session's outcome is reported, with reward outcome + vote")
    p.add_argument("--samples", type=int, default=None,
                   help="N candidates per main-line request, ranked as a group (group.samples; default 1: none)")
    p.add_argument("--ranker", choices=("auto", "listwise", "rules"), default=None,
                   help="ranks a group: listwise (the LLM judge), rules (a rule baseline); auto: listwise "
                        "when --judge is an LLM")
    p.add_argument("--choose", choices=("best", "random"), default=None,
                   help="the candidate returned: the best, or a random one (on-policy for the user)")
    p.add_argument("--group-reward", choices=("rank", "quality_gate"), default=None,
                   help="a candidate's reward: the ranker's score, or the quality gate times the weighted "
                        "sum of score, relevance and diversity (weights: --set group.weight_*=...)")
    p.add_argument("--rubric", choices=("off", "llm", "rules"), default="off",
                   help="an evolving judge rubric from the user's stated preferences: llm (the judge's LLM "
                        "detects and merges them), rules (a rule baseline)")
    p.add_argument("--rubric-every", type=int, default=3,
                   help="user messages that must pass between two rubric changes")
    p.add_argument("--rubric-pin", action="store_true", help="keep the rubric as it is (preferences recorded only)")
    p.add_argument("--rubric-reset", action="store_true", help="start the rubric over (a new version with none)")
    p.add_argument("--resume", action="store_true",
                   help="go on in --output: the last checkpoint's weights, optimizer and step, the rubric's versions")
    p.add_argument("--batch", type=int, default=16, help="judged turns per training step")
    p.add_argument("--no-train", action="store_true", help="serve, record and judge only")
    p.add_argument("--save-every", type=int, default=10, help="training steps between checkpoints")
    p.add_argument("--learner-nice", type=int, default=10,
                   help="how far below serving the learner thread's CPU priority is (Linux; 0: the same)")
    p.add_argument("--max-tokens", type=int, default=2048, help="the largest max_tokens a request may ask")
    p.add_argument("--max-body-mb", type=int, default=4, help="the largest request body, in MiB")
    p.add_argument("--served-name", default=None, help="the model name /v1/models reports")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="trainer settings, e.g. train.lr=1e-5 train.kl_coef=0.01 (repeatable; they win over the flags)")
    return p


def build_config(args: argparse.Namespace) -> Config:
    """The trainer's settings: the proxy's defaults, the flags (``--mode``, ``--judge``, ``--votes``,
    ``--hints``), then ``--set``; raises :class:`ConfigError` on one line."""
    flags = [*DEFAULTS, f"opd.mode={args.mode}", *judge_overrides(args.judge), f"judge.votes={args.votes}",
             f"judge.hints={args.hints}"]
    flags += [f"group.{key}={value}" for key, value in (("samples", args.samples), ("ranker", args.ranker),
                                                        ("choose", args.choose), ("reward", args.group_reward))
              if value is not None]
    return config_from_dict(parse_overrides(flags + list(args.set or [])))


def hinter_config(cfg: Config, source: str) -> Config:
    """``cfg`` as :func:`make_hinter` reads it for ``--hint-source source``: ``rules``, or an LLM
    (``policy``, a URL) in the judge's place."""
    hints = ["opd.hint_source=rules"] if source == "rules" else \
        ["opd.hint_source=judge", *judge_overrides(source, "--hint-source")]
    return config_from_dict(merge(cfg.to_dict(), parse_overrides(hints)))


def make_group_ranker(cfg: Config, policy: Any) -> Any:
    """The ranker of ``--samples`` groups (None without group sampling): ``group.ranker``, where
    ``auto`` is ``listwise`` on the judge's LLM when ``--judge`` is one, else ``rules``."""
    g, j = cfg.group, cfg.judge
    if g.samples <= 1:
        return None
    llm = j.mode in ("policy", "url")
    name = g.ranker if g.ranker != "auto" else ("listwise" if llm else "rules")
    if name == "listwise" and not llm:
        raise ConfigError(f"--ranker listwise needs an LLM judge (--judge policy or a URL), not --judge {j.mode}")
    return make_ranker(name, judge_backend(cfg, policy) if name == "listwise" else None, m=j.votes,
                       temperature=j.temperature, max_tokens=j.max_tokens)


def make_rubric(args: argparse.Namespace, cfg: Config, policy: Any, output: Path) -> Rubric | None:
    """The evolving rubric ``--rubric`` asks for (None: off), with the versions ``--output``'s
    ``rollouts.jsonl`` holds on ``--resume``."""
    if args.rubric == "off":
        return None
    j = cfg.judge
    if args.rubric == "llm" and j.mode not in ("policy", "url"):
        raise ConfigError(f"--rubric llm needs an LLM judge (--judge policy or a URL), not --judge {j.mode}")
    source = make_source(args.rubric, judge_backend(cfg, policy) if args.rubric == "llm" else None,
                         temperature=j.temperature, max_tokens=j.max_tokens)
    versions = load_versions(output / "rollouts.jsonl") if args.resume else []
    return Rubric(source, every=args.rubric_every, pinned=args.rubric_pin, versions=versions, reset=args.rubric_reset)


def build(args: argparse.Namespace) -> TrainingProxy:
    """The proxy a command line asks for."""
    import torch

    from nextstate.agents.hf_policy import HFPolicy

    if args.batch < 1:
        raise ConfigError("--batch must be at least 1")
    if args.rubric_every < 1:
        raise ConfigError("--rubric-every must be at least 1")
    cfg = build_config(args)
    source = args.hint_source or (args.judge if args.judge not in ("none", "rules") else "rules")
    hint_cfg = hinter_config(cfg, source) if source != "none" else None
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt = checkpoint.latest(output) if args.resume else None
    if args.resume:
        print(f"--resume: {f'from {ckpt}' if ckpt else f'no checkpoint under {output}: from {args.model}'}",
              file=sys.stderr, flush=True)
    model = str(ckpt / "model") if ckpt is not None else args.model
    try:
        policy = HFPolicy(model, device=device, seed=args.seed, max_new_tokens=args.max_tokens)
    except OSError as e:
        raise ConfigError(f"cannot load model {model!r}: {str(e).splitlines()[0]}") from None
    judge = make_judge(cfg, policy, JUDGE_TEMPLATES)
    hinter = make_hinter(hint_cfg, policy, JUDGE_TEMPLATES) if hint_cfg is not None else None
    ranker = make_group_ranker(cfg, policy)
    rubric = make_rubric(args, cfg, policy, output)
    trainer = (ProxyTrainer(policy, cfg, output, args.batch, args.save_every, nice=args.learner_nice, resume=ckpt)
               if not args.no_train else None)
    (output / "proxy.json").write_text(json.dumps({**vars(args), "api_key": bool(args.api_key),
                                                   "config": cfg.to_dict()}, indent=1, default=str) + "\n")
    return TrainingProxy(policy, output, judge=judge, hinter=hinter, trainer=trainer,
                         wait_outcome=args.wait_outcome, model_name=args.served_name or args.model,
                         max_tokens=args.max_tokens, max_body_bytes=args.max_body_mb << 20, api_key=args.api_key,
                         group=cfg.group, ranker=ranker, seed=args.seed, rubric=rubric)


def main(argv: list[str] | None = None) -> int:
    """Serve until Ctrl-C (exit 130); a bad flag or setting exits 2 with one line."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        proxy = build(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"serving {args.model} on http://{args.host}:{args.port}/v1 (output {args.output})", flush=True)
    return serve(proxy, args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
