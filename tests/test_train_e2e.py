"""End to end: ``python -m train`` with the tiny model and real Docker sandboxes, then ``--resume``."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _train(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "train", "--env", "terminal", "--parallel", "4", "--model", "tiny",
           "--output", str(out), "rollout.tasks_per_step=2", "rollout.samples_per_task=2", "env.max_steps=2",
           # plumbing only: no warm start or held-out evaluation, and untrained samples kept (advantage 0)
           "sft.steps=0", "eval.tasks=null", "advantage.drop_constant=false", *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


def _finite(row: dict) -> bool:
    return all(v is None or not isinstance(v, float) or math.isfinite(v) for v in row.values())


def test_zero_steps_evaluates_the_starting_point_and_trains_nothing(tmp_path, terminal_image):
    out = tmp_path / "run"
    done = _train(out, "eval.tasks=procedural:1000000:2", "--steps", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] and rows[0]["eval/episodes"] == 2
    assert not list((out / "checkpoints").glob("step_*"))


def test_train_two_steps_then_resume_to_three(tmp_path, terminal_image):
    out = tmp_path / "run"
    first = _train(out, "eval.tasks=procedural:1000000:2", "--steps", "2")   # held out: before step 1, after 2
    assert first.returncode == 0, first.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["eval/episodes"] == rows[2]["eval/episodes"] == 2
    for r in rows[1:]:
        assert _finite(r)
        assert r["episodes"] == 4 and r["episode/length_mean"] >= 1
        assert r["batch/samples"] + r["batch/dropped_samples"] >= 4
        assert {"outcome/mean", "judge/score_mean", "judge/vote_agreement", "advantage/mean", "advantage/std",
                "aborted", "batch/dropped_buckets", "perf/samples_per_s", "train/kl", "train/clip_frac",
                "train/entropy"} <= set(r)
    assert (out / "curves.png").stat().st_size > 1000
    logged = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in logged}
    assert {"step", "judge", "trajectory"} <= kinds
    ends = [r for r in logged if r["kind"] == "trajectory"]
    assert sum(not r.get("heldout") for r in ends) == 8  # 2 steps x 4 episodes
    assert sorted(r["train_step"] for r in ends if r.get("heldout")) == [0, 0, 2, 2]
    assert all("grade" in r and r["grade"]["reward"] == r["outcome"] for r in ends)   # the grader's details
    assert all("next_state" in r and "messages" in r for r in logged if r["kind"] == "step")
    _viewer_reads(out, logged)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    ckpt = out / "checkpoints" / "step_000002"
    assert (ckpt / "model" / "model.safetensors").is_file() and (ckpt / "state.pt").is_file()
    assert json.loads((ckpt / "meta.json").read_text())["step"] == 2

    # a later run killed while saving step 3 left this behind: resume must ignore it
    half = out / "checkpoints" / ".tmp-step_000003-killed"
    (half / "model").mkdir(parents=True)
    (half / "model" / "model.safetensors").write_bytes(b"partial")
    second = _train(out, "--steps", "3", "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from step 2 of 3 ({out / 'checkpoints' / 'step_000002'}): 1 to go" in second.stderr
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and all(_finite(r) for r in rows)
    assert json.loads((out / "checkpoints" / "step_000003" / "meta.json").read_text())["step"] == 3
    assert not half.exists()


def _viewer_reads(out: Path, logged: list[dict]) -> None:
    """advantages.jsonl names trained steps of rollouts.jsonl; the viewer joins the two."""
    from nextstate.viewer import RunIndex

    advantages = [json.loads(x) for x in (out / "advantages.jsonl").read_text().splitlines()]
    steps = {(r["group_id"], r["sample"], r["step"]) for r in logged if r["kind"] == "step"}
    assert advantages and all((a["group_id"], a["sample"], a["step"]) in steps for a in advantages)
    assert {a["train_step"] for a in advantages} == {1, 2}
    index = RunIndex(out)
    index.refresh()
    over = index.overview()
    assert len(over["episodes"]) == 8 + 4 and over["config"]["rollout"]["samples_per_task"] == 2
    assert sum(e["heldout"] for e in over["episodes"]) == 4
    shown = [s for e in over["episodes"] for s in index.episode(e["id"])["steps_detail"] if s["advantage"] is not None]
    assert sorted(s["advantage"] for s in shown) == sorted(a["advantage"] for a in advantages)
