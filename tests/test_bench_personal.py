"""The personal track's benchmark (``bench.personal``): its generated problems, its rule-written
users and rule scorer, its rule judge of the user's reply and the rubric, and the benchmark end to
end on the tiny model (which cannot read: only the plumbing and the JSON's shape are checked)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from nextstate.judges.prm import JudgeRequest
from nextstate.judges.rules import text_state
from nextstate.train.proxy.rubric import Rubric, make_source, with_rubric

from bench.personal.judge import ReplyHints, ReplyJudge
from bench.personal.problems import problem, solution
from bench.personal.users import SILENT, make_user, register_user

ROOT = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def test_problems_are_seeded_and_a_slip_carries_on():
    a, b = problem(random.Random(3)), problem(random.Random(3))
    assert a == b and a.text.endswith("?")
    n = a.numbers
    assert a.answer == n["b"] * n["c"] + n["a"] - n["d"] > 0
    right = solution(a, random.Random(1), slip_rate=0.0)
    wrong = solution(a, random.Random(1), slip_rate=1.0)
    assert right.slip is None and right.answer == a.answer and right.text.endswith(f"The answer is {a.answer}.")
    assert wrong.slip in (0, 1, 2) and wrong.answer != a.answer and wrong.values[-1] == wrong.answer


def test_the_student_scores_and_replies_by_its_stated_style():
    student = make_user("student")
    case = problem(random.Random(0))
    plain = f"You start with the packs and add the rest, and then take away what is gone. That gives {case.answer}."
    ai = f"**Solution**\n1. Multiply the packs.\n2. Add and subtract.\n- Answer: {case.answer}"
    assert student.score(plain, case) == 1.0
    assert student.score(ai, case) == 0.25   # only the number is right
    assert student.score(plain.replace(str(case.answer), str(case.answer + 1)), case) == 0.75
    assert student.score("I cannot tell.", case) == 0.0
    rng = random.Random(0)
    assert student.reply(plain, case, rng)[0] == "approval"
    kind, words = student.reply(ai, case, rng)
    assert kind == "correction" and "bold" in words and "numbered steps" in words and "plain paragraphs" in words
    assert student.reply("I cannot tell.", case, rng) == ("reask", student.reask(case))
    assert make_user("student", comment_rate=0.0).reply(ai, case, rng) == ("silent", SILENT)


def test_the_teacher_wants_the_right_verdict_specific_and_friendly():
    teacher = make_user("teacher", slip_rate=1.0)
    case = teacher.case(random.Random(5))
    wrong_value = case.solution.values[case.solution.slip]
    good = f"Nice effort! There is a small mistake where you wrote {wrong_value}; try that step again next time."
    assert teacher.score(good, case) == 1.0
    assert teacher.score("Correct.", case) == 0.0        # the wrong verdict, nothing specific, curt
    assert teacher.score("Good, but it is wrong.", case) == 0.5
    kind, words = teacher.reply("Correct.", case, random.Random(0))
    assert kind == "correction" and "verdict" in words and "friendly" in words and "specific" in words
    assert teacher.reply("Hmm.", case, random.Random(0))[0] == "reask"
    right = make_user("teacher", slip_rate=0.0).case(random.Random(5))
    assert right.solution.slip is None and teacher.score("Well done, that is correct!", right) == 0.5
    with pytest.raises(ValueError, match="already registered"):
        register_user("teacher")(object)


def _judge(source, reply: str, answer: str, instruction: str = ""):
    req = JudgeRequest("proxy", instruction, [], answer, text_state(reply))
    return asyncio.run(source.judge(req))


def test_the_reply_judge_reads_the_reply_and_then_the_rubric():
    student, case = make_user("student"), problem(random.Random(0))
    bold = f"The answer is **{case.answer}**."
    _, correction = student.reply(bold, case, random.Random(0))
    assert _judge(ReplyJudge(), correction, bold).score == -1
    assert _judge(ReplyJudge(), "Perfect, thank you.", bold).score == 1
    assert _judge(ReplyJudge(), SILENT, bold).score == 0   # no rubric: a silent reply says nothing
    hint = _judge(ReplyHints(), correction, bold).hint
    assert hint == correction
    # the proxy's real rule rubric takes the correction in; a later silent turn is judged by it
    rubric = Rubric(make_source("rules"), every=1)
    rubric.start(lambda kind, payload: None)
    assert asyncio.run(rubric.observe(correction, {"session": "s", "step": 1})) is not None
    task = with_rubric("", rubric.current)
    assert "bold" in rubric.current.text
    assert _judge(ReplyJudge(), SILENT, bold, task).score == -1
    assert _judge(ReplyJudge(), SILENT, f"It is {case.answer}.", task).score == 1
    assert "bold" in _judge(ReplyHints(), SILENT, bold, task).hint
    assert _judge(ReplyHints(), SILENT, f"It is {case.answer}.", task).hint is None


def _bench(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.personal", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": PYTHONPATH})


@pytest.mark.parametrize("bad", [["--interactions", "0"], ["--users", "nobody"], ["--comment-rate", "2"],
                                 ["--seeds", "x"]])
def test_bad_arguments_exit_2_in_one_line(bad):
    proc = _bench(*bad, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: ")


@pytest.mark.slow
def test_the_benchmark_end_to_end_on_tiny(tmp_path):
    proc = _bench("--json", "--users", "student", "teacher", "--variants", "none", "combine", "--rubrics", "rules",
                  "--seeds", "0", "1", "--interactions", "3", "--blocks", "2", "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["model"] == "tiny" and "36 student and 24 teacher" in result["paper"]
    assert result["protocol"]["scorer"].startswith("rules") and result["seeds"] == [0, 1]
    for user in ("student", "teacher"):
        section = result["users"][user]
        assert set(section["variants"]) == {"none/off", "combine/rules"} and section["interactions"] == 3
        assert set(section["gain_over_none"]) == {"combine/rules"}
        for v in section["variants"].values():
            assert len(v["curve"]) == 2 and len(v["gain_ci95"]) == 2 and v["gain_ci95"][0] <= v["gain_ci95"][1]
            assert [r["seed"] for r in v["runs"]] == [0, 1]
            for r in v["runs"]:
                assert len(r["scores"]) == 3 and all(s * 4 == int(s * 4) and 0 <= s <= 1 for s in r["scores"])
                assert sum(r["replies"].values()) == 3
        assert all(r["trained_steps"] == 0 for r in section["variants"]["none/off"]["runs"])
        assert all("rubric_version" in r for r in section["variants"]["combine/rules"]["runs"])
    # each interaction went through the proxy as one session of two turns, the reply judged
    rollouts = (tmp_path / "student" / "combine-rules-seed0" / "rollouts.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in rollouts]
    assert sum(r["kind"] == "trajectory" for r in records) == 3
    judged = [r for r in records if r["kind"] == "judge"]
    assert len(judged) == 3 and all(r["prompt"].startswith("reply: ") for r in judged)
