"""Step judges: vote parsing and tallying, prompts, and judging over a real HTTP server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nextstate.agents.openai_policy import OpenAIPolicy
from nextstate.agents.policy import Generation, Policy
from nextstate.envs.base import Observation
from nextstate.agents.testing import Reply, ScriptedOpenAIServer
from nextstate.judges.prm import (JudgeRequest, StepJudge, compress_history, load_template, majority,
                        parse_hint, parse_vote, render_prompt, tally)


def request(family: str = "terminal", **kw) -> JudgeRequest:
    base = dict(family=family, instruction="Make the tests pass.", history=[],
                action={"name": "bash", "arguments": {"command": "pytest -x"}},
                next_state={"valid": True, "exit_code": 1, "output": "1 failed: test_add",
                            "error": None})
    return JudgeRequest(**{**base, **kw})


@pytest.mark.parametrize("answer,vote", [
    ("The step helps. \\boxed{1}", 1),
    ("\\boxed{+1}", 1),
    ("bad step \\boxed{-1}", -1),
    ("unsure \\boxed{ 0 }", 0),
    ("first \\boxed{1} then on reflection \\boxed{-1}", -1),
    ("no verdict here", None),
    ("\\boxed{2}", None),
    ("\\boxed{yes}", None),
    ("", None),
])
def test_parse_vote(answer, vote):
    assert parse_vote(answer) == vote


@pytest.mark.parametrize("votes,score", [
    ([1, 1, -1], 1), ([-1, -1, 1], -1), ([1, -1], 0), ([1, 0], 0), ([0, 0, 1], 0),
    ([1, 1, 0, 0, -1], 0), ([1], 1), ([], 0), ([-1, -1, -1, 1, 1], -1),
])
def test_majority_ties_are_zero(votes, score):
    assert majority(votes) == score


def test_tally_counts_garbage_as_zero_but_not_in_the_mean():
    r = tally(["good \\boxed{1}", "garbage", "\\boxed{1}", "bad \\boxed{-1}"])
    assert r.votes == [1, 0, 1, -1]
    assert r.score == 1
    assert r.mean == pytest.approx(1 / 3)
    r = tally(["garbage", "more garbage"])
    assert r.votes == [0, 0] and r.score == 0 and r.mean is None


def test_hints_longest_over_ten_characters():
    answers = ["[HINT_START]short[HINT_END] \\boxed{-1}",
               "[HINT_START] Run the tests from /app, not from /. [HINT_END] \\boxed{-1}",
               "[HINT_START]Use pytest -x.[HINT_END]\\boxed{-1}",
               "no hint \\boxed{1}"]
    assert tally(answers).hint == "Run the tests from /app, not from /."
    assert tally(["[HINT_START]tiny[HINT_END]"]).hint is None
    assert parse_hint("[HINT_START] a [HINT_END] and [HINT_START] longer one [HINT_END]") == "longer one"


def test_history_compression_keeps_first_and_last():
    history = [{"action": {"name": "bash", "arguments": {"command": f"cmd{i}"}},
                "next_state": {"valid": True, "exit_code": i % 2, "output": "o" * 5000}}
               for i in range(20)]
    limits = {"keep_first": 1, "keep_last": 3, "step_output_chars": 100, "history_chars": 3000}
    text = compress_history(history, limits)
    assert "Step 1:" in text and "cmd0" in text
    assert "[... 16 steps omitted ...]" in text
    assert "Step 18:" in text and "Step 20:" in text and "cmd5" not in text
    assert "exit code: 1" in text
    assert len(text) <= 3100
    assert compress_history([], limits) == "(this is the first step)"


@pytest.mark.parametrize("family", ["terminal", "swe", "gui", "toolcall"])
def test_every_family_template_renders(family):
    msgs = render_prompt(load_template(family), request(family), hints=True)
    user = msgs[1]["content"]
    assert "Make the tests pass." in user and '"command": "pytest -x"' in user
    assert "1 failed: test_add" in user and "\\boxed{1}" in user and "[HINT_START]" in user
    assert "{instruction}" not in user and "{next_state}" not in user
    assert "[HINT_START]" not in render_prompt(load_template(family), request(family), False)[1]["content"]


def test_terminal_rules_follow_the_paper():
    user = load_template("terminal")["user"]
    for phrase in ("moves the task forward", "well-formed", "tool fits", "shows progress",
                   "could not be parsed", "wrong tool", "failed", "loop"):
        assert phrase in user


def test_gui_images_become_data_urls_and_invalid_actions_are_explained():
    req = request("gui", before=Observation("", [b"before-png"]), after=Observation("", [b"ABC"]),
                  action="click somewhere",
                  next_state={"valid": False, "error": "No tool call found", "output": ""})
    content = render_prompt(load_template("gui"), req, hints=False)[1]["content"]
    assert content[0]["type"] == "text" and "rejected: No tool call found" in content[0]["text"]
    assert content[1] == {"type": "text", "text": "Screen before the action:"}
    assert content[2]["image_url"]["url"].startswith("data:image/png;base64,")
    assert content[3] == {"type": "text", "text": "Screen after the action:"}
    assert content[4]["image_url"]["url"] == "data:image/png;base64,QUJD"


def test_template_overrides_by_dict_and_path(tmp_path):
    custom = tmp_path / "t.yaml"
    custom.write_text("user: 'Judge {action} for {instruction}. Answer \\boxed{1}.'\n"
                      "limits: {next_state_chars: 10}\n")
    judge = StepJudge(OpenAIPolicy("http://127.0.0.1:9", model="x"),
                      templates={"terminal": {"system": "SYSTEM X"}, "swe": custom})
    assert judge.messages(request())[0]["content"] == "SYSTEM X"
    msgs = judge.messages(request("swe"))
    assert msgs[1]["content"].startswith("Judge <tool_call>") and "Make the tests pass." in msgs[1]["content"]
    assert judge.template("swe")["limits"]["next_state_chars"] == 10
    assert judge.template("swe")["limits"]["keep_last"] == 8  # the rest from the default
    with pytest.raises(ValueError, match="no judge template"):
        load_template("nosuchfamily")


async def test_one_request_with_n_votes_through_the_server():
    answers = ["fine \\boxed{1}", "\\boxed{1}", "hmm \\boxed{-1}", "garbage", "\\boxed{1}"]
    with ScriptedOpenAIServer(lambda req: answers[:req.get("n", 1)]) as s:
        judge = StepJudge(OpenAIPolicy(s.url, model="judge"), m=5, temperature=0.6)
        result = await judge.judge(request())
    assert len(s.requests) == 1
    body = s.requests[0]
    assert body["n"] == 5 and body["temperature"] == 0.6
    assert "Make the tests pass." in body["messages"][1]["content"]
    assert result.votes == [1, 1, -1, 0, 1] and result.score == 1
    assert result.mean == pytest.approx(0.5) and result.error is None
    assert result.raw == answers and "Make the tests pass." in result.prompt


class CountingPolicy(Policy):
    """Stands in for a model that cannot batch: answers one vote per call."""

    def __init__(self):
        self.calls = 0

    async def generate(self, messages, tools=None, **sampling):
        self.calls += 1
        return Generation("\\boxed{-1}" if self.calls % 2 else "\\boxed{1}")


async def test_backend_without_n_gets_m_requests():
    backend = CountingPolicy()
    result = await StepJudge(backend, m=3).judge(request())
    assert backend.calls == 3
    assert sorted(result.votes) == [-1, -1, 1] and result.score == -1


async def test_timeout_gives_no_votes_and_does_not_raise():
    with ScriptedOpenAIServer(Reply("\\boxed{1}", delay=3.0)) as s:
        judge = StepJudge(OpenAIPolicy(s.url, model="j", max_retries=0), m=3, timeout=0.3)
        result = await judge.judge(request())
    assert result.votes == [] and result.score == 0 and result.mean is None
    assert "Timeout" in result.error and result.prompt


def test_judge_timeout_is_a_setting_of_the_judge_and_the_llm_hint_source():
    from nextstate.judges.hints import HintJudge
    from nextstate.train.config import ConfigError, load_config
    from nextstate.train.wiring import make_hinter, make_judge

    cfg = load_config("terminal", overrides=["judge.timeout=900", "opd.mode=opd", "opd.hint_source=judge"])
    judge, hinter = make_judge(cfg, CountingPolicy()), make_hinter(cfg, CountingPolicy())
    assert isinstance(hinter, HintJudge) and (judge.timeout, hinter.timeout) == (900.0, 900.0)
    assert make_judge(load_config("terminal"), CountingPolicy()).timeout == 60.0
    for bad in ("0", "-1", "nan"):
        with pytest.raises(ConfigError, match="judge.timeout must be a positive number of seconds"):
            load_config("terminal", overrides=[f"judge.timeout={bad}"])


async def test_server_error_gives_no_votes():
    with ScriptedOpenAIServer(Reply(status=500)) as s:
        judge = StepJudge(OpenAIPolicy(s.url, model="j", max_retries=1, backoff=0.01), m=2)
        result = await judge.judge(request())
    assert result.votes == [] and "HTTP 500" in result.error


async def test_hints_mode_through_the_server():
    hint = "[HINT_START]Check the function name in the failing test first.[HINT_END]"
    with ScriptedOpenAIServer(lambda req: [f"{hint} \\boxed{{-1}}", "\\boxed{-1}"]) as s:
        judge = StepJudge(OpenAIPolicy(s.url, model="j"), m=2, hints=True)
        result = await judge.judge(request())
    assert "[HINT_START]" in s.requests[0]["messages"][1]["content"]
    assert result.hint == "Check the function name in the failing test first."
    assert result.votes == [-1, -1]


async def test_concurrency_is_limited():
    in_flight, peak, lock = 0, 0, threading.Lock()

    def script(req):
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.1)
        with lock:
            in_flight -= 1
        return "\\boxed{1}"

    with ScriptedOpenAIServer(script) as s:
        judge = StepJudge(OpenAIPolicy(s.url, model="j"), max_concurrency=3)
        results = await asyncio.gather(*(judge.judge(request()) for _ in range(12)))
    assert all(r.votes == [1] for r in results)
    assert peak <= 3 and len(s.requests) == 12


async def test_local_hf_backend():
    from nextstate.agents.hf_policy import HFPolicy
    result = await StepJudge(HFPolicy("tiny"), m=2, max_tokens=8).judge(request())
    assert len(result.votes) == 2 and result.error is None  # random text: votes are 0
    assert len(result.raw) == 2
