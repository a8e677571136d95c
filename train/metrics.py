"""Per-step metrics: ``metrics.jsonl``, TensorBoard, and a PNG of the main curves.

Every :meth:`MetricsLog.log` appends one JSON line ``{"step": k, ...}``,
writes the scalars to TensorBoard (``<output>/tensorboard``) and redraws
``<output>/curves.png`` (matplotlib, Agg backend: no display needed). When
``STALL_STEPS`` training steps in a row had nothing to learn from (no sample
kept, or every advantage 0), it says so on stderr, once, with the likely
reason and what to try (:func:`no_learning`).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

PLOT = "curves.png"
CURVES = [  # (metric, title) drawn in the PNG, one panel each
    ("eval/success", "held-out success"),
    ("outcome/success", "training success"),
    ("outcome/mean", "outcome (mean)"),
    ("judge/score_mean", "judge score (mean)"),
    ("reward/mean", "step reward R_t (mean)"),
    ("advantage/std", "advantage std"),
    ("train/kl", "KL to reference"),
    ("train/clip_frac", "clip fraction"),
    ("train/entropy", "entropy"),
    ("episode/length_mean", "episode length"),
    ("perf/samples_per_s", "throughput (samples/s)"),
]


STALL_STEPS = 3   # training steps in a row without a learning signal before the run says so


def _signal(row: dict[str, Any]) -> bool | None:
    """Whether a training step had a sample with a nonzero advantage (None: not a training step)."""
    if not isinstance(row.get("batch/samples"), (int, float)):
        return None
    return bool(row["batch/samples"]) and bool(row.get("advantage/std", 1) or row.get("advantage/mean", 1))


def no_learning(rows: list[dict[str, Any]], n: int = STALL_STEPS) -> str | None:
    """One line when none of the last ``n`` training steps of ``rows`` (metrics rows) had a
    sample to learn from (none kept, or every advantage 0) and the step before them had one
    (so it is said once), with the likely reason and what to try; else None."""
    signal = [s for s in map(_signal, rows) if s is not None]
    if len(signal) < n or any(signal[-n:]) or (len(signal) > n and not signal[-n - 1]):
        return None
    last = rows[-1]
    if last.get("episodes") and last.get("aborted") == last.get("episodes"):
        why = "every episode aborted (their errors are in rollouts.jsonl)"
    elif not last.get("batch/buckets") and last.get("batch/untrainable_steps"):
        why = "no step came with the policy's token ids and log-probs"
    elif last.get("batch/buckets") and last.get("batch/dropped_buckets") == last.get("batch/buckets"):
        why = "every sample of a task scored alike at each step, so every advantage was 0"
    else:
        why = "no step had a nonzero advantage"
    seen = ", ".join(f"{name} {last[key]:.0%}" for key, name in
                     (("judge/valid_action_rate", "valid actions"), ("outcome/success", "success"))
                     if isinstance(last.get(key), (int, float)))
    return (f"warning: nothing to learn from in the last {n} steps: {why}{f' ({seen})' if seen else ''}. "
            "The model is not learning: try a warm start (sft.steps=200 sft.tasks=...) or a model "
            "that already acts in this env (--model).")


class MetricsLog:
    """Appends step metrics to ``metrics.jsonl``, TensorBoard and the curves PNG.

    ``members``: the policies of a run with several (``agents``); their metrics are prefixed
    ``<name>/`` and each panel draws one line per policy, plus a panel of each one's valid-action rate.
    ``measures``: each agent's own measures (``{"reader/word_told": title}``, a multi-agent
    family's ``measures``), a panel each, in training and held out (``eval/<name>``).
    """

    def __init__(self, output: str | Path, resume_step: int | None = None, members: list[str] | None = None,
                 measures: dict[str, str] | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.output = Path(output)
        self.output.mkdir(parents=True, exist_ok=True)
        self.members = members or []
        self.measures = dict(measures or {})
        self.curves = CURVES + ([("valid_action_rate", "valid actions per policy")] if self.members else []) \
            + list(self.measures.items())
        self.path = self.output / "metrics.jsonl"
        self.rows: list[dict[str, Any]] = []
        if self.path.exists() and resume_step is not None:   # forget steps after the checkpoint
            for line in self.path.read_text().splitlines():
                row = json.loads(line)
                if row.get("step", 0) <= resume_step:
                    self.rows.append(row)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        self.writer = SummaryWriter(str(self.output / "tensorboard"),
                                    purge_step=None if resume_step is None else resume_step + 1)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record the metrics of ``step`` everywhere and refresh the plot."""
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()
        self.plot()
        if (line := no_learning(self.rows)) is not None:
            from tqdm.auto import tqdm
            tqdm.write(line, file=sys.stderr)   # above the progress bars

    def plot(self) -> Path:
        """Redraw the curves PNG from every row so far."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cols = 3
        rows = math.ceil(len(self.curves) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
        for ax, (key, title) in zip(axes.flat, self.curves):
            for label, column in self._lines(key):
                pts = [(r["step"], r[column]) for r in self.rows if isinstance(r.get(column), (int, float))]
                if pts:
                    ax.plot(*zip(*pts), marker="o", markersize=3, label=label)
            if ax.get_legend_handles_labels()[1]:
                ax.legend(fontsize=7)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in axes.flat[len(self.curves):]:
            ax.axis("off")
        fig.tight_layout()
        out = self.output / PLOT
        tmp = out.with_suffix(".tmp.png")
        fig.savefig(tmp, dpi=80)
        plt.close(fig)
        tmp.replace(out)
        return out

    def _lines(self, key: str) -> list[tuple[str | None, str]]:
        """``(label, column)`` of each line of ``key``'s panel."""
        if key in self.measures:
            return [("training", key), ("held-out", f"eval/{key}")]
        return [(None, key)] + [(m, f"{m}/{key}") for m in self.members]

    def close(self) -> None:
        self.writer.close()


def _plain(v: Any) -> Any:
    """JSON-safe scalar (NaN and inf become None)."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
