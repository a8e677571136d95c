"""``python -m train``: train a policy on a nextstate environment.

    python -m train --env terminal                      # embedded defaults (tiny model on a CPU)
    python -m train --env swe --model Qwen/Qwen3-8B --parallel 32 --judge http://judge:8000
    python -m train --env terminal --backend verl --dry-run
    python -m train --env terminal --model smollm2 --judge rules env.tasks=outdir:train   # SmolLM2-135M, no hub
    python -m train --env terminal --steps 50 train.lr=1e-5 rollout.samples_per_task=4
    python -m train --env relay --agents reader=tiny-untied,writer=tiny-untied   # two policies, each on its role
    python -m train --env relay --agents reader+writer=tiny-untied    # one policy shared by both roles

Settings come from ``configs/<env>.yaml`` (or ``--config``), then the flags,
then ``section.key=value`` overrides. Without a GPU and without ``--model``
the run uses the ``tiny`` model and the file's ``cpu_demo`` section. A bad
configuration is reported on one line with exit code 2.
"""

from __future__ import annotations

import os
import sys

from nextstate.train.interrupt import INTERRUPT
if __name__ == "__main__":   # before the slow imports below
    INTERRUPT.install()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

from nextstate.agents.presets import PRESETS  # noqa: E402
from nextstate.envs import registry  # noqa: E402
from nextstate.train.config import Config, ConfigError, judge_overrides, load_config, policy_roles  # noqa: E402
from nextstate.train.wiring import check_model, probe_judge, probe_server  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m train", description="Train a policy on a nextstate environment.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--env", default="terminal",
                   help=f"a registered env family: {', '.join(registry.names())} (default terminal); "
                   "or MODULE:NAME (imports MODULE, which registers NAME), or NAME when its module is named NAME")
    p.add_argument("--parallel", type=int, help="episodes (sandboxes) at once")
    p.add_argument("--config", help="config file (default the family's packaged configs/<env>.yaml)")
    p.add_argument("--model", help="HF hub name, local model directory, or a preset: "
                   f"{', '.join(PRESETS)}")
    p.add_argument("--agents", metavar="ROLE=MODEL[,ROLE=MODEL...]",
                   help="several policies, one per entry (ROLE+ROLE=MODEL: one policy shared by those roles)")
    p.add_argument("--judge", help="'policy' (the policy's own model), 'rules' (exit codes and invalid "
                   "actions), 'none', or an OpenAI-compatible URL")
    p.add_argument("--backend", default="local", help="local (one process, CPU or one GPU) or verl (Ray cluster)")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--output", help="run directory (default runs/<env>)")
    p.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint")
    p.add_argument("--dry-run", action="store_true", help="print the composed config and exit")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return p.parse_args(argv)


def has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The flags as ``key=value`` overrides (applied before the explicit ones)."""
    out = []
    if args.parallel is not None:
        out.append(f"rollout.parallel={args.parallel}")
    if args.model:
        out.append(f"model.name={args.model}")
    for entry in (args.agents or "").split(","):
        if entry.strip():
            if "=" not in entry:
                raise ConfigError(f"--agents takes ROLE=MODEL entries, got {entry!r}")
            out.append(f"agents.{entry.strip()}")
    if args.steps is not None:
        out.append(f"run.steps={args.steps}")
    if args.output:
        out.append(f"run.output={args.output}")
    if args.judge:
        out += judge_overrides(args.judge)
    return out


def build_config(args: argparse.Namespace) -> tuple[Config, bool]:
    """The run's config, and whether the CPU demo settings are in use."""
    if args.backend not in ("local", "verl"):
        raise ConfigError(f"--backend must be local or verl, got {args.backend!r}")
    try:
        env = registry.resolve(args.env)   # "mypkg.envs:count" imports mypkg.envs, which registers count
    except ValueError as e:
        raise ConfigError(str(e)) from None
    agent_models = {e.split("=", 1)[1].strip() for e in (args.agents or "").split(",") if "=" in e}
    sized = {name for name, preset in PRESETS.items() if preset.cpu_demo}   # the demo's models
    demo = args.model in sized or bool(agent_models) and agent_models <= sized or \
        (args.backend == "local" and args.model is None and not args.agents and not has_gpu())
    cfg = load_config(env, args.config, flag_overrides(args) + list(args.overrides), cpu_demo=demo)
    cfg.run.output = cfg.run.output.format(env=cfg.env.family)
    if demo and args.parallel is not None and not any(o.startswith("rollout.tasks_per_step=") for o in args.overrides):
        # the demo sizes a step from --parallel: N episodes at once, N / samples_per_task tasks
        cfg.rollout.tasks_per_step = max(1, cfg.rollout.parallel // cfg.rollout.samples_per_task)
    if args.backend == "verl" and len(policy_roles(cfg)) > 1 and cfg.opd.mode != "rl":
        raise ConfigError(f"opd.mode={cfg.opd.mode} with several policies runs on --backend local only for now")
    if args.backend == "local" or not args.dry_run:
        for model in cfg.agents.values() or [cfg.model.name]:
            check_model(model)
    if cfg.judge.mode == "url" and not args.dry_run:
        cfg.judge.model = probe_server(cfg.judge.url or "", cfg.judge.model, "judge.model")
        probe_judge(cfg.judge.url or "", cfg.judge.model)
    return cfg, demo


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=os.environ.get("NEXTSTATE_LOG", "WARNING"),
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        INTERRUPT.catching = True
        cfg, demo = build_config(args)
        if args.backend == "verl":
            from nextstate.train.verl_backend.launch import launch
            return launch(cfg, dry_run=args.dry_run, resume=args.resume)
        if args.dry_run:
            print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
            return 0
        return run_local(cfg, demo, args.resume)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError) as e:   # the latter: an interrupted event loop
        if isinstance(e, asyncio.CancelledError) and not INTERRUPT.raised:
            raise
        INTERRUPT.report()
        return 130


def run_local(cfg: Config, demo: bool, resume: bool) -> int:
    from nextstate.train.local import LocalTrainer

    output = Path(cfg.run.output)
    if demo:   # the tiny model runs far slower on a loaded 2-core machine with more than one torch thread
        import torch
        torch.set_num_threads(1)
    note = " (cpu_demo settings: tiny model on CPU)" if demo else ""
    models = ",".join(f"{k}={v}" for k, v in cfg.agents.items()) or cfg.model.name
    print(f"nextstate train: env={cfg.env.family} model={models} backend=local "
          f"steps={cfg.run.steps} tasks x samples={cfg.rollout.tasks_per_step}x{cfg.rollout.samples_per_task} "
          f"parallel={cfg.rollout.parallel} judge={cfg.judge.mode} output={output}{note}", file=sys.stderr)
    trainer = LocalTrainer(cfg, output, resume=resume)
    rows = trainer.run()
    last = rows[-1] if rows else {}
    print(f"done: {len(rows)} steps logged, last step {last.get('step', 0)}; metrics {output / 'metrics.jsonl'}, "
          f"plot {output / 'curves.png'}, checkpoints {output / 'checkpoints'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    INTERRUPT.exit(main())
