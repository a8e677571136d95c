"""The whole pipeline learns: a short seeded run raises held-out success over its warm start.

Real pieces end to end: the tiny model fine-tuned by ``train.sft`` on the hasty behaviour policy,
procedural terminal tasks in Docker sandboxes graded in the sandbox, the rule
judge, advantages, veRL's loss, the update, and the weights published to the
serving model that the held-out evaluation samples from. A wrong response mask,
a flipped advantage sign or stale serving weights leave held-out success where it
started (or lower), and this test fails.
"""

import json

import pytest

from nextstate.envs.terminal import procedural
from nextstate.judges.rules import RuleJudge, rule_vote
from nextstate.judges.prm import JudgeRequest

def test_procedural_instances_are_seeded_and_heldout_is_disjoint():
    a, b = procedural.load("procedural:0:8"), procedural.load("procedural:0:8")
    assert [t.data["value"] for t in a] == [t.data["value"] for t in b]
    assert {t.data["value"] for t in a} == set(procedural.WORDS)
    assert all(procedural.WORDS[0] not in t.instruction for t in a)   # the word is only in the file
    train = {t.data["seed"] for t in procedural.load("procedural:train")}
    held = {t.data["seed"] for t in procedural.load("procedural:heldout")}
    assert not train & held
    with pytest.raises(ValueError, match="procedural:START:COUNT"):
        procedural.load("procedural:oops")


def test_hasty_behaviour_reads_half_of_the_time_and_guesses_otherwise():
    import random

    task = procedural.instance(5)
    plans = [procedural.hasty_actions(task, random.Random(i)) for i in range(80)]
    read = [p for p in plans if p[0]["arguments"].get("command") == "cat /app/note"]
    guessed = [p for p in plans if p not in read]
    assert 25 <= len(read) <= 55
    assert all(p == task.data["oracle"] for p in read)      # after reading: the word it read
    assert all(p[0]["arguments"]["command"].startswith("echo ") and p[-1]["name"] == "finish" for p in guessed)
    written = {p[0]["arguments"]["command"].split()[1] for p in guessed}
    assert written == set(procedural.WORDS)   # guesses: any word, so only reading pays


async def test_rule_judge_votes_on_the_next_state():
    judge = RuleJudge(m=3)
    ok = await judge.judge(JudgeRequest("terminal", "t", [], {"name": "bash"}, {"valid": True, "exit_code": 0}))
    bad = await judge.judge(JudgeRequest("terminal", "t", [], {"name": "bash"}, {"valid": True, "exit_code": 1}))
    assert (ok.votes, ok.score, ok.mean) == ([1, 1, 1], 1, 1.0)
    assert (bad.votes, bad.score, bad.mean) == ([-1, -1, -1], -1, -1.0)
    assert rule_vote({"valid": False, "error": "no tool call"})[0] == -1
    assert rule_vote({"valid": True, "exit_code": 0, "timed_out": True})[0] == -1


@pytest.mark.docker
@pytest.mark.slow
def test_a_short_run_raises_heldout_success_over_the_warm_start(tmp_path, terminal_image):
    from nextstate.train.config import load_config
    from nextstate.train.local import LocalTrainer

    # The demo's own 20 steps, and 128 held-out episodes (the 64 held-out tasks twice: half the
    # evaluation's sampling variance). At 10 steps the gain ranged +0.09 to +0.35 over seven runs and
    # twice fell under the margin; at 20 it was +0.27 to +0.41 in five (docs/training.md).
    cfg = load_config("terminal", cpu_demo=True,
                      overrides=["run.steps=20", "eval.every=0", "run.seed=0", "eval.samples_per_task=2"])
    rows = LocalTrainer(cfg, tmp_path, progress=False).run()
    evals = [r for r in rows if "eval/success" in r]
    assert [r["step"] for r in evals] == [0, 20]
    before, after = evals[0]["eval/success"], evals[-1]["eval/success"]
    summary = json.loads((tmp_path / "warm_start" / "sft.json").read_text())
    assert summary["examples"] >= 64 and summary["loss_last"] < summary["loss_first"]
    assert summary["source"] == "hasty"
    assert before < 0.8, f"the warm start leaves no room to learn (held-out success {before})"
    assert after >= before + 0.15, f"held-out success {before} -> {after}: the run did not learn"
    assert any(r.get("batch/samples", 0) > 0 for r in rows)


def test_sft_keeps_the_steps_of_successful_trajectories_only(tmp_path):
    from nextstate.train.sft import examples_from_rollouts

    msgs = [{"role": "user", "content": "task"}]
    rows = [{"kind": "step", "group_id": "g", "sample": 0, "step": 1, "role": "agent", "messages": msgs, "text": "b"},
            {"kind": "step", "group_id": "g", "sample": 0, "step": 0, "role": "agent", "messages": msgs, "text": "a"},
            {"kind": "step", "group_id": "g", "sample": 1, "step": 0, "role": "agent", "messages": msgs, "text": "x"},
            {"kind": "judge", "group_id": "g", "sample": 0, "step": 0, "votes": [1]},
            {"kind": "trajectory", "group_id": "g", "sample": 0, "status": "finished", "outcome": 1.0},
            {"kind": "trajectory", "group_id": "g", "sample": 1, "status": "finished", "outcome": -1.0}]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [e.text for e in examples_from_rollouts([path])] == ["a", "b"]
    assert examples_from_rollouts([path], min_outcome=1.0) == []


def test_demo_sizes_a_step_from_parallel():
    from nextstate.train.__main__ import build_config, parse_args

    cfg, demo = build_config(parse_args(["--env", "terminal", "--model", "tiny", "--parallel", "32", "--dry-run"]))
    assert demo and (cfg.rollout.tasks_per_step, cfg.rollout.samples_per_task, cfg.rollout.parallel) == (8, 4, 32)
    assert cfg.judge.mode == "rules" and cfg.env.tasks == "procedural:train" and cfg.sft.steps > 0
