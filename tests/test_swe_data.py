"""The offline SWE instances and their repositories, and the swebench plumbing (no Docker)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nextstate.envs.swe.instances import (BUILTIN, OFFLINE_IMAGE, InstanceError, checkout_command, harness_image,
                                listed_tests, load_instances, make_test_spec, sandbox_user)

ROOT = Path(__file__).resolve().parents[1]
SWE_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "hints_text", "patch",
              "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "version", "environment_setup_commit",
              "created_at")
PYTEST_ID = re.compile(r"^tests/test_\w+\.py::test_\w+(\[[^\]]+\])?$")


def load_make_repos():
    spec = importlib.util.spec_from_file_location("make_repos", ROOT / "containers/swe/make_repos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bare_repos(tmp_path_factory) -> tuple[Path, dict[str, list[str]]]:
    dest = tmp_path_factory.mktemp("bare")
    return dest, load_make_repos().build_all(ROOT / "containers/swe/repos", dest)


def changed_files(patch: str) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/", patch, re.M)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def test_repositories_rebuild_with_the_same_commit_hashes(bare_repos, tmp_path):
    _, hashes = bare_repos
    again = load_make_repos().build_all(ROOT / "containers/swe/repos", tmp_path)
    assert again == hashes
    assert len(hashes) == 2 and all(len(commits) >= 2 for commits in hashes.values())


def test_instances_use_swebench_schema_and_known_commits(bare_repos):
    _, hashes = bare_repos
    instances = load_instances()
    assert len(instances) >= 4
    assert len({i["repo"] for i in instances}) == 2
    for inst in instances:
        assert all(isinstance(inst[k], str) for k in SWE_FIELDS), inst["instance_id"]
        commits = hashes[inst["repo"].replace("/", "__")]
        assert inst["base_commit"] in commits and inst["environment_setup_commit"] == commits[0]
        assert inst["instance_id"].startswith(inst["repo"].replace("/", "__") + "-")
        f2p, p2p = listed_tests(inst, "FAIL_TO_PASS"), listed_tests(inst, "PASS_TO_PASS")
        assert f2p and p2p and not set(f2p) & set(p2p)
        assert all(PYTEST_ID.match(t) for t in f2p + p2p)
        assert inst["image"] == OFFLINE_IMAGE and inst["log_parser"] == "parse_log_pytest"
        assert all(not f.startswith("tests/") for f in changed_files(inst["patch"]))
        assert changed_files(inst["test_patch"]) and all(
            f.startswith("tests/") for f in changed_files(inst["test_patch"]))
        assert ">>>>> Start Test Output" in inst["eval_script"] and inst["test_patch"] in inst["eval_script"]


def run_tests(work: Path, files: list[str]) -> dict[str, str]:
    from swebench.harness.log_parsers import PARSER_REGISTRY
    out = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *files],
                         cwd=work, capture_output=True, text=True,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
                              "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}).stdout
    return PARSER_REGISTRY["parse_log_pytest"](out, None)


def apply(work: Path, patch: str) -> None:
    subprocess.run(["git", "apply", "-"], cwd=work, input=patch, text=True, check=True)


@pytest.mark.parametrize("instance", load_instances(), ids=lambda i: i["instance_id"])
def test_fail_to_pass_and_pass_to_pass_are_honest(instance, bare_repos, tmp_path):
    """With the test patch: FAIL_TO_PASS fail before the gold patch and pass after; PASS_TO_PASS pass in both."""
    dest, _ = bare_repos
    work = tmp_path / "repo"
    git(tmp_path, "clone", "-q", str(dest / f"{instance['repo'].replace('/', '__')}.git"), str(work))
    git(work, "-c", "advice.detachedHead=false", "checkout", "-q", instance["base_commit"])
    apply(work, instance["test_patch"])
    files = sorted(set(changed_files(instance["test_patch"])))
    f2p, p2p = listed_tests(instance, "FAIL_TO_PASS"), listed_tests(instance, "PASS_TO_PASS")
    before = run_tests(work, files)
    assert all(before.get(t) in ("FAILED", "ERROR") for t in f2p), before
    assert all(before.get(t) == "PASSED" for t in p2p), before
    apply(work, instance["patch"])
    after = run_tests(work, files)
    assert all(after.get(t) == "PASSED" for t in f2p + p2p), after
    assert set(after) == set(f2p + p2p)


def test_load_instances_from_jsonl_json_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = load_instances("builtin")
    (tmp_path / "set.json").write_text(json.dumps(rows[:2]))
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[2:4]))
    pq.write_table(pa.Table.from_pylist(rows[4:]), tmp_path / "set.parquet")
    assert load_instances(tmp_path / "set.json") == rows[:2]
    assert load_instances(str(tmp_path / "set.jsonl")) == rows[2:4]
    assert load_instances(tmp_path / "set.parquet") == rows[4:]
    assert load_instances(BUILTIN) == rows


def test_load_instances_rejects_rows_without_swebench_fields():
    with pytest.raises(InstanceError, match="lacks .*test_patch"):
        load_instances([{"instance_id": "x", "repo": "a/b", "base_commit": "c", "problem_statement": "p",
                         "patch": "", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]"}])


def test_unreachable_dataset_gives_a_clear_error(monkeypatch):
    import swebench.harness.utils as utils

    def offline(name, split="test", instance_ids=None):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub")
    monkeypatch.setattr(utils, "load_swebench_dataset", offline)
    with pytest.raises(InstanceError, match=r"'SWE-bench/SWE-bench_Lite' \(split dev\).*\.jsonl"):
        load_instances("SWE-bench/SWE-bench_Lite:dev")


# A SWE-bench row in swebench 5's layout for a django issue, written for this test.
DJANGO_TEST_PATCH = """\
diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py
--- a/tests/auth_tests/test_validators.py
+++ b/tests/auth_tests/test_validators.py
@@ -237,7 +237,7 @@ def test_unicode_validator(self):
-        invalid_usernames = ["o'connell", "عبد ال"]
+        invalid_usernames = ["o'connell", "عبد ال", "trailingnewline\\n"]
"""
DJANGO_ROW = {
    "instance_id": "django__django-11099", "repo": "django/django",
    "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
    "problem_statement": "UsernameValidator allows trailing newline in usernames\n",
    "hints_text": "", "version": "3.0", "created_at": "2019-03-20T03:46:18Z",
    "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27",
    "patch": "diff --git a/django/contrib/auth/validators.py b/django/contrib/auth/validators.py\n",
    "test_patch": DJANGO_TEST_PATCH,
    "FAIL_TO_PASS": json.dumps([
        "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)",
        "test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)"]),
    "PASS_TO_PASS": json.dumps([
        "test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)"]),
    "image": "swebench/sweb.eval.x86_64.django_1776_django-11099:latest",
    "log_parser": "parse_log_django", "eval_type": "pass_and_fail",
    "eval_script": "#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\n"
                   "conda activate testbed\ncd /testbed\n"
                   "git checkout d26b2424437dabeeca94d7900b37d2df4410da0c "
                   "tests/auth_tests/test_validators.py\n"
                   f"git apply -v - <<'EOF_1'\n{DJANGO_TEST_PATCH}EOF_1\n"
                   ": '>>>>> Start Test Output'\n"
                   "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 "
                   "auth_tests.test_validators\n"
                   ": '>>>>> End Test Output'\n"
                   "git checkout d26b2424437dabeeca94d7900b37d2df4410da0c "
                   "tests/auth_tests/test_validators.py\n",
}


def django_log(unicode_status: str) -> str:
    return (">>>>> Start Test Output\n"
            "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests) ... ok\n"
            f"test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests) ... {unicode_status}\n"
            "test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest) ... ok\n"
            ">>>>> End Test Output\n>>>>> Test Exit Code: 0\n")


def test_swebench_test_spec_of_a_django_row():
    from nextstate.envs.swe.grading import log_report
    spec = make_test_spec(DJANGO_ROW)
    assert spec.image == DJANGO_ROW["image"] == harness_image(DJANGO_ROW)
    assert spec.log_parser == "parse_log_django"
    assert spec.FAIL_TO_PASS == listed_tests(DJANGO_ROW, "FAIL_TO_PASS")
    assert "auth_tests.test_validators" in spec.eval_script
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in spec.eval_script  # swebench records the test exit code
    assert sandbox_user(DJANGO_ROW) == "root"
    assert "git clone" not in checkout_command(DJANGO_ROW)  # the image already has /testbed
    assert "git clone -q --no-hardlinks /opt/nextstate/swe/nextstate__datekit.git" in checkout_command(load_instances()[0])
    assert log_report(spec, "x", django_log("ok"))["resolved"] is True
    failed = log_report(spec, "x", django_log("FAIL"))
    assert failed["resolved"] is False
    assert failed["tests_status"]["FAIL_TO_PASS"]["failure"] == [
        "test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)"]


def test_plain_rows_of_a_repo_without_an_install_spec_are_refused_clearly():
    plain = {k: v for k, v in DJANGO_ROW.items() if k not in ("image", "eval_script", "log_parser", "eval_type")}
    moto = {**plain, "repo": "getmoto/moto", "instance_id": "getmoto__moto-1"}
    with pytest.raises(ValueError, match="no install spec for getmoto/moto.*out of scope.*NEXTSTATE_SWE_SPECS"):
        load_instances([moto])
    with pytest.raises(InstanceError, match="no image, eval_script, log_parser, eval_type"):
        make_test_spec(plain)  # not loaded: nothing derived
