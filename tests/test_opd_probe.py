"""The OPD mechanism probe and the judge-agreement bench on real ``outdir`` sandboxes: the steps
they read (failed writes, hinted by the environment's own error or by the model), and the figures' shape.
Nothing here checks what a model prefers: the signs of the gaps are the probe's answer, not a test's."""

from __future__ import annotations

import asyncio
import math

import pytest

from bench import judge_agreement, opd_probe

pytestmark = pytest.mark.docker


def _finite(*xs: float) -> bool:
    return all(isinstance(x, float) and math.isfinite(x) for x in xs)


def test_the_probe_reads_failed_writes_and_an_update_moves_the_reference_action(terminal_image):
    got = opd_probe.probe("tiny", steps=2, updates=1, parallel=2)
    assert got["steps"] == got["hinted"] == 2 and got["hint_source"] == "rules" and got["hint_settings"] is None
    assert all("No such file or directory" in h for h in got["hint_examples"])   # the write really failed, in Docker
    assert "mkdir -p /app/out" in got["reference_action"] and "/app/out/answer" in got["sampled_example"]
    assert _finite(got["gap_reference"], got["gap_sampled"], got["before"], got["after"],
                   got["gap_reference_after_prefix"], got["gap_sampled_after_prefix"])
    assert got["shared_prefix_tokens"] > 0                             # both actions are bash tool calls
    assert got["after"] != got["before"]                               # one OPD update changed the student
    assert len(got["update_log"]) == 1 and "opd/teacher_gap_mean" in got["update_log"][0]


def test_the_probe_on_the_models_own_hints_counts_the_steps_it_hinted(terminal_image):
    from nextstate.train.config import JudgeConfig

    got = opd_probe.probe("tiny", steps=2, updates=1, parallel=2, hint_source="judge")
    assert got["steps"] == 2 and got["hint_source"] == "judge" and 0 <= got["hinted"] <= got["steps"]
    j = JudgeConfig()
    assert got["hint_settings"] == {"votes": j.votes, "temperature": j.temperature, "max_tokens": j.max_tokens,
                                    "timeout_s": opd_probe.HINT_TIMEOUT_S}
    assert len(got["hint_examples"]) == min(got["hinted"], 3)
    assert all(isinstance(h, str) and len(h) > 10 for h in got["hint_examples"])   # select_hint's minimum
    answered = got["steps"] - got["hint_errors"]                # a failed request has no answer
    assert sum(got["hint_votes"].values()) == answered * j.votes and got["hint_votes"]["1"] >= got["hinted"]
    assert got["hinted"] <= got["answers_with_hint_text"] <= answered * j.votes
    assert len(got["unhinted_answers"]) == min(got["steps"] - got["hinted"] - got["hint_errors"], 2)
    assert "/app/out/answer" in got["sampled_example"]                              # a failed write, hinted or not
    gaps = [got[k] for k in ("gap_reference", "gap_sampled", "gap_reference_after_prefix", "gap_sampled_after_prefix")]
    if got["hinted"]:
        assert _finite(*gaps) and len(got["update_log"]) == 1
    else:                                                   # nothing to measure or train on: said, not invented
        assert gaps == [None] * 4 and "update_log" not in got


def test_the_probe_with_no_step_to_probe_is_one_line_and_exit_1(terminal_image, capsys: pytest.CaptureFixture[str]):
    assert opd_probe.main(["--model", "tiny", "--steps", "0", "--hint-source", "judge"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bench.opd_probe: ") and err.count("\n") == 1, err


def test_judge_agreement_judges_every_step_of_the_hasty_runs_and_counts_the_rule_classes(terminal_image):
    from nextstate.agents.hf_policy import HFPolicy

    policy = HFPolicy("tiny")
    try:
        got = judge_agreement.measure(policy, "tiny", tasks=4, votes=1, max_tokens=8, parallel=2, timeout=60)
    finally:
        asyncio.run(policy.aclose())
    assert got["steps"] == got["rule_failed_steps"] + got["rule_good_steps"] >= 4
    assert 0.0 <= got["agreement"] <= 1.0 and 0.0 <= got["valid_vote_rate"] <= 1.0 and got["errors"] == 0


def test_shared_prefix_by_hand():
    assert opd_probe.shared_prefix([1, 2, 3, 4], [1, 2, 5]) == 2
    assert opd_probe.shared_prefix([1, 2], [1, 2, 3]) == 1          # a gap is left to measure on each
    assert opd_probe.shared_prefix([7], [8]) == 0


def test_kappa_by_hand():
    assert judge_agreement.kappa([1, 1, -1, -1], [1, 1, -1, -1]) == 1.0
    assert judge_agreement.kappa([1, -1, 1, -1], [1, 1, -1, -1]) == 0.0
    assert judge_agreement.kappa([1, 1], [1, 1]) is None


@pytest.mark.parametrize("bench", ["engine", "opd_probe", "train_speed"])
def test_a_model_that_is_not_here_is_one_line_and_exit_1(bench: str, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    assert importlib.import_module(f"bench.{bench}").main(["--model", "/nonexistent/model"]) == 1
    err = capsys.readouterr().err
    assert err == f"bench.{bench}: model path '/nonexistent/model' does not exist\n", err
