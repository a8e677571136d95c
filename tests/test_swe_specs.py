"""Plain SWE-bench rows: what is derived from them, the build context of their images, and how a
run of them fails (no Docker; the rows and the repository are written here)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from nextstate.containers.build import host_ca_bundle
from nextstate.envs.swe.images import (CONDA_STANDIN, env_link_hook, repo_path, requirements, setup_env_script,
                                   setup_repo_script, write_context)
from nextstate.envs.swe import instance_task
from nextstate.envs.swe import test_command as eval_test_command
from nextstate.envs.swe.grading import log_report
from nextstate.envs.swe.instances import load_instances, make_test_spec
from nextstate.envs.swe.specs import SpecError, check_row, complete_row, modified_files, spec_of, specs
from nextstate.train.evaluate import failure, model_name

TEST_PATCH = """\
diff --git a/tests/test_api.py b/tests/test_api.py
--- a/tests/test_api.py
+++ b/tests/test_api.py
@@ -1,2 +1,5 @@
 def test_old():
     assert True
+
+def test_new():
+    assert True
diff --git a/tests/data/sample.json b/tests/data/sample.json
new file mode 100644
--- /dev/null
+++ b/tests/data/sample.json
@@ -0,0 +1 @@
+{}
"""


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path) -> tuple[Path, str, str]:
    """A git repository of 'pallets/flask' written here: requirements with an include, two commits."""
    work = tmp_path / "src" / "pallets+flask"
    (work / "requirements").mkdir(parents=True)
    (work / "requirements" / "dev.txt").write_text("-e .\n# comment\n-r tests.txt\ntox==4.0\n")
    (work / "requirements" / "tests.txt").write_text("pytest==7.2.0\n")
    (work / "tests").mkdir()
    (work / "tests" / "test_api.py").write_text("def test_old():\n    assert True\n")
    git(work, "init", "-q", "-b", "main")
    git(work, "add", "-A")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    setup = git(work, "rev-parse", "HEAD")
    (work / "README").write_text("x\n")
    git(work, "add", "-A")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "two")
    return tmp_path / "src", setup, git(work, "rev-parse", "HEAD")


def plain_row(base: str, setup: str, **extra) -> dict:
    """A plain SWE-bench row (no image, eval_script, log_parser or eval_type)."""
    return {"instance_id": "pallets__flask-1", "repo": "pallets/flask", "version": "2.3", "base_commit": base,
            "environment_setup_commit": setup, "problem_statement": "Add test_new.\n", "hints_text": "",
            "created_at": "2023-01-01T00:00:00Z", "patch": "", "test_patch": TEST_PATCH,
            "FAIL_TO_PASS": json.dumps(["tests/test_api.py::test_new"]),
            "PASS_TO_PASS": json.dumps(["tests/test_api.py::test_old"]), **extra}


def test_a_plain_row_gets_swebench_image_parser_and_eval_script():
    row = load_instances([plain_row("a" * 40, "b" * 40)])[0]
    assert row["image"] == "sweb.eval.x86_64.pallets__flask-1:latest"
    assert (row["log_parser"], row["eval_type"]) == ("parse_log_pytest", "pass_and_fail")
    script = row["eval_script"]
    assert script.count(f"git checkout {'a' * 40} tests/test_api.py") == 2  # before and after, new files not reset
    assert "pytest -rA tests/test_api.py\n" in script  # the .json is no test directive
    assert "python -m pip install -e ." in script and "conda activate testbed" in script
    spec = make_test_spec(row)  # swebench's own TestSpec takes the derived fields
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in spec.eval_script
    log = (">>>>> Start Test Output\nPASSED tests/test_api.py::test_old\n{}tests/test_api.py::test_new\n"
           ">>>>> End Test Output\n>>>>> Test Exit Code: 0\n")
    assert log_report(spec, "x", log.format("PASSED "))["resolved"] is True
    assert log_report(spec, "x", log.format("FAILED "))["resolved"] is False


def test_rows_that_already_carry_harness_fields_are_kept():
    row = plain_row("a" * 40, "b" * 40, image="mine:1", eval_script="x", log_parser="parse_log_pytest",
                    eval_type="pass_and_fail")
    assert complete_row(row) == row


def test_unknown_versions_and_extra_specs(tmp_path, monkeypatch):
    with pytest.raises(SpecError, match=r"no install spec for pallets/flask version '9.9'"):
        complete_row(plain_row("a" * 40, "b" * 40, version="9.9"))
    extra = tmp_path / "specs.json"
    extra.write_text(json.dumps({"acme/widgets": {"1.0": {"python": "3.11", "install": "pip install .",
                                                          "test_cmd": "pytest -q"}}}))
    monkeypatch.setenv("NEXTSTATE_SWE_SPECS", str(extra))
    row = plain_row("a" * 40, "b" * 40, repo="acme/widgets", version="1.0", instance_id="acme__widgets-1")
    assert spec_of(row)["test_cmd"] == "pytest -q"
    with pytest.raises(SpecError, match="no log parser for acme/widgets"):
        complete_row(row)
    specs().pop("acme/widgets")


def test_r2e_gym_rows_are_refused_with_what_they_lack():
    with pytest.raises(SpecError, match="R2E-Gym.*no instance_id, base_commit, test_patch"):
        check_row({"docker_image": "namanjain12/orange3_final:abc", "parsed_commit_content": "{}"})
    with pytest.raises(SpecError, match="R2E-Gym"):
        load_instances([{"docker_image": "x", "parsed_commit_content": "{}", "problem_statement": "p"}])


def test_swe_gym_rows_read_like_swe_bench_rows():
    """SWE-Gym rows have SWE-bench's columns; one of a repo with a spec loads, others name the gap."""
    row = plain_row("a" * 40, "b" * 40)
    assert load_instances([row])[0]["image"].startswith("sweb.eval.x86_64.")
    with pytest.raises(SpecError, match="no install spec for getmoto/moto"):
        load_instances([{**row, "repo": "getmoto/moto", "instance_id": "getmoto__moto-1", "version": "4.1"}])


def test_instruction_says_the_env_is_active_and_how_to_run_tests():
    row = load_instances([plain_row("a" * 40, "b" * 40)])[0]
    assert eval_test_command(row) == "pytest -rA"
    text = instance_task(row).instruction
    assert "`testbed` activated" in text and "`pytest -rA`" in text
    assert "activated" not in instance_task(load_instances()[0]).instruction  # the offline set has no env


def test_modified_files_skip_new_files():
    assert modified_files(TEST_PATCH) == ["tests/test_api.py"]


def test_repo_source_layouts_and_requirements_at_the_setup_commit(repo, tmp_path):
    source, setup, base = repo
    row = plain_row(base, setup)
    assert repo_path("pallets/flask", str(source)) == source / "pallets+flask"
    assert repo_path("pallets/flask", None) is None  # GitHub, as SWE-bench clones
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"pallets/flask": str(source / "pallets+flask")}))
    assert repo_path("pallets/flask", str(mapping)) == source / "pallets+flask"
    with pytest.raises(SpecError, match="holds no git repository for psf/requests"):
        repo_path("psf/requests", str(source))
    reqs = requirements(row, spec_of(row), str(source))
    assert reqs.split() == ["pytest==7.2.0", "tox==4.0"]  # -r inlined, -e . and comments dropped


def test_build_context_clones_from_the_source_and_trusts_the_ca(repo, tmp_path):
    source, setup, base = repo
    row = complete_row(plain_row(base, setup))
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    assert host_ca_bundle(str(bundle)) == bundle
    with pytest.raises(ValueError, match="no such file"):
        host_ca_bundle(str(tmp_path / "missing.pem"))
    context = tmp_path / "ctx"
    context.mkdir()
    digest = write_context(row, context, repo_source=str(source), ca_bundle=bundle)
    assert git(context / "repo.git", "cat-file", "-t", base) == "commit"
    assert (context / "ca.crt").read_text() == bundle.read_text()
    repo_script = (context / "setup_repo.sh").read_text()
    assert "git clone -q -o origin /nextstate-build/repo.git /testbed" in repo_script
    assert f"git reset --hard {base}" in repo_script and "git remote remove origin" in repo_script
    assert "python -m pip install -e ." in repo_script
    env_script = setup_env_script(spec_of(row))
    assert "python3.11 -m venv /opt/miniconda3/envs/testbed" in env_script and "Werkzeug==2.3.7" in env_script
    assert "PIP_CERT=/nextstate-build/ca.crt" in env_script
    online = setup_repo_script(row, spec_of(row), local=False)
    assert "https://github.com/pallets/flask /testbed" in online
    again = tmp_path / "ctx2"
    again.mkdir()
    assert write_context(row, again, repo_source=str(source), ca_bundle=None) == digest  # cache key stable


def test_a_mirror_lacking_later_objects_gives_the_history_of_the_base(repo, tmp_path):
    """A fetched mirror may lack objects (its largest files): the whole clone fails, and the build copies
    what SWE-bench's setup keeps, the base commit's history and the tags in it."""
    from nextstate.envs.swe.images import copy_repository

    source, setup, base = repo
    work = source / "pallets+flask"
    git(work, "tag", "v1", setup)
    (work / "later.txt").write_text("a blob of a commit after the base\n")
    git(work, "add", "-A")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "three")
    git(work, "tag", "v2")
    blob = git(work, "rev-parse", "HEAD:later.txt")
    (work / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    copy_repository(work, base, tmp_path / "copy.git")
    assert git(tmp_path / "copy.git", "rev-parse", "HEAD") == base
    assert git(tmp_path / "copy.git", "tag").split() == ["v1"]
    with pytest.raises(SpecError, match="nor the history of"):
        copy_repository(work, git(work, "rev-parse", "HEAD"), tmp_path / "again.git")


def test_the_conda_stand_in_activates_the_venv(tmp_path):
    script = CONDA_STANDIN.replace("/opt/miniconda3", str(tmp_path))
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(tmp_path / "envs" / "testbed")], check=True)
    out = subprocess.run(["bash", "-c", f"{script}\nconda activate testbed && command -v python && "
                          "echo $CONDA_DEFAULT_ENV; conda install x"], capture_output=True, text=True)
    assert out.stdout.split() == [str(tmp_path / "envs" / "testbed" / "bin" / "python"), "testbed"]
    assert "only 'conda activate NAME'" in out.stderr


def test_a_symlink_to_the_envs_python_sees_the_envs_packages_as_with_conda(tmp_path):
    """tox --current-env links .tox/py39/bin/python to the env's python: a venv's then runs the system
    interpreter without the env's packages (sphinx's Lite rows: 'No module named pytest'). The hook, in the
    system interpreter's site directory, adds them then, and only then. A site directory made here stands
    in for the system's (the host's cannot be written)."""
    import sys

    env = tmp_path / "envs" / "testbed"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    (env / "lib" / f"python{version}" / "site-packages" / "only_in_env.py").write_text("")
    system_site = tmp_path / "system-site"
    system_site.mkdir()
    (system_site / "nextstate_testbed_env.py").write_text(env_link_hook(str(env), version))
    (system_site / "nextstate_testbed_env.pth").write_text("import nextstate_testbed_env\n")
    link = tmp_path / "tox" / "bin" / "python"
    link.parent.mkdir(parents=True)
    link.symlink_to(env / "bin" / "python")
    probe = (f"import site; site.addsitedir({str(system_site)!r}); import importlib.util; "
             "print(importlib.util.find_spec('only_in_env') is not None)")
    through_link = subprocess.run([str(link), "-c", probe], capture_output=True, text=True, check=True)
    direct = subprocess.run([str(Path(sys.base_prefix) / "bin" / f"python{version}"), "-c", probe],
                            capture_output=True, text=True, check=True)
    assert (through_link.stdout.strip(), direct.stdout.strip()) == ("True", "False")


@pytest.mark.parametrize(("message", "stays"), [("SWE-bench", True), ("the fix", False)])
def test_a_swebench_images_setup_commit_on_the_base_counts_as_the_base(tmp_path, message, stays):
    """SWE-bench's image setup commits its pre_install edits (sphinx: tox.ini's `pytest -rA`) on top of
    base_commit; the harness grades there. Checking out base_commit instead lost `-rA`, and with it every
    test result. Any other commit on top (a fix) is still left for the base."""
    from nextstate.envs.swe.instances import checkout_command

    (tmp_path / "tox.ini").write_text("commands = pytest\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    base = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "tox.ini").write_text("commands = pytest -rA\n")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", message)
    top = git(tmp_path, "rev-parse", "HEAD")
    command = checkout_command({"base_commit": base, "image": "sweb.eval.x86_64.a__b-1:latest"})
    subprocess.run(["bash", "-c", command.replace("/testbed", str(tmp_path))], check=True)
    assert git(tmp_path, "rev-parse", "HEAD") == (top if stays else base)


def test_evaluate_fails_when_all_abort_or_any_for_a_configuration_reason():
    ok = {"total": 3, "abort_reasons": {}}
    assert failure(ok) is None
    assert failure({"total": 3, "abort_reasons": {"SandboxError: container died": 1}}) is None
    missing = ("InstanceError: image sweb.eval.x86_64.a:latest is not on this Docker engine and pulling it "
               "failed; build it with `python -m containers build-swe`. Docker said: 404 Client Error for "
               "http+docker://localhost/v1.41/images/create?tag=latest&fromImage=sweb.eval.x86_64.a")
    message = failure({"total": 3, "abort_reasons": {missing: 1}})
    assert message.startswith("error: episodes aborted for a configuration reason") and missing in message
    everything = failure({"total": 2, "abort_reasons": {"SandboxError: container died": 2}})
    assert everything.startswith("error: every episode aborted") and "[2x] SandboxError: container died" in everything


def test_model_name_or_path_is_the_model():
    class Served:
        name, model = "openai:http://127.0.0.1:8000/v1", "Qwen/Qwen3-8B"

    class Local:
        name, model = "hf:/models/tiny", object()

    assert model_name(Served(), "http://127.0.0.1:8000/v1") == "Qwen/Qwen3-8B"
    assert model_name(Local(), "/models/tiny") == "/models/tiny"
    assert model_name("gold", "gold") == "gold"


LITE_REPOS = ("astropy/astropy", "django/django", "matplotlib/matplotlib", "mwaskom/seaborn", "pallets/flask",
              "psf/requests", "pydata/xarray", "pylint-dev/pylint", "pytest-dev/pytest",
              "scikit-learn/scikit-learn", "sphinx-doc/sphinx", "sympy/sympy")


@pytest.fixture(scope="module")
def swebench4(tmp_path_factory):
    """swebench 4.1's Python constants module, read from its wheel (swebench 5, installed here, no longer
    ships the specs). The wheel comes from PyPI with pip; without PyPI the comparison cannot be made."""
    import importlib.util
    import sys
    import zipfile

    folder = tmp_path_factory.mktemp("swebench4")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "swebench==4.1.0",
                          "-d", str(folder)], capture_output=True, text=True)
    wheels = list(folder.glob("swebench-4.1.0-*.whl"))
    if not wheels:
        pytest.skip(f"swebench 4.1.0 cannot be downloaded here: {got.stderr.strip()[-300:]}")
    source = folder / "python.py"
    source.write_bytes(zipfile.ZipFile(wheels[0]).read("swebench/harness/constants/python.py"))
    spec = importlib.util.spec_from_file_location("swebench4_constants_python", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # plain data: no imports
    return module


def test_specs_are_swebench_4s_for_every_python_repository(swebench4):
    """Every Python repository and version of swebench 4.1's table, field for field; Lite's 12 among them."""
    theirs = {r: v for r, v in swebench4.MAP_REPO_VERSION_TO_SPECS_PY.items() if r != "swe-bench/humaneval"}
    ours = specs()
    assert set(LITE_REPOS) <= set(ours) and set(ours) == set(theirs)
    for repo, versions in theirs.items():
        assert set(ours[repo]) == set(versions), repo
        for version, spec in versions.items():
            mine = dict(ours[repo][version])
            if "requirements" in mine:  # swebench names the kind, and the paths in a table of its own
                assert mine.pop("requirements") == swebench4.MAP_REPO_TO_REQS_PATHS[repo]
                mine["packages"] = "requirements.txt"
            if "environment" in mine:
                assert mine.pop("environment") == swebench4.MAP_REPO_TO_ENV_YML_PATHS[repo]
                mine["packages"] = "environment.yml"
            assert mine == spec, f"{repo} {version}"


@pytest.mark.parametrize("repo", LITE_REPOS)
def test_a_plain_row_of_every_lite_repository_loads_with_swebench_fields(repo):
    """The eval script runs the spec's test command on the test patch's files (Django's as modules)."""
    version = max(specs()[repo], key=lambda v: [int(x) for x in re.findall(r"\d+", v)])
    row = plain_row("a" * 40, "b" * 40, repo=repo, version=version, instance_id=repo.replace("/", "__") + "-1")
    [loaded] = load_instances([row])
    spec = spec_of(row)
    directive = "test_api" if repo == "django/django" else "tests/test_api.py"
    assert f"{spec['test_cmd']} {directive}\n" in loaded["eval_script"]
    assert all(command in loaded["eval_script"] for command in spec.get("eval_commands", []))
    assert loaded["log_parser"].startswith("parse_log_") and make_test_spec(loaded).instance_id == row["instance_id"]


def test_non_python_repositories_are_named_out_of_scope():
    row = plain_row("a" * 40, "b" * 40, repo="Automattic/wp-calypso", version="10.0",
                    instance_id="Automattic__wp-calypso-1")
    with pytest.raises(SpecError, match="Multimodal and Multilingual.*out of scope"):
        load_instances([row])


def test_package_lists_and_conda_environment_files_reach_pip(repo, tmp_path):
    """swebench's conda ``packages`` are pip-installed; an environment file gives its ``pip:`` list."""
    source, setup, base = repo
    requests = spec_of(plain_row(base, setup, repo="psf/requests", version="2.0"))
    assert "python -m pip install pytest\n" in setup_env_script(requests)
    work = source / "pallets+flask"
    (work / "environment.yml").write_text("dependencies:\n  - python=3.10\n  - numpy\n  - pip:\n"
                                          "    - hypothesis==6.0\n    - -e .\n")
    git(work, "add", "-A")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "env")
    row = plain_row(git(work, "rev-parse", "HEAD"), git(work, "rev-parse", "HEAD"))
    assert requirements(row, {"environment": ["ci/environment.yml", "environment.yml"]}, str(source)) == \
        "hypothesis==6.0\n"


def test_ids_choose_rows_before_specs_are_needed(tmp_path):
    """`--ids` on a file whose other rows have no spec (R2E-Gym, an unlisted repo): the chosen row loads."""
    rows = tmp_path / "rows.jsonl"
    good = plain_row("a" * 40, "b" * 40)
    rows.write_text("\n".join(json.dumps(r) for r in (
        good, {**good, "instance_id": "getmoto__moto-1", "repo": "getmoto/moto", "version": "4.1"},
        {"docker_image": "namanjain12/orange3_final:abc", "parsed_commit_content": "{}"})) + "\n")
    assert [r["instance_id"] for r in load_instances(str(rows), ["pallets__flask-1"])] == ["pallets__flask-1"]
    with pytest.raises(SpecError, match="getmoto/moto"):
        load_instances(str(rows), ["getmoto__moto-1"])
    with pytest.raises(ValueError, match="unknown instance ids .*: nope"):
        load_instances(str(rows), ["nope"])


def test_export_writes_rows_swebenchs_own_harness_reads(tmp_path):
    """`python -m containers export-swe`: the completed rows load with swebench's own loader and make_test_spec,
    which fail on the plain rows (KeyError: 'image')."""
    from swebench.harness.utils import load_swebench_dataset
    from swebench.harness.utils import make_test_spec as swebench_test_spec

    from nextstate.containers.__main__ import main

    plain, out = tmp_path / "lite.jsonl", tmp_path / "lite.harness.jsonl"
    plain.write_text(json.dumps(plain_row("a" * 40, "b" * 40)) + "\n"
                     + json.dumps(plain_row("a" * 40, "b" * 40, repo="getmoto/moto", instance_id="m-1")) + "\n")
    with pytest.raises(KeyError, match="image"):
        swebench_test_spec(load_swebench_dataset(str(plain))[0])
    assert main(["export-swe", "--tasks", str(plain), "--ids", "pallets__flask-1", "--out", str(out)]) == 0
    [row] = load_swebench_dataset(str(out))
    spec = swebench_test_spec(row)
    assert spec.image == "sweb.eval.x86_64.pallets__flask-1:latest" and "pytest -rA tests/test_api.py" in spec.eval_script


def test_the_repository_source_is_no_part_of_an_images_identity(repo, tmp_path, monkeypatch):
    """The context of a build from a local source and of one from GitHub hash alike. GitHub can't be
    reached here: its raw file reads are served from the same local repository (a stand-in)."""
    import nextstate.envs.swe.images as images

    source, setup, base = repo
    row = complete_row(plain_row(base, setup))
    local = tmp_path / "local"
    local.mkdir()
    from_local = write_context(row, local, repo_source=str(source), ca_bundle=None)
    read_local = images.read_at
    monkeypatch.setattr(images, "read_at", lambda r, s, c, p: read_local(r, str(source), c, p))
    github = tmp_path / "github"
    github.mkdir()
    assert write_context(row, github, repo_source=None, ca_bundle=None) == from_local
    assert "https://github.com/pallets/flask" in (github / "setup_repo.sh").read_text()


def test_a_grade_names_network_failures():
    from nextstate.envs.swe.grading import Grade, _with_network

    log = ("FAILED tests/test_requests.py::test_HTTP_200_OK_GET - requests.exceptions.ConnectionError: "
           "HTTPConnectionPool(host='httpbin.org', port=80): Max retries exceeded (Caused by NewConnectionError("
           "'Failed to establish a new connection: [Errno -3] Temporary failure in name resolution'))")
    graded = _with_network(Grade(False, "some tests fail"), log)
    assert graded.network_failure and "need the internet" in graded.reason
    assert "Temporary failure in name resolution" in graded.reason
    assert _with_network(Grade(False, "some tests fail"), "FAILED tests/x.py::t - assert 1 == 2").reason == \
        "some tests fail"
    assert _with_network(Grade(True), log).reason is None  # a resolved grade is not blamed on anything
