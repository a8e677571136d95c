"""``python -m viewer RUN --export-atif``: a run's episodes as ATIF trajectories (Harbor's format).

Two real runs: ``train.evaluate`` with the ``tiny`` model on two procedural terminal tasks in Docker
sandboxes, and a training run written by the project's own code (:func:`bench.viewer.write_run`:
the agent loop, its recorder, ``build_batch``'s advantages, a GUI episode with screenshots; its
policy and judge are seeded-RNG doubles, so that tool calls parse and the judge votes). The
export is checked here against ATIF's rules and the run's own lines, and, in the slow test, loaded
with Harbor's own pydantic models and validator in a Python 3.12 venv (``harbor_python``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.viewer import write_run
from nextstate.train.evaluate import evaluate
from nextstate.viewer import main
from nextstate.viewer.atif import SCHEMA_VERSION, export_atif

# The fields of each ATIF object (Harbor's models forbid any other).
FIELDS = {
    "trajectory": {"schema_version", "session_id", "trajectory_id", "agent", "steps", "notes", "final_metrics",
                   "continued_trajectory_ref", "extra", "subagent_trajectories"},
    "agent": {"name", "version", "model_name", "tool_definitions", "extra"},
    "step": {"step_id", "timestamp", "source", "model_name", "reasoning_effort", "message", "reasoning_content",
             "tool_calls", "observation", "metrics", "is_copied_context", "llm_call_count", "extra"},
    "tool_call": {"tool_call_id", "function_name", "arguments", "extra"},
    "result": {"source_call_id", "content", "subagent_trajectory_ref", "extra"},
    "metrics": {"prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "prompt_token_ids",
                "completion_token_ids", "logprobs", "extra"},
    "final_metrics": {"total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_cost_usd",
                      "total_steps", "extra"},
}
AGENT_ONLY = {"model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("atif") / "tiny"
    evaluate("terminal", "procedural:0:2", "tiny", parallel=2, max_steps=2, output=out)
    return out


@pytest.fixture(scope="module")
def train_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("atif") / "train"
    write_run(out, train_steps=1, tasks_per_step=2, samples=2, max_steps=4, gui=True, metrics_log=True)
    return out


def check_atif(t: dict) -> None:
    """ATIF's rules as Harbor's models enforce them (structure only: no harbor here)."""
    assert set(t) <= FIELDS["trajectory"] and t["schema_version"] == SCHEMA_VERSION
    assert set(t["agent"]) <= FIELDS["agent"] and t["agent"]["name"] and t["agent"]["version"]
    assert [s["step_id"] for s in t["steps"]] == list(range(1, len(t["steps"]) + 1))
    for s in t["steps"]:
        assert set(s) <= FIELDS["step"] and s["source"] in ("system", "user", "agent")
        assert isinstance(s["message"], (str, list))
        if s["source"] != "agent":
            assert not AGENT_ONLY & set(s)
        calls = {c["tool_call_id"] for c in s.get("tool_calls") or []}
        for c in s.get("tool_calls") or []:
            assert set(c) <= FIELDS["tool_call"] and isinstance(c["arguments"], dict)
        for r in (s.get("observation") or {}).get("results", []):
            assert set(r) <= FIELDS["result"]
            assert r.get("source_call_id") is None or r["source_call_id"] in calls
        assert set(s.get("metrics") or {}) <= FIELDS["metrics"]
    assert set(t["final_metrics"]) <= FIELDS["final_metrics"]
    assert t["final_metrics"]["total_steps"] == len(t["steps"])


def exported(run: Path, out: Path) -> dict[tuple[str, int], dict]:
    files, skipped = export_atif(run, out)
    assert files and not skipped
    found = {}
    for f in files:
        t = json.loads(f.read_text())
        check_atif(t)
        extra = t["final_metrics"]["extra"]
        found[(extra["group_id"], extra["sample"])] = t
    return found


@pytest.mark.docker
def test_tiny_run_exports_every_episode_with_its_steps_and_outcome(tiny_run, tmp_path):
    lines = read_jsonl(tiny_run / "rollouts.jsonl")
    found = exported(tiny_run, tmp_path / "atif")
    ends = [r for r in lines if r["kind"] == "trajectory"]
    assert sorted(found) == sorted((r["group_id"], r["sample"]) for r in ends)
    for end in ends:
        t = found[(end["group_id"], end["sample"])]
        steps = [r for r in lines if r["kind"] == "step" and r["group_id"] == end["group_id"]]
        agent = [s for s in t["steps"] if s["source"] == "agent"]
        assert [s["message"] for s in agent] == [r["text"] for r in steps]            # the model's text
        assert [s["observation"]["results"][0]["content"] for s in agent] == [r["observation"]["text"] for r in steps]
        first = steps[0]["messages"]                                                    # the prompt it saw
        assert [(s["source"], s["message"]) for s in t["steps"][:len(first)]] == [
            (m["role"], m["content"]) for m in first]
        assert t["final_metrics"]["extra"]["outcome"] == end["outcome"]
        assert t["final_metrics"]["extra"]["grade"] == end["grade"]
        assert t["agent"]["model_name"] == "tiny"


def test_tool_calls_link_to_their_observations_and_judge_votes_are_step_metrics(train_run, tmp_path):
    lines = read_jsonl(train_run / "rollouts.jsonl")
    adv = {(r["group_id"], r["sample"], r["step"]): r for r in read_jsonl(train_run / "advantages.jsonl")}
    found = exported(train_run, tmp_path / "atif")
    linked = invalid = 0
    for r in (r for r in lines if r["kind"] == "step"):
        t = found[(r["group_id"], r["sample"])]
        agent = [s for s in t["steps"] if s["source"] == "agent"]
        s = agent[r["step"]]
        result = s["observation"]["results"][0]
        if r["action"]:
            [call] = s["tool_calls"]
            assert (call["function_name"], call["arguments"]) == (r["action"]["name"], r["action"]["arguments"])
            assert result["source_call_id"] == call["tool_call_id"]
            linked += 1
        else:                                      # an answer that did not parse: no call, the error unlinked
            assert "tool_calls" not in s and "source_call_id" not in result
            assert s["extra"]["next_state"]["valid"] is False
            invalid += 1
        judge = next(j for j in lines if j["kind"] == "judge" and (j["group_id"], j["sample"], j["step"])
                     == (r["group_id"], r["sample"], r["step"]))
        metrics = s["metrics"]["extra"]
        assert (metrics["judge_votes"], metrics["judge_score"]) == (judge["votes"], judge["score"])
        if (key := (r["group_id"], r["sample"], r["step"])) in adv:
            assert (metrics["R_t"], metrics["advantage"]) == (adv[key]["reward"], adv[key]["advantage"])
    assert linked and invalid                      # the run has both kinds of step


def test_screenshots_are_copied_and_referenced_by_relative_path(train_run, tmp_path):
    found = exported(train_run, tmp_path / "atif")
    [gui] = [t for t in found.values() if t["final_metrics"]["extra"]["task_id"] == "desktop-save"]
    parts = [p for s in gui["steps"] for r in (s.get("observation") or {}).get("results", [{"content": s["message"]}])
             if isinstance(r["content"], list) for p in r["content"]]
    parts += [p for s in gui["steps"] if isinstance(s["message"], list) for p in s["message"]]
    images = [p["source"]["path"] for p in parts if p["type"] == "image"]
    assert len(set(images)) >= 3
    for rel in images:
        assert (tmp_path / "atif" / rel).read_bytes().startswith(b"\x89PNG")


def test_cli_writes_beside_the_run_and_refuses_a_missing_folder(train_run, tmp_path, capsys):
    assert main([str(train_run), "--export-atif"]) == 0
    assert "wrote 5 ATIF trajectories" in capsys.readouterr().out
    assert len(list((train_run / "atif").glob("*.json"))) == 5
    assert main(["--export-atif", str(tmp_path / "nothing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.docker
def test_harbors_own_models_and_validator_load_every_file(tiny_run, train_run, tmp_path, harbor_python):
    files = [f for run in (tiny_run, train_run) for f in export_atif(run, tmp_path / run.name)[0]]
    script = """
import json, sys
from harbor.models.trajectories import Trajectory
from harbor.utils.trajectory_validator import TrajectoryValidator
out = {}
for path in sys.argv[1:]:
    t = Trajectory.model_validate_json(open(path).read())
    v = TrajectoryValidator()
    out[path] = [v.validate(path), v.get_errors(), len(t.steps), t.schema_version]
print(json.dumps(out))
"""
    run = subprocess.run([str(harbor_python), "-c", script, *map(str, files)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    verdicts = json.loads(run.stdout)
    assert len(verdicts) == len(files) == 7
    for path, (ok, errors, steps, version) in verdicts.items():
        assert ok and not errors, (path, errors)
        assert steps == len(json.loads(Path(path).read_text())["steps"]) and version == SCHEMA_VERSION
