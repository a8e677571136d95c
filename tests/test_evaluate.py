"""``python -m train.evaluate``: oracles and a scripted policy on real tasks, and its output files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nextstate.envs.swe.instances import BUILTIN, load_instances
from nextstate.envs import env_class
from nextstate.train.evaluate import evaluate, main, summarize

INSTANCES = load_instances()


@pytest.fixture(scope="module")
def swe_image():
    """The offline SWE image, rebuilt when its sources changed (the pool only builds missing ones)."""
    from nextstate import containers
    return containers.ensure_image("swe")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_env_class_comes_from_the_gymnasium_registry():
    from nextstate.envs.swe import SWEEnv
    assert env_class("swe") is SWEEnv
    with pytest.raises(ValueError, match="unknown env 'nope'"):
        env_class("nope")


def test_summary_has_rates_and_categories():
    rows = [{"task_id": "a", "category": "x", "success": True, "reward": 1.0, "status": "finished"},
            {"task_id": "b", "category": "x", "success": False, "reward": -1.0, "status": "truncated"},
            {"task_id": "c", "category": "y", "success": False, "reward": None, "status": "aborted"}]
    report = summarize(rows, family="swe", tasks="t", policy="p", elapsed=1.0)
    assert report["success_rate"] == report["resolve_rate"] == pytest.approx(1 / 3)
    assert report["mean_outcome"] == 0.0 and report["aborted"] == 1
    assert report["by_category"]["x"] == {"total": 2, "succeeded": 1, "success_rate": 0.5,
                                          "mean_outcome": 0.0, "aborted": 0}
    assert (report["resolved_ids"], report["unresolved_ids"], report["error_ids"]) == (["a"], ["b"], ["c"])


def test_toolcall_gold_and_noop(tmp_path):
    ids = ["nextstate-aime-1", "nextstate-aime-2"]
    gold = evaluate("toolcall", "builtin", "gold", parallel=2, output=tmp_path / "gold", ids=ids)
    noop = evaluate("toolcall", "builtin", "noop", parallel=2, output=tmp_path / "noop", ids=ids)
    assert (gold["succeeded"], noop["succeeded"], gold["total"]) == (2, 0, 2)
    assert not (tmp_path / "gold" / "predictions.jsonl").exists()


def test_a_model_policy_run_writes_rollouts_as_training_does(tmp_path):
    from nextstate.agents.testing import ScriptedPolicy
    policy = ScriptedPolicy(['<tool_call>{"name": "answer", "arguments": {"answer": "7"}}</tool_call>'])
    evaluate("toolcall", "builtin", policy, parallel=1, output=tmp_path, ids=["nextstate-aime-1"])
    rows = read_jsonl(tmp_path / "rollouts.jsonl")
    assert [r["kind"] for r in rows] == ["step", "trajectory"]
    assert rows[0]["task_id"] == "nextstate-aime-1" and rows[0]["messages"][1]["role"] == "user"
    assert rows[0]["action"]["name"] == "answer" and rows[1]["steps"] == 1


@pytest.mark.docker
def test_swe_gold_resolves_every_instance_and_noop_none(swe_image, tmp_path, capsys):
    out = tmp_path / "gold"
    assert main(["--env", "swe", "--policy", "gold", "--parallel", "3", "--output", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"6/6 resolved (100.0%), mean outcome +1.00, "
                                                    f"0 aborted, 0 skipped -> {out}")
    report = json.loads((out / "report.json").read_text())
    assert report["resolve_rate"] == 1.0 and set(report["by_category"]) == {"nextstate/datekit",
                                                                            "nextstate/inikit"}
    predictions = read_jsonl(out / "predictions.jsonl")
    assert [p["instance_id"] for p in predictions] == [i["instance_id"] for i in INSTANCES]
    assert [p["model_patch"] for p in predictions] == [i["patch"] for i in INSTANCES]
    results = read_jsonl(out / "results.jsonl")
    assert all(r["resolved"] and r["steps"] == 2 and r["reason"] is None for r in results)
    assert all(not r["outcome"]["tests_status"]["FAIL_TO_PASS"]["failure"] for r in results)

    noop = evaluate("swe", "builtin", "noop", parallel=3, output=tmp_path / "noop")
    assert noop["succeeded"] == 0 and noop["unresolved_ids"] == report["resolved_ids"]
    assert all(r["reason"] == "empty patch" for r in read_jsonl(tmp_path / "noop" / "results.jsonl"))

    # swebench's own readers accept the predictions (empty patches are skipped, as in its harness)
    from swebench.harness.run_evaluation import get_dataset_from_preds
    from swebench.harness.utils import get_predictions_from_file
    for name, expected in (("gold", 6), ("noop", 0)):
        preds = get_predictions_from_file(str(tmp_path / name / "predictions.jsonl"), str(BUILTIN), "test")
        assert {p["model_name_or_path"] for p in preds} == {name}
        dataset = get_dataset_from_preds(str(BUILTIN), "test", None, {p["instance_id"]: p for p in preds},
                                         run_id=f"nextstate-test-{name}", rewrite_reports=False)
        assert len(dataset) == expected


@pytest.mark.docker
def test_swe_with_a_scripted_policy_through_the_agent_loop(swe_image, tmp_path):
    from nextstate.agents.testing import ScriptedPolicy
    view = '<tool_call>{"name": "str_replace_editor", "arguments": {"command": "view", "path": "."}}</tool_call>'
    policy = ScriptedPolicy([view, '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'])
    ids = ["nextstate__datekit-17", "nextstate__inikit-8"]
    report = evaluate("swe", "builtin", policy, parallel=2, output=tmp_path, ids=ids)
    assert (report["total"], report["succeeded"], report["policy"]) == (2, 0, "scripted")
    results = read_jsonl(tmp_path / "results.jsonl")
    assert [r["task_id"] for r in results] == ids
    assert all(r["steps"] == 2 and r["tokens"] > 0 and r["status"] == "finished" for r in results)
    assert all(r["reason"] == "empty patch" for r in results)


@pytest.mark.docker
def test_terminal_gold_runs_the_solution_and_noop_finishes_at_once(tmp_path):
    ids = ["greet-script", "roman-numeral-cli"]
    gold = evaluate("terminal", "builtin", "gold", parallel=2, output=tmp_path / "gold", ids=ids)
    noop = evaluate("terminal", "builtin", "noop", parallel=2, output=tmp_path / "noop", ids=ids)
    assert (gold["succeeded"], noop["succeeded"]) == (2, 0)
    assert all(r["steps"] == 1 for r in read_jsonl(tmp_path / "noop" / "results.jsonl"))


def test_a_checkpoint_is_scored_with_the_trainers_prompt_and_sampling(tmp_path):
    """--no-system-prompt, --temperature, --max-response-tokens reach the episode as the trainer's settings do."""
    texts = []
    for run in ("a", "b"):
        out = tmp_path / run
        assert main(["--env", "toolcall", "--policy", "tiny", "--output", str(out), "--ids", "nextstate-aime-1",
                     "--max-steps", "1", "--backend", "local", "--parallel", "1", "--temperature", "0",
                     "--no-system-prompt", "--max-response-tokens", "8"]) == 0
        step = next(r for r in read_jsonl(out / "rollouts.jsonl") if r["kind"] == "step")
        assert [m["role"] for m in step["messages"]] == ["user"]      # the task only: no system turn
        texts.append(step["text"])
    assert texts[0] == texts[1]                                       # temperature 0: greedy, the same answer
    assert main(["--env", "toolcall", "--policy", "tiny", "--output", str(tmp_path / "c"),
                 "--temperature", "-1"]) == 2


def test_a_url_policys_request_limits_are_flags(tmp_path):
    """--request-timeout, --retries and --max-response-tokens reach the requests: a server slower than the
    timeout gets one request (no retry), asking for at most --max-response-tokens."""
    from nextstate.agents.testing import Reply, ScriptedOpenAIServer

    with ScriptedOpenAIServer(Reply("too late", delay=3.0)) as server:
        rc = main(["--env", "toolcall", "--policy", server.url, "--ids", "nextstate-aime-1", "--output", str(tmp_path),
                   "--request-timeout", "0.5", "--retries", "0", "--max-response-tokens", "7"])
        assert rc == 1 and [r["max_tokens"] for r in server.requests] == [7]
    [row] = read_jsonl(tmp_path / "results.jsonl")
    assert row["status"] == "aborted" and "after 1 attempts: ReadTimeout (timeout 0.5s)" in row["reason"]


@pytest.mark.parametrize("flags, message", [
    (["--policy", "gold", "--retries", "1"], "--request-timeout and --retries bound a URL policy's requests"),
    (["--policy", "noop", "--max-response-tokens", "5"], "--max-response-tokens bounds a model policy's actions"),
    (["--policy", "http://127.0.0.1:1", "--request-timeout", "0"], "--request-timeout must be positive"),
])
def test_request_limit_flags_that_cannot_apply_are_refused(flags, message, tmp_path, capsys):
    assert main(["--env", "toolcall", "--output", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err

