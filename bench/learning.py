"""Benchmark: does RL raise held-out success, and does the step judge help? Side by side.

``python -m bench.learning [--seeds 0 1 2] [--steps N] [--json]`` starts from one
supervised warm start (the CPU demo's: the ``tiny`` model fine-tuned by
:mod:`train.sft` on the "hasty" behaviour policy on procedural terminal tasks, which
reads the note only half of the time) and trains each
variant with the same seeds and the same step budget through the local
backend (real Docker sandboxes, real updates):

* ``outcome``: outcome-only GRPO (``advantage.key=outcome``, no judge);
* ``step_index``: outcome + step judge (``--judge rules``), normalized per
  (task group, step index), the paper's recipe;
* ``state``: outcome + step judge, grouped by identical observed state.

Each run evaluates the serving model on held-out task instances (seeds never
trained on) before its first update and at its end; ``auc`` is the mean
held-out success over every evaluation of the run (start, every
``eval.every`` steps, end). Prints one JSON object: ``variants`` (per variant
the means over seeds of ``before``, ``after``, ``auc``, ``gain``, and the
per-seed figures), ``seeds``, ``steps``, ``wall_s``. Figures are printed,
never asserted.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import report as show

VARIANTS = {
    "outcome": ["advantage.key=outcome", "judge.mode=none"],
    "step_index": ["advantage.key=step_index", "judge.mode=rules"],
    "state": ["advantage.key=state", "judge.mode=rules"],
}


def curve(rows: list[dict[str, Any]]) -> list[float]:
    """Held-out success at every evaluation of a run, in step order."""
    return [r["eval/success"] for r in rows if isinstance(r.get("eval/success"), (int, float))]


def train_variant(name: str, seed: int, steps: int, warm: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    """One run of variant ``name`` from the warm start; its held-out curve."""
    from train.config import load_config
    from train.local import LocalTrainer

    cfg = load_config("terminal", cpu_demo=True, overrides=[
        f"model.name={warm}", "sft.steps=0", f"run.seed={seed}", f"run.steps={steps}",
        f"run.save_every={max(steps, 1)}", "run.keep_checkpoints=1", *VARIANTS[name], *extra])
    start = time.monotonic()
    rows = LocalTrainer(cfg, out, progress=False).run()
    points = curve(rows)
    return {"before": points[0], "after": points[-1], "auc": sum(points) / len(points), "curve": points,
            "wall_s": round(time.monotonic() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, help="training steps per run (default: the CPU demo's)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--output", help="keep the runs here (default: a temporary directory)")
    p.add_argument("--json", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides for every run")
    args = p.parse_args(argv)

    from train.config import load_config
    from train.sft import warm_start

    started = time.monotonic()
    root = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="bench-learning-"))
    try:
        cfg = load_config("terminal", cpu_demo=True, overrides=list(args.overrides))
        steps = args.steps if args.steps is not None else cfg.run.steps
        warm = warm_start(cfg, root / "warm_start", progress=False)
        runs: dict[str, list[dict[str, Any]]] = {}
        for seed in args.seeds:   # seed-major: every variant gets each seed before the next seed
            for name in args.variants:
                print(f"[bench.learning] {name} seed {seed}", file=sys.stderr, flush=True)
                runs.setdefault(name, []).append(
                    train_variant(name, seed, steps, warm, root / f"{name}-seed{seed}", list(args.overrides)))

        def mean(xs: list[float]) -> float:
            return round(sum(xs) / len(xs), 4)

        variants = {name: {"before": mean([r["before"] for r in rs]), "after": mean([r["after"] for r in rs]),
                           "auc": mean([r["auc"] for r in rs]),
                           "gain": mean([r["after"] - r["before"] for r in rs]), "runs": rs}
                    for name, rs in runs.items()}
        show({"variants": variants, "seeds": args.seeds, "steps": steps,
              "heldout_tasks": cfg.eval.tasks, "eval_samples_per_task": cfg.eval.samples_per_task,
              "wall_s": round(time.monotonic() - started, 1)}, args.json)
    finally:
        if not args.output:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
