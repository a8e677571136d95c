"""Pieces of the local backend: task schedule, overlapped loop, checkpoints, metrics."""

import asyncio
import json
import random
import threading
import time

import numpy as np
import pytest
import torch

from nextstate.agents.tiny import load_tiny
from nextstate.train import checkpoint
from nextstate.train.local import overlapped_loop, tasks_for_step
from nextstate.train.metrics import PLOT, MetricsLog


def test_task_schedule_is_a_function_of_the_step():
    steps = [tasks_for_step(10, s, 4, seed=3) for s in range(5)]
    assert steps == [tasks_for_step(10, s, 4, seed=3) for s in range(5)]
    flat = [i for s in steps for i in s]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))  # epochs cover all
    assert tasks_for_step(3, 0, 5, seed=0)[:3] != [] and len(tasks_for_step(3, 0, 5, seed=0)) == 5


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_overlapped_loop_bounds_how_far_rollouts_run_ahead(staleness):
    events = []
    trained = [-1]
    lock = threading.Lock()

    async def rollout(step):
        with lock:
            events.append(("rollout", step, trained[0]))
        await asyncio.sleep(0.02)
        return [step]

    def train(step, trajs):
        assert trajs == [step]
        time.sleep(0.03)
        with lock:
            trained[0] = step
        return {"x": step}

    done = []
    asyncio.run(overlapped_loop(0, 5, staleness, rollout, train, lambda s, m: done.append((s, m["x"]))))
    assert done == [(s, s) for s in range(5)]
    for _, step, last_trained in (e for e in events if e[0] == "rollout"):
        assert step - 1 - last_trained <= staleness      # weights at most `staleness` updates behind
    if staleness == 0:
        assert all(step - 1 == last for _, step, last in events)
    else:   # overlap: later rollouts started while the learner was still on an earlier step
        assert any(step - 1 > last for _, step, last in events)


def test_checkpoints_are_atomic_and_resume_from_the_last_complete_one(tmp_path):
    model, tok = load_tiny(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    random.seed(5)
    np.random.seed(5)
    first = checkpoint.save(tmp_path, 2, parts={"": (model, tok, opt.state_dict())}, meta={"data_position": 4})
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    # a run killed mid-save leaves a half-written temporary directory behind
    half = tmp_path / "checkpoints" / ".tmp-step_000004-deadbeef"
    (half / "model").mkdir(parents=True)
    (half / "model" / "model.safetensors").write_bytes(b"partial")
    assert checkpoint.latest(tmp_path) == first
    meta, state = checkpoint.load(first)
    assert meta["step"] == 2 and meta["data_position"] == 4
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    assert (first / "model" / "model.safetensors").is_file()
    fresh = torch.optim.AdamW(load_tiny(0)[0].parameters(), lr=1e-3)
    fresh.load_state_dict(state["optimizer"])
    assert fresh.state_dict()["state"][0]["step"] == 1
    # the next save clears the leftovers; old checkpoints beyond `keep` go
    for step in (3, 4, 5):
        checkpoint.save(tmp_path, step, parts={"": (model, tok, opt.state_dict())}, meta={}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000004", "step_000005"]


def test_metrics_log_writes_jsonl_tensorboard_and_plot_and_truncates_on_resume(tmp_path):
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        log.log(step, {"outcome/mean": 0.1 * step, "train/kl": float("nan"), "episodes": 4})
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["train/kl"] is None
    assert (tmp_path / PLOT).stat().st_size > 1000
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    resumed = MetricsLog(tmp_path, resume_step=2)
    resumed.log(3, {"outcome/mean": 0.9})
    resumed.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["outcome/mean"] == 0.9


@pytest.mark.parametrize("drop_constant", [True, False])
def test_a_run_with_nothing_to_learn_from_says_so_once_with_what_to_try(tmp_path, capsys, drop_constant):
    """A new family's first run: every action invalid, every episode fails alike, so every
    advantage is 0 (build_batch drops the buckets, or keeps them at 0). After STALL_STEPS such
    steps the log says so, once, in one line."""
    from nextstate.agents.trajectory import Step, Trajectory
    from nextstate.train.batch import build_batch
    from nextstate.train.config import AdvantageConfig
    from nextstate.train.metrics import STALL_STEPS

    def failed(sample: int) -> Trajectory:
        steps = [Step(role="agent", index=i, prompt_ids=[1, 2], response_ids=[3], logprobs=[-1.0], text="?",
                      action=None, next_state={"valid": False}, observation="", votes=[-1], vote_mean=-1.0)
                 for i in range(2)]
        return Trajectory("t", "t@s1", sample, family="count", steps=steps, outcome=-1.0, status="truncated")

    nothing = build_batch([failed(s) for s in range(4)], AdvantageConfig(drop_constant=drop_constant),
                          weight=1.0, role="agent").metrics
    assert nothing["batch/samples"] == (0 if drop_constant else 8)
    log = MetricsLog(tmp_path)
    log.log(0, {"eval/success": 0.0})                       # held-out evaluation: no batch
    said = {}
    for step in range(1, STALL_STEPS + 3):
        log.log(step, nothing)
        said[step] = [x for x in capsys.readouterr().err.splitlines() if "nothing to learn from" in x]
    log.close()
    assert {k: len(v) for k, v in said.items()} == {k: int(k == STALL_STEPS) for k in said}
    line = said[STALL_STEPS][0]
    assert f"last {STALL_STEPS} steps" in line and "valid actions 0%" in line and "warm start" in line
    assert "every advantage was 0" in line and "--model" in line
