"""SWE episodes and grading on the offline instances, in real Docker containers."""

from __future__ import annotations

import json
import time

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from nextstate import containers
from nextstate.envs.pool import SandboxPool
from nextstate.envs.swe import SWEEnv, check_swe
from nextstate.envs.swe.grading import grade
from nextstate.envs.swe.instances import OFFLINE_IMAGE, InstanceError, listed_tests, load_instances

pytestmark = pytest.mark.docker
INSTANCES = {i["instance_id"]: i for i in load_instances()}


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def client():
    client = containers.connect()
    containers.ensure_image("swe", client=client)
    yield client
    client.close()


@pytest.fixture(scope="module")
def pool(client):
    with SandboxPool(OFFLINE_IMAGE, size=1) as pool:
        yield pool


@pytest.fixture
def env(pool):
    env = SWEEnv(pool=pool, grade_timeout=120)
    yield env
    env.close()


def test_registered_env_passes_gymnasiums_checker(client):
    env = gymnasium.make("nextstate/SWE-v0")
    assert isinstance(env.unwrapped, SWEEnv) and env.unwrapped.default_max_steps == 20
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_a_correct_fix_with_the_editor_is_resolved(env, client, pool):
    obs, info = env.reset(options={"task": "nextstate__datekit-12"})
    assert "add_months returns the wrong year" in obs and "/testbed" in obs
    _, _, _, _, info = env.step(call("bash", command="git rev-parse HEAD && python3 -m pytest -q tests"))
    state = info["next_state"]
    assert state["command"].startswith("git rev-parse HEAD") and state["exit_code"] == 0
    assert INSTANCES["nextstate__datekit-12"]["base_commit"] in state["output"]
    _, _, _, _, info = env.step(call("str_replace_editor", command="view", path="datekit/calendar.py",
                                     view_range=[30, 32]))
    assert "    30\t    total = day.month + months" in info["next_state"]["output"]
    assert info["next_state"]["command"] == "str_replace_editor view datekit/calendar.py"
    _, _, _, _, info = env.step(call("str_replace_editor", command="str_replace", path="datekit/calendar.py",
                                     old_str="year = day.year", new_str="year = day.year"))
    assert info["next_state"]["exit_code"] == 0
    _, _, _, _, info = env.step(call("str_replace_editor", command="str_replace", path="datekit/calendar.py",
                                     old_str="    total = day.month + months\n",
                                     new_str="    total = day.month - 1 + months\n"))
    env.step(call("str_replace_editor", command="str_replace", path="/testbed/datekit/calendar.py",
                  old_str="total % 12 or 12", new_str="total % 12 + 1"))
    _, reward, terminated, truncated, info = env.step(call("submit"))
    outcome = info["outcome"]
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert outcome["resolved"] and outcome["submitted"] and outcome["patch_applied"]
    assert sorted(outcome["tests_status"]["FAIL_TO_PASS"]["success"]) == listed_tests(
        INSTANCES["nextstate__datekit-12"], "FAIL_TO_PASS")
    assert outcome["model_patch"].startswith("diff --git a/datekit/calendar.py b/datekit/calendar.py")
    assert not [c for c in containers.project_containers(client, pool.run_id)
                if c["Labels"].get(containers.ROLE_LABEL) == "grader"]


def test_a_wrong_fix_is_not_resolved_and_truncation_grades_too(pool):
    env = SWEEnv(pool=pool, grade_timeout=120, max_steps=3)
    try:
        env.reset(options={"task": "nextstate__inikit-15"})
        env.step(call("str_replace_editor", command="str_replace", path="inikit/config.py",
                      old_str="if value in TRUE_WORDS:", new_str="if value.upper() in TRUE_WORDS:"))
        env.step(call("str_replace_editor", command="create", path="inikit/words.py",
                      file_text="YES = 'yes'\n"))
        _, reward, terminated, truncated, info = env.step(call("bash", command="true"))
    finally:
        env.close()
    outcome = info["outcome"]
    assert (reward, terminated, truncated) == (-1.0, False, True)
    assert not outcome["resolved"] and not outcome["submitted"] and outcome["reason"] == "some tests fail"
    assert outcome["tests_status"]["FAIL_TO_PASS"]["failure"]
    assert outcome["tests_status"]["PASS_TO_PASS"]["failure"]  # "yes" no longer reads as True
    assert "new file mode" in outcome["model_patch"] and "inikit/words.py" in outcome["model_patch"]


def test_submitting_nothing_is_not_resolved(env):
    env.reset(options={"task": "nextstate__inikit-8"})
    _, reward, terminated, _, info = env.step(env.oracle_actions(env.task, "noop")[0])
    assert terminated and reward == -1.0 and info["outcome"]["reason"] == "empty patch"


def test_a_broken_patch_is_reported_as_not_applying(client):
    instance = INSTANCES["nextstate__datekit-17"]
    broken = instance["patch"].replace("-            merged[-1] = Interval(merged[-1].start,",
                                       "-            merged[-1] = Interval(merged[-1].begin,")
    assert broken != instance["patch"]
    result = grade(instance, broken, client=client, run_id="test-broken-patch", timeout=60)
    assert not result.resolved and result.reason == "the patch does not apply"
    assert not result.patch_applied and "patch --batch" in result.log_tail
    assert not containers.project_containers(client, "test-broken-patch")


def test_hung_tests_are_killed_at_the_timeout(client):
    instance = INSTANCES["nextstate__inikit-14"]
    hang = ("diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n"
            "+++ b/conftest.py\n@@ -0,0 +1,2 @@\n+import time\n+time.sleep(600)\n")
    start = time.monotonic()
    result = grade(instance, hang, client=client, run_id="test-hung-tests", timeout=5)
    assert time.monotonic() - start < 60
    assert not result.resolved and result.test_timed_out and "timed out after 5s" in result.reason
    assert result.patch_applied
    assert not containers.project_containers(client, "test-hung-tests")


def test_a_missing_swebench_image_is_a_clear_error(pool):
    row = {**INSTANCES["nextstate__datekit-12"], "instance_id": "django__django-1",
           "image": "swebench/sweb.eval.x86_64.nextstate-missing:latest"}
    env = SWEEnv([row], pool=pool)
    try:
        with pytest.raises(InstanceError, match="not on this Docker engine and pulling it failed; build it with "
                           "`python -m containers build-swe --tasks ROWS --ids django__django-1`"):
            env.reset()
    finally:
        env.close()


def test_evaluate_exits_1_when_an_image_is_missing_and_says_why_once(tmp_path, capsys):
    from nextstate.train.evaluate import main
    row = {**INSTANCES["nextstate__datekit-12"], "instance_id": "nextstate__missing-1",
           "image": "sweb.eval.x86_64.nextstate__missing-1:latest"}
    rows = tmp_path / "rows.jsonl"
    other = {**row, "instance_id": "nextstate__missing-2", "image": "sweb.eval.x86_64.nextstate__missing-2:latest"}
    rows.write_text(json.dumps(row) + "\n" + json.dumps(other) + "\n")
    assert main(["--env", "swe", "--tasks", str(rows), "--policy", "noop", "--parallel", "1",
                 "--output", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.split("error: every episode aborted:\n", 1)[1]  # after the progress bar
    lines = err.splitlines()
    assert len(lines) == 2 and all(x.startswith("  [1x] InstanceError: image sweb.eval.x86_64.nextstate__missing-")
                                   for x in lines)
    assert "Docker said: " in err and "fromImage=sweb.eval.x86_64.nextstate__missing-1" in err  # not cut


def test_validator_accepts_an_instance_and_catches_a_dishonest_one(env):
    instance = INSTANCES["nextstate__inikit-8"]
    task = env.tasks[[t.id for t in env.tasks].index(instance["instance_id"])]
    assert check_swe(env, task) is None
    p2p = listed_tests(instance, "PASS_TO_PASS")
    dishonest = {**instance, "FAIL_TO_PASS": json.dumps(listed_tests(instance, "FAIL_TO_PASS") + p2p[:1])}
    task.data = dishonest
    assert check_swe(env, task) == f"FAIL_TO_PASS tests already pass at the base commit: {p2p[0]}"


@pytest.mark.slow
def test_build_swe_from_a_plain_row_then_gold_resolves_and_noop_does_not(client, tmp_path, monkeypatch):
    """The whole path for a plain row: `containers build-swe` (offline base when no registry answers, the
    repository from a local git source, pip from PyPI), then episodes in the built image. Minutes, and
    needs PyPI."""
    import importlib.util
    from pathlib import Path

    from nextstate.envs.swe.images import build_swe
    from nextstate.envs.swe.specs import specs

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("make_repos", root / "containers/swe/make_repos.py")
    make_repos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_repos)
    make_repos.build_all(root / "containers/swe/repos", tmp_path / "git")  # owner__name.git layout
    extra = tmp_path / "specs.json"
    extra.write_text(json.dumps({"nextstate/datekit": {"0.1": {
        "python": "3.11", "install": "python -m pip install -e .", "pip_packages": ["pytest"],
        "test_cmd": "pytest -rA", "log_parser": "parse_log_pytest"}}}))
    monkeypatch.setenv("NEXTSTATE_SWE_SPECS", str(extra))
    plain = {k: v for k, v in INSTANCES["nextstate__datekit-12"].items()
             if k not in ("image", "eval_script", "log_parser", "eval_type")}
    try:
        [built] = build_swe([plain], client=client, repo_source=str(tmp_path / "git"))
        assert built.error is None and built.image == "sweb.eval.x86_64.nextstate__datekit-12:latest"
        env = SWEEnv([plain])
        try:
            env.reset()
            obs, *_ = env.step(call("bash", command="echo $CONDA_DEFAULT_ENV; python -c 'import datekit'"))
            assert "testbed" in obs and "[exit code 0]" in obs
            for kind, resolved in (("gold", True), ("noop", False)):
                env.reset()
                for action in env.oracle_actions(env.task, kind):
                    *_, info = env.step(action)
                assert info["outcome"]["resolved"] is resolved, info["outcome"]
        finally:
            env.close()
    finally:
        specs().pop("nextstate/datekit", None)
