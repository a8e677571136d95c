"""One real veRL training step on this machine's CPUs: ``python -m train --backend verl``.

veRL 0.9.1's V1 trainer in the ``nextstate`` mode on a local Ray cluster, the
``cpu`` platform and the ``hf`` rollout of the plugin, the ``nextstate``
agent loop, the ``tiny`` model. The step judge is a scripted
OpenAI-compatible server (a stand-in for a judge model, which cannot be
downloaded here): its vote depends on the judged step's text, so the step
rewards are not constant and the update has a signal.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transfer_queue", reason="veRL's TransferQueue trainer stack is not installed")
pytest.importorskip("ray", reason="Ray is not installed")

from nextstate.agents.testing import ScriptedOpenAIServer  # noqa: E402
from nextstate.containers import connect, project_containers  # noqa: E402
from nextstate.train.advantage import StepRows, compute_advantages  # noqa: E402
from nextstate.train.verl_backend import advantage as vadv  # noqa: E402
from nextstate.train.verl_backend.nodes import run_processes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def judge_vote(request: dict) -> str:
    """+1 or -1 from a checksum of the judged conversation: fixed per step, varied across steps."""
    text = json.dumps(request.get("messages"), sort_keys=True)
    return "\\boxed{1}" if zlib.crc32(text.encode()) % 2 else "\\boxed{-1}"


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path is selected only without an accelerator")
def test_one_verl_step_on_cpu_uses_the_nextstate_advantages_and_changes_the_weights(tmp_path):
    out_dir = tmp_path / "run"
    with ScriptedOpenAIServer(judge_vote) as judge:
        proc = subprocess.run(
            [sys.executable, "-m", "train", "--env", "toolcall", "--backend", "verl", "--model", "tiny",
             "--steps", "1", "--output", str(out_dir), "--judge", judge.url,
             "env.sandbox_backend=local", "env.max_steps=2", "rollout.tasks_per_step=2",
             "rollout.samples_per_task=4", "rollout.max_response_tokens=16", "train.lr=1e-4",
             "verl.overrides=['actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]']"],
            cwd=REPO, capture_output=True, text=True, timeout=1500,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        judged = len(judge.requests)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert judged > 0

    # the advantages the actor update read equal the shared computation on the same rows
    rows = [json.loads(line) for line in (out_dir / "advantages.jsonl").read_text().splitlines()]
    rows = [r for r in rows if not r["padding"] and not r[vadv.FIELD_ABORTED]]
    assert len(rows) >= 8 and {r["train_step"] for r in rows} == {1}
    assert all(r["uniform"] and r["tokens"] > 0 for r in rows)
    shared = compute_advantages(
        StepRows(group=np.array([r["group_id"] for r in rows]), step=np.array([r[vadv.FIELD_STEP] for r in rows]),
                 outcome=np.array([r[vadv.FIELD_OUTCOME] for r in rows], dtype=float),
                 vote_mean=np.array([np.nan if r[vadv.FIELD_VOTE_MEAN] is None else r[vadv.FIELD_VOTE_MEAN]
                                     for r in rows]),
                 state=np.array([r[vadv.FIELD_STATE] for r in rows])),
        "step_index", c=1.0, eps=1e-6, drop_constant=False)
    assert len(set(shared.rewards.tolist())) > 1, "the judge gave every step the same reward"
    np.testing.assert_allclose([r["advantage"] for r in rows], shared.advantages, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r["reward"] for r in rows], shared.rewards)
    assert np.abs(shared.advantages).max() > 0.5

    # the actor's weights changed: veRL's HF export of the step-1 checkpoint vs the initial model
    from transformers import AutoModelForCausalLM
    before = AutoModelForCausalLM.from_pretrained(out_dir / "model").state_dict()
    after = AutoModelForCausalLM.from_pretrained(
        out_dir / "checkpoints" / "global_step_1" / "actor" / "huggingface").state_dict()
    assert before.keys() == after.keys()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) > len(before) // 2, f"only {moved} changed"

    # train.updates_per_step (1): one AdamW update in the step, though each episode has 2 env steps
    optim = torch.load(out_dir / "checkpoints" / "global_step_1" / "actor" / "optim_world_size_1_rank_0.pt",
                       weights_only=False)
    steps = {float(getattr(s["step"], "full_tensor", lambda: s["step"])()) for s in optim["state"].values()}
    assert steps == {1.0}, steps

    # the local backend's outputs; the hf rollout's log-probs are the ones veRL's actor recomputes
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    m = metrics[0]
    for key in ("outcome/mean", "judge/score_mean", "reward/mean", "advantage/std", "train/kl", "train/clip_frac",
                "batch/samples"):
        assert key in m, key
    assert m["training/rollout_probs_diff_max"] < 1e-3
    assert (out_dir / "curves.png").stat().st_size > 0
    kinds = {json.loads(line)["kind"] for line in (out_dir / "rollouts.jsonl").read_text().splitlines()}
    assert {"step", "judge", "trajectory"} <= kinds

    # nothing of the run is left running
    run_id = re.search(r"'NEXTSTATE_RUN_ID': '([0-9a-f]+)'", log).group(1)
    assert run_processes(run_id) == []


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path is selected only without an accelerator")
def test_one_verl_opd_step_scores_hinted_steps_in_their_teacher_context(tmp_path, terminal_image):
    """``opd.mode=combine`` with rule hints on the ``outdir`` family: the untrained tiny model's
    failed steps get hints; veRL's reference worker scores their responses after the teacher
    context, and the actor reads ``w_opd * (log pi_teacher - log pi_old) + w_rl * A_rl``."""
    from nextstate.train.advantage import token_advantages

    out_dir = tmp_path / "run"
    with ScriptedOpenAIServer(judge_vote) as judge:
        proc = subprocess.run(
            [sys.executable, "-m", "train", "--env", "terminal", "--backend", "verl", "--model", "tiny",
             "--steps", "1", "--output", str(out_dir), "--judge", judge.url,
             "env.tasks=outdir:train", "env.max_steps=2", "rollout.tasks_per_step=2", "rollout.samples_per_task=2",
             "rollout.max_response_tokens=16", "sft.steps=0", "opd.mode=combine", "opd.hint_source=rules",
             "opd.teacher=reference", "opd.weight_rl=0.5", "opd.weight_opd=2.0", "eval.tasks=null"],
            cwd=REPO, capture_output=True, text=True, timeout=1500,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]

    rows = [json.loads(line) for line in (out_dir / "advantages.jsonl").read_text().splitlines()]
    rows = [r for r in rows if not r["padding"] and not r[vadv.FIELD_ABORTED]]
    hinted = [r for r in rows if "hint" in r]
    assert hinted, "no step got a hint"
    a_rl = 0.5 * compute_advantages(
        StepRows(group=np.array([r["group_id"] for r in rows]), step=np.array([r[vadv.FIELD_STEP] for r in rows]),
                 outcome=np.array([r[vadv.FIELD_OUTCOME] for r in rows], dtype=float),
                 vote_mean=np.array([np.nan if r[vadv.FIELD_VOTE_MEAN] is None else r[vadv.FIELD_VOTE_MEAN]
                                     for r in rows])),
        "step_index", c=1.0, eps=1e-6, drop_constant=False).advantages
    for row, a in zip(rows, a_rl):
        if "hint" not in row:        # no hint: w_rl * A_rl on every token (when its bucket is kept)
            assert row["uniform"] and (not row["kept"] or row["advantage"] == pytest.approx(a, abs=1e-5))
            continue
        teacher, old, ref = (np.array(row[k]) for k in ("teacher_log_probs", "old_log_probs", "ref_log_probs"))
        assert len(teacher) == len(row["token_advantages"]) == row["tokens"] > 0
        # before the update the actor is the reference: the same model, scored after another prompt
        np.testing.assert_allclose(old, ref, atol=1e-4)
        assert np.abs(teacher - ref).max() > 1e-3, "the teacher scored the plain prompt"
        np.testing.assert_allclose(row["token_advantages"], token_advantages(teacher, old, a, 2.0), rtol=1e-4, atol=1e-4)

    [m] = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert m["opd/hinted_samples"] == len(hinted)
    gaps = np.concatenate([np.array(r["teacher_log_probs"]) - np.array(r["old_log_probs"]) for r in hinted])
    assert m["opd/teacher_gap_mean"] == pytest.approx(float(gaps.mean()), abs=1e-4)
    kinds = {json.loads(line)["kind"] for line in (out_dir / "rollouts.jsonl").read_text().splitlines()}
    assert "hint" in kinds
    run_id = re.search(r"'NEXTSTATE_RUN_ID': '([0-9a-f]+)'", log).group(1)
    assert run_processes(run_id) == []
def weights_moved(before: Path, after: Path) -> dict[str, torch.Tensor]:
    """The HF weights at ``after``, checked to differ from ``before`` in most tensors."""
    from transformers import AutoModelForCausalLM
    start = AutoModelForCausalLM.from_pretrained(before).state_dict()
    end = AutoModelForCausalLM.from_pretrained(after).state_dict()
    assert start.keys() == end.keys()
    moved = [k for k in start if not torch.equal(start[k], end[k])]
    assert len(moved) > len(start) // 2, f"{after}: only {moved} changed"
    return end


def adam_steps(actor: Path) -> set[float]:
    """AdamW's step counts in a veRL actor checkpoint."""
    optim = torch.load(actor / "optim_world_size_1_rank_0.pt", weights_only=False)
    return {float(getattr(s["step"], "full_tensor", lambda: s["step"])()) for s in optim["state"].values()}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path is selected only without an accelerator")
def test_two_policies_on_verl_each_train_on_their_own_role_and_resume(tmp_path):
    """``--agents reader=tiny,writer=tiny`` on veRL: two actor worker groups, two rollout servers;
    two steps, then one more with ``--resume``."""
    out_dir = tmp_path / "run"

    def train(steps: int, *extra: str) -> tuple[subprocess.CompletedProcess, str]:
        with ScriptedOpenAIServer(judge_vote) as judge:
            proc = subprocess.run(
                [sys.executable, "-m", "train", "--env", "relay", "--backend", "verl",
                 "--agents", "reader=tiny,writer=tiny", "--steps", str(steps), "--output", str(out_dir),
                 "--judge", judge.url, "--parallel", "4", *extra, "env.max_steps=2", "rollout.tasks_per_step=2",
                 "rollout.samples_per_task=2", "rollout.max_response_tokens=16", "train.lr=1e-4", "run.save_every=1",
                 "advantage.drop_constant=false",   # every bucket trains: relay's demo drops constant ones
                 "verl.overrides=['actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]']"],
                cwd=REPO, capture_output=True, text=True, timeout=1700,
                env={**os.environ, "PYTHONPATH": str(REPO)})
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-4000:]
        run_id = re.search(r"'NEXTSTATE_RUN_ID': '([0-9a-f]+)'", log).group(1)
        assert run_processes(run_id) == [], "a process of the run is left"      # Ray's, the servers'
        assert project_containers(connect(), run_id) == [], "a sandbox of the run is left"
        return proc, log

    train(2)
    ckpt = out_dir / "checkpoints"
    # relay's cpu_demo warm start: one per policy, each on its own role's steps, made before Ray started
    for policy in ("reader", "writer"):
        assert json.loads((out_dir / "warm_start" / policy / "sft.json").read_text())["examples"] > 0, policy
    # each policy's update read only the samples of its own role, on both steps
    rows = [json.loads(line) for line in (out_dir / "advantages.jsonl").read_text().splitlines()]
    rows = [r for r in rows if not r["padding"]]
    for policy in ("reader", "writer"):
        mine = [r for r in rows if r["policy"] == policy]
        assert {r["train_step"] for r in mine} == {1, 2}, policy
        assert {r["role"] for r in mine} == {policy}, policy
        assert any(r["kept"] for r in mine), policy
    # both policies' weights changed from their warm starts, each its own way
    reader = weights_moved(out_dir / "warm_start" / "reader", ckpt / "global_step_2" / "reader" / "huggingface")
    writer = weights_moved(out_dir / "warm_start" / "writer", ckpt / "global_step_2" / "writer" / "huggingface")
    assert any(not torch.equal(reader[k], writer[k]) for k in reader)
    # the local backend's metric names, per policy
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "batch/samples" in m] == [1, 2]
    # the held-out evaluation (relay's cpu_demo eval section) at step 0 and the end, each role
    # played on its own policy's servers with that step's weights
    assert [(m["step"], m["eval/weights_step"]) for m in metrics if "eval/success" in m] == [(0, 0), (2, 2)]
    for key in ("outcome/mean", "episodes", "batch/samples", "reader/train/kl", "writer/train/kl",
                "reader/valid_action_rate", "writer/advantage/std", "writer/batch/samples"):
        assert key in metrics[-1], key
    assert metrics[-1]["batch/samples"] == metrics[-1]["reader/batch/samples"] + metrics[-1]["writer/batch/samples"]
    # after step 1's update each policy's server generated with that policy's new weights: its
    # log-probs are the ones that policy's actor recomputes (a weight sync to the other policy's
    # server would show here)
    for policy in ("reader", "writer"):
        assert metrics[-1][f"{policy}/training/rollout_probs_diff_max"] < 1e-3, policy

    # --resume: each policy's weights and optimizer come back (AdamW's 3rd step, not a fresh 1st)
    _, log = train(3, "--resume")
    assert "resuming from step 2 of 3" in log
    for policy in ("reader", "writer"):
        assert adam_steps(ckpt / "global_step_3" / policy) == {3.0}, policy
