"""Benchmark: what do step judges and hindsight hints add over outcome-only RL? Side by side.

``python -m bench.learning [--model tiny|smollm2] [--families F ...] [--variants V ...] [--seeds 0 1 2]
[--steps N] [--json]`` starts each task family from one supervised warm start (the model,
``tiny`` by default, fine-tuned by :mod:`train.sft` on the family's "hasty" behaviour policy,
with the model's protocol of :data:`MODELS`) and trains
each variant with the same seeds and the same step budget through the local backend
(real Docker sandboxes, real updates):

* ``outcome``: outcome-only GRPO (``advantage.key=outcome``, no judge);
* ``step_index``: outcome + rule step judge (``judge.mode=rules``), normalized per
  (task group, step index), the paper's recipe;
* ``opd``: On-Policy Distillation only, hints from the rule-based source (the last line
  of a failed command), teacher = the frozen warm start;
* ``combine``: ``step_index`` + OPD (``A_t = log pi_teacher - log pi_old + A_rl``);
* ``shuffled``: ``step_index`` with the judge's votes permuted across the batch's steps
  (a control: its gain over ``outcome`` must vanish if the votes' placement matters; not
  run on ``procedural``, whose rule votes are +1 on nearly every step);
* ``step_index_llm`` and ``opd_llm``: ``step_index`` and ``opd`` with the model itself as the
  judge (``judge.mode=policy``) and as the hint source (``opd.hint_source=judge``), the trained
  weights asked as training asks them, at 160 tokens an answer and an hour per request (on 2
  CPU cores the default 60 s would cut every answer off); not in the defaults (each judged step
  costs a generation);
* ``state``: outcome + rule judge, grouped by identical observed state;
* ``trajectory``: outcome + rule judge, the outcome normalized per task group (one value per
  episode) plus each vote minus its episode's mean vote (:mod:`train.advantage`): the
  number of steps adds no credit.

Families: ``procedural`` (the 4-word control, :mod:`envs.terminal.procedural`, where every
command exits 0) and ``outdir`` (:mod:`envs.terminal.outdir`, whose next states carry what the
instruction does not); and ``relay`` (:mod:`envs.relay`, two agents), whose variants are
``shared`` (one policy plays both roles) and ``non_shared`` (one policy per role), both from the
same warm start (one model fine-tuned on both roles' hasty steps) with the same budget: its
figures form the JSON's ``multi_agent`` section, with each agent's own held-out measures. Each run evaluates the serving model on held-out instances
(seeds never trained on) before its first update, every ``eval.every`` steps and at
its end. Per family and variant the JSON holds ``before``, ``after``, ``auc`` (the mean
held-out success over a run's evaluations), ``auc_ci95`` (Student-t interval of the
per-seed AUCs), ``steps_to_0.8`` (the first evaluated step whose seed-mean success
reaches 0.8; null when none does), ``gain``, ``episode_length`` (the mean over a run's
training steps of ``episode/length_mean``, then over seeds) and the per-seed runs; then
``next_state_family``, ``auc_gain_over_outcome`` (per family, each variant's AUC minus
outcome-only's), ``seeds``, ``steps``, ``wall_s``. ``--collect DIR ...`` trains nothing and
prints the same object from the finished runs of earlier ``--output`` folders (the runs not
finished are listed under ``missing``). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench import report as show

RULE_HINTS = ["opd.hint_source=rules", "opd.teacher=reference"]
# the model as its own judge or hint source: answers as long as bench.judge_agreement measured them
LLM_JUDGE = ["judge.max_tokens=160", "judge.timeout=3600"]
VARIANTS = {
    "outcome": ["advantage.key=outcome", "judge.mode=none"],
    "step_index": ["advantage.key=step_index", "judge.mode=rules"],
    "opd": ["opd.mode=opd", *RULE_HINTS, "advantage.key=outcome", "judge.mode=none"],
    "combine": ["opd.mode=combine", *RULE_HINTS, "advantage.key=step_index", "judge.mode=rules"],
    "shuffled": ["advantage.key=step_index", "judge.mode=rules", "advantage.shuffle_votes=true"],
    "step_index_llm": ["advantage.key=step_index", "judge.mode=policy", *LLM_JUDGE],
    "opd_llm": ["opd.mode=opd", "opd.hint_source=judge", "opd.teacher=reference", "advantage.key=outcome",
                "judge.mode=none", *LLM_JUDGE],
    "state": ["advantage.key=state", "judge.mode=rules"],
    "trajectory": ["advantage.key=trajectory", "judge.mode=rules"],
}
DEFAULT_VARIANTS = ["outcome", "step_index", "opd", "combine", "shuffled"]
FAMILIES = {
    "procedural": [],   # the CPU demo's family as configs/terminal.yaml's cpu_demo sets it
    "outdir": ["env.tasks=outdir:train", "eval.tasks=outdir:heldout", "sft.tasks=outdir:0:64", "env.max_steps=4"],
    "relay": [],        # two agents, as configs/relay.yaml's cpu_demo sets it: the multi_agent section
}
# relay's variants: one policy for both roles, or one per role; both from the same warm start
MULTI_AGENT_FAMILY = "relay"
MULTI_AGENT = {"shared": ["agents.reader+writer={warm}"], "non_shared": ["agents.reader={warm}", "agents.writer={warm}"]}
NEXT_STATE_FAMILY = "outdir"
# the protocol per model, before the family's and the user's overrides. The CPU demo's settings are
# sized for tiny (no system turn, a long warm start at a high rate). smollm2 reads a system turn and
# imitates fast, so its warm start imitates the hasty behaviour policy (its own success about 0.47
# on outdir), and is kept short: chosen by its held-out success alone, before any RL run was seen
# (2026-12-03: 5 steps 0/16, 10 steps 2/16, 20 steps 15/16, which leaves RL nothing to show);
# 2 tasks x 4 samples a step and micro-batches of 2 fit 2 cores and 24 GiB; RL trains at a rate
# for a 135M model
MODELS = {
    "tiny": [],
    "smollm2": ["model.name=smollm2", "sft.source=hasty", "sft.steps=10", "sft.lr=1e-4", "sft.batch_size=4",
                "rollout.system_prompt=true", "rollout.max_response_tokens=96", "rollout.max_context_tokens=4096",
                "rollout.tasks_per_step=2", "train.lr=1e-5", "train.micro_batch_size=2"],
}
# the control's rule votes are +1 on (nearly) every step: shuffling them would rerun step_index
SKIP = {"procedural": {"shuffled"}}
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def curve(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """``(step, held-out success)`` at every evaluation of a run, in step order."""
    return [(int(r["step"]), float(r["eval/success"])) for r in rows
            if isinstance(r.get("eval/success"), (int, float))]


def ci95(xs: list[float]) -> list[float]:
    """Student-t 95% interval of the mean of ``xs`` (the mean twice for one value)."""
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return [round(m, 4), round(m, 4)]
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    half = T95.get(len(xs) - 1, 1.96) * sd / math.sqrt(len(xs))
    return [round(m - half, 4), round(m + half, 4)]


def steps_to(runs: list[dict[str, Any]], level: float = 0.8) -> int | None:
    """The first evaluated step at which the seed-mean held-out success reaches ``level``."""
    steps = sorted({s for r in runs for s, _ in r["curve"]})
    for step in steps:
        points = [p for r in runs for s, p in r["curve"] if s == step]
        if len(points) == len(runs) and sum(points) / len(points) >= level:
            return step
    return None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed means, the AUC's 95% interval and steps to 0.8 of one variant's runs."""
    def mean(xs: list[float]) -> float:
        return round(sum(xs) / len(xs), 4)
    return {"before": mean([r["before"] for r in runs]), "after": mean([r["after"] for r in runs]),
            "auc": mean([r["auc"] for r in runs]), "auc_ci95": ci95([r["auc"] for r in runs]),
            "steps_to_0.8": steps_to(runs), "gain": mean([r["after"] - r["before"] for r in runs]),
            **({"episode_length": mean([r["episode_length"] for r in runs])}
               if all("episode_length" in r for r in runs) else {}),
            "runs": runs}


def gains(families: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per family, each variant's AUC minus ``outcome``'s (``shuffled``'s must be near 0 for the
    votes' placement, not their mere presence, to be what helps)."""
    out = {}
    for family, f in families.items():
        v = f["variants"]
        if "outcome" in v:
            out[family] = {name: round(x["auc"] - v["outcome"]["auc"], 4) for name, x in v.items() if name != "outcome"}
    return out


def family_config(family: str, overrides: list[str], heldout: int | None = None) -> Any:
    """The CPU demo's config on ``family``; ``heldout``: evaluate on its first that many held-out seeds."""
    from nextstate.envs.relay import env as relay
    from nextstate.envs.terminal import outdir, procedural
    from nextstate.train.config import load_config

    first = {"procedural": procedural.NAMED, "outdir": outdir.NAMED, "relay": relay.NAMED}[family]["heldout"][0]
    subset = [f"eval.tasks={family}:{first}:{heldout}"] if heldout else []
    env = "relay" if family == MULTI_AGENT_FAMILY else "terminal"
    return load_config(env, cpu_demo=True, overrides=[*FAMILIES[family], *subset, *overrides])


def variants_of(family: str, asked: list[str]) -> list[str]:
    """The variants run on ``family``: relay's are ``shared`` and ``non_shared``."""
    if family == MULTI_AGENT_FAMILY:
        return list(MULTI_AGENT)
    return [v for v in asked if v not in SKIP.get(family, ())]


def run_config(family: str, name: str, seed: int, steps: int, warm: Path, extra: list[str],
               heldout: int | None = None) -> Any:
    """The config of one run of variant ``name``: ``extra`` (the model's protocol and the command
    line's overrides) first, so that the run starts from the shared warm start ``warm`` and trains
    no warm start of its own, whatever ``extra`` says of ``model.name`` and ``sft``."""
    variant = [o.format(warm=warm) for o in {**VARIANTS, **MULTI_AGENT}[name]]
    return family_config(family, [
        *extra, f"model.name={warm}", "sft.steps=0", f"run.seed={seed}", f"run.steps={steps}",
        f"run.save_every={max(steps, 1)}", "run.keep_checkpoints=1", *variant], heldout)


def train_variant(family: str, name: str, seed: int, steps: int, warm: Path, out: Path,
                  extra: list[str], heldout: int | None = None) -> dict[str, Any]:
    """One run of variant ``name`` on ``family`` from the warm start; its held-out curve."""
    from nextstate.train.local import LocalTrainer

    cfg = run_config(family, name, seed, steps, warm, extra, heldout)
    start = time.monotonic()
    rows = LocalTrainer(cfg, out, progress=False).run()
    return {**figures(rows), "wall_s": round(time.monotonic() - start, 1)}


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Before, after, AUC, the curve and the mean training episode length of one run's metrics rows
    (and, on a multi-agent family, each agent's own held-out measures before and after:
    ``{"reader/word_told": [before, after]}``)."""
    points = curve(rows)
    lengths = [r["episode/length_mean"] for r in rows if isinstance(r.get("episode/length_mean"), (int, float))]
    success = [p for _, p in points]
    measures = {}
    for key in sorted({k for r in rows for k in r if k.startswith("eval/") and k.count("/") == 2}):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        measures[key[len("eval/"):]] = [round(values[0], 4), round(values[-1], 4)]
    return {"before": success[0], "after": success[-1], "auc": round(sum(success) / len(success), 4),
            "curve": points, **({"episode_length": round(sum(lengths) / len(lengths), 4)} if lengths else {}),
            **({"measures": measures} if measures else {})}


def collected(dirs: list[Path], family: str, name: str, seed: int, steps: int) -> dict[str, Any] | None:
    """The figures of a finished run of an earlier ``--output`` (the first of ``dirs`` that holds
    one whose last evaluation is at ``steps``), else None."""
    import json

    for d in dirs:
        path = d / family / f"{name}-seed{seed}" / "metrics.jsonl"
        if path.is_file():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            points = curve(rows)
            if points and points[-1][0] == steps:
                return figures(rows)
    return None


def _one_thread() -> None:
    import torch
    torch.set_num_threads(1)   # as the CPU demo: the tiny model runs faster so on a loaded machine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", choices=list(MODELS), help="the model and its protocol (MODELS)")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, help="training steps per run (default: the CPU demo's)")
    p.add_argument("--heldout", type=int, help="evaluate on the first N held-out instances (default: all 64)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process (default 1)")
    p.add_argument("--output", help="keep the runs here (default: a temporary directory)")
    p.add_argument("--collect", nargs="+", metavar="DIR",
                   help="train nothing: the figures of the finished runs in these earlier --output folders")
    p.add_argument("--json", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides for every run")
    args = p.parse_args(argv)
    args.overrides = [*MODELS[args.model], *args.overrides]

    if args.collect:
        return collect_figures(args)
    from nextstate.train.sft import warm_start

    _one_thread()
    started = time.monotonic()
    root = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="bench-learning-"))
    # a fresh process per run: a worker that trained one run kept its memory into the next (smollm2:
    # 8 GB after one run, 14.7 GB after four)
    pool = ProcessPoolExecutor(max(1, args.jobs), mp_context=multiprocessing.get_context("spawn"),
                               initializer=_one_thread, max_tasks_per_child=1)
    try:
        jobs: dict[str, dict[str, list[Any]]] = {}
        configs: dict[str, Any] = {}
        steps = 0
        for family in args.families:
            cfg = configs[family] = family_config(family, list(args.overrides), args.heldout)
            steps = args.steps if args.steps is not None else cfg.run.steps
            # in a worker too: the process that fine-tuned smollm2 kept 6.6 GB for the whole benchmark
            warm = pool.submit(warm_start, cfg, root / f"warm_start-{family}", progress=False).result()
            for seed in args.seeds:   # seed-major: every variant gets each seed before the next seed
                for name in variants_of(family, args.variants):
                    print(f"[bench.learning] {family} {name} seed {seed}", file=sys.stderr, flush=True)
                    jobs.setdefault(family, {}).setdefault(name, []).append(pool.submit(
                        train_variant, family, name, seed, steps, warm, root / family / f"{name}-seed{seed}",
                        list(args.overrides), args.heldout))
        families = {family: {"variants": {name: summarize([f.result() for f in futures])
                                          for name, futures in variants.items()},
                             **described(configs[family])}
                    for family, variants in jobs.items()}
        show({**sections(families), "model": args.model, "protocol": MODELS[args.model],
              "seeds": args.seeds, "steps": steps, "jobs": args.jobs,
              "wall_s": round(time.monotonic() - started, 1)}, args.json)
    finally:
        pool.shutdown(cancel_futures=True)
        if not args.output:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def collect_figures(args: argparse.Namespace) -> int:
    """``--collect``: the JSON of the runs already finished, and the ones missing."""
    families: dict[str, Any] = {}
    missing = []
    steps = args.steps or 0
    for family in args.families:
        cfg = family_config(family, list(args.overrides), args.heldout)
        steps = args.steps if args.steps is not None else cfg.run.steps
        variants = {}
        for name in variants_of(family, args.variants):
            runs = []
            for seed in args.seeds:
                run = collected([Path(d) for d in args.collect], family, name, seed, steps)
                if run is None:
                    missing.append(f"{family}/{name}-seed{seed}")
                else:
                    runs.append(run)
            if runs:
                variants[name] = summarize(runs)
        families[family] = {"variants": variants, **described(cfg)}
    show({**sections(families), "model": args.model, "protocol": MODELS[args.model], "seeds": args.seeds,
          "steps": steps, "missing": missing, "wall_s": None}, args.json)
    return 0


def described(cfg: Any) -> dict[str, Any]:
    """What a family's runs were trained and evaluated on."""
    return {"train_tasks": cfg.env.tasks, "heldout_tasks": cfg.eval.tasks, "eval_every": cfg.eval.every,
            "max_steps": cfg.env.max_steps}


def sections(families: dict[str, Any]) -> dict[str, Any]:
    """The JSON's sections: the single-agent ``families`` with each variant's gain over
    outcome-only, and ``multi_agent`` (relay: ``shared`` and ``non_shared`` side by side)."""
    single = {f: v for f, v in families.items() if f != MULTI_AGENT_FAMILY}
    out: dict[str, Any] = {"families": single, "next_state_family": NEXT_STATE_FAMILY,
                           "auc_gain_over_outcome": gains(single)}
    if MULTI_AGENT_FAMILY in families:
        relay = families[MULTI_AGENT_FAMILY]
        out["multi_agent"] = {"family": MULTI_AGENT_FAMILY, **relay.pop("variants"), **relay}
    return out


if __name__ == "__main__":
    sys.exit(main())
