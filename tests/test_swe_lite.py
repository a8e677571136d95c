"""The SWE-bench Lite table's parts: the shipped rows, the noop patch, the harness's report, and (slow, Docker)
one row measured end to end, with nextstate's grader and swebench's own harness."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.swe_lite import NOOP_PATCH, MODEL, first_per_repo, read_harness_report, verdict
from nextstate.envs.base import read_rows
from nextstate.envs.swe.instances import load_instances

ROOT = Path(__file__).resolve().parents[1]
LITE_ROWS = ROOT / "envs" / "swe" / "tasks" / "lite-first.jsonl"
LITE_REPOS = {"astropy/astropy", "django/django", "matplotlib/matplotlib", "mwaskom/seaborn", "pallets/flask",
              "psf/requests", "pydata/xarray", "pylint-dev/pylint", "pytest-dev/pytest",
              "scikit-learn/scikit-learn", "sphinx-doc/sphinx", "sympy/sympy"}


def test_the_shipped_rows_are_one_plain_row_per_lite_repository_and_load_with_swebench_fields():
    rows = read_rows(LITE_ROWS)
    assert {r["repo"] for r in rows} == LITE_REPOS and len(rows) == 12 and first_per_repo(rows) == rows
    assert not any("image" in r or "eval_script" in r for r in rows)  # plain rows, as the Lite set has them
    assert all(r["image"] == f"sweb.eval.x86_64.{r['instance_id']}:latest" and r["eval_script"]
               for r in load_instances(str(LITE_ROWS)))


def test_bad_input_is_one_line_and_exit_1(capsys):
    from bench.swe_lite import main

    assert main(["--tasks", str(LITE_ROWS), "--ids", "nope__nope-1", "--json"]) == 1
    assert capsys.readouterr().err.strip() == f"bench.swe_lite: ValueError: unknown instance ids in {LITE_ROWS}: nope__nope-1"


def test_first_per_repo_keeps_the_file_order():
    rows = [{"repo": "a/x", "instance_id": "2"}, {"repo": "b/y", "instance_id": "1"},
            {"repo": "a/x", "instance_id": "0"}]
    assert [r["instance_id"] for r in first_per_repo(rows)] == ["2", "1"]


def test_the_noop_patch_applies_and_changes_no_tracked_file(tmp_path):
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (tmp_path / "noop.patch").write_text(NOOP_PATCH)
    git("apply", "--verbose", "noop.patch")
    assert git("diff", "HEAD", "--name-only") == "" and (tmp_path / "nextstate-noop.txt").read_text() == "noop\n"


@pytest.mark.parametrize(("gold", "noop", "result"), [
    (True, False, "pass"), (False, False, "gold unresolved"), (True, True, "noop resolved"),
    (None, False, "no grade"), (True, "no harness report (x)", "no grade")])
def test_a_row_passes_only_when_gold_resolves_and_noop_does_not(gold, noop, result):
    assert verdict(gold, noop) == result
    assert verdict(gold, noop, network=True) == (result if result in ("pass", "no grade") else
                                                 "tests need the internet")


def test_the_harness_report_is_read_where_swebench_writes_it(tmp_path):
    folder = tmp_path / "logs" / "run_evaluation" / "r1" / MODEL / "psf__requests-1963"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({"psf__requests-1963": {"resolved": True}}))
    assert read_harness_report(tmp_path, "r1", "psf__requests-1963", "") is True
    missing = read_harness_report(tmp_path, "r2", "psf__requests-1963", "Error building image x")
    assert missing == "no harness report (Error building image x)"


@pytest.mark.docker
@pytest.mark.slow
def test_one_row_end_to_end_both_graders_agree(tmp_path, monkeypatch):
    """A plain row of the project's own datekit repository (no GitHub needed), measured as the table
    measures a Lite row: build-swe, nextstate's grader and swebench's harness, gold and noop; its spec's
    pre_install edits a tracked file (as sphinx's does tox.ini), which the image's setup commit holds and
    an episode's patch must not. Minutes; PyPI."""
    import importlib.util

    from bench.swe_lite import measure_row
    from nextstate import containers
    from nextstate.envs.swe import SWEEnv
    from nextstate.envs.swe.specs import specs

    spec = importlib.util.spec_from_file_location("make_repos", ROOT / "containers/swe/make_repos.py")
    make_repos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_repos)
    make_repos.build_all(ROOT / "containers/swe/repos", tmp_path / "git")
    extra = tmp_path / "specs.json"
    extra.write_text(json.dumps({"nextstate/datekit": {"0.1": {
        "python": "3.11", "install": "python -m pip install -e .", "pip_packages": ["pytest"],
        "test_cmd": "pytest -rA", "log_parser": "parse_log_pytest",
        "pre_install": ["echo '# set up by the image' >> README.md"]}}}))
    monkeypatch.setenv("NEXTSTATE_SWE_SPECS", str(extra))
    [builtin] = [r for r in read_rows(ROOT / "envs/swe/tasks/instances.jsonl")
                 if r["instance_id"] == "nextstate__datekit-12"]
    plain = {k: v for k, v in builtin.items() if k not in ("image", "eval_script", "log_parser", "eval_type")}
    client = containers.connect()
    try:
        [row] = load_instances([plain])
        got = measure_row(row, client=client, repo_source=str(tmp_path / "git"), harness=True, timeout=300)
        env = SWEEnv([plain], grade_timeout=300)
        try:
            env.reset()
            for action in env.oracle_actions(env.task, "gold"):
                *_, info = env.step(action)
        finally:
            env.close()
    finally:
        specs().pop("nextstate/datekit", None)
        client.close()
    assert got["result"] == "pass", got
    assert (got["harness_gold"], got["harness_noop"], got["harness_agrees"]) == (True, False, True), got
    assert info["outcome"]["resolved"] is True, info["outcome"]
    assert "README.md" not in info["outcome"]["model_patch"] and "datekit/" in info["outcome"]["model_patch"]
