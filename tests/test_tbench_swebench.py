"""terminal-bench's SWE-bench tasks as its adapter writes them (500 of terminal-bench-datasets' 1487):
``FROM swebench/sweb.eval.x86_64.<id>`` (built here from the task's own ``tests/config.json``), astral.sh's
uv installer piped into ``sh`` (served from the package registry), and ``parser_name: swebench``
(whose ``parser.py`` needs swebench from the registry at test time; graded on this host instead)."""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path

import pytest

from nextstate.containers import build as build_module
from nextstate.containers.build import build_image
from nextstate.containers.uv_installer import offline_uv
from nextstate.envs.swe.images import SWEBENCH_IMAGE, swebench_base
from nextstate.envs.validate import validate

ROOT = Path(__file__).resolve().parents[1]


def test_the_uv_installer_pipe_is_replaced_and_a_copy_goes_before_it() -> None:
    text = ("FROM x\n"
            "RUN apt-get update && apt-get install -y git\n"
            "RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\n"
            "# RUN curl -LsSf https://astral.sh/uv/0.6.0/install.sh | sh\n"
            "RUN apt-get install -y curl && \\\n"
            "    curl -LsSf https://astral.sh/uv/0.7.13/install.sh | env UV_INSTALL_DIR=/usr/local/bin sh && \\\n"
            "    echo done\n")
    new, version = offline_uv(text)
    assert version == "0.7.13"
    assert new.splitlines() == [
        "FROM x",
        "RUN apt-get update && apt-get install -y git",
        "COPY nextstate-uv /usr/local/share/nextstate/uv",
        "RUN sh /usr/local/share/nextstate/uv/uv-install.sh",
        "# RUN curl -LsSf https://astral.sh/uv/0.6.0/install.sh | sh",   # a comment is left as it is
        "COPY nextstate-uv /usr/local/share/nextstate/uv",
        "RUN apt-get install -y curl && \\",
        "    env UV_INSTALL_DIR=/usr/local/bin sh /usr/local/share/nextstate/uv/uv-install.sh && \\",
        "    echo done"]
    assert offline_uv("FROM x\nRUN wget -qO- https://astral.sh/uv/install.sh | bash\n")[1] == ""  # the newest
    assert offline_uv("FROM x\nRUN pip install uv\n") == ("FROM x\nRUN pip install uv\n", None)
    with pytest.raises(ValueError, match="several uv versions"):
        offline_uv("RUN curl https://astral.sh/uv/0.1/install.sh | sh\nRUN curl https://astral.sh/uv/0.2/install.sh | sh")


def test_swebench_names_are_recognised_and_a_missing_row_is_said(tmp_path: Path) -> None:
    for ref in ("swebench/sweb.eval.x86_64.sympy_1776_sympy-13372:latest", "sweb.eval.x86_64.sympy__sympy-13372",
                "docker.io/swebench/sweb.eval.arm64.sympy_1776_sympy-13372@sha256:00"):
        assert SWEBENCH_IMAGE.fullmatch(ref).group("name").replace("_1776_", "__") == "sympy__sympy-13372"
    assert swebench_base("ubuntu:22.04", tmp_path, client=None) is None
    with pytest.raises(ValueError, match=r"base image swebench/sweb\.eval\.x86_64\.a_1776_b-1 is not here .*"
                                         r"neither the task \(tests/config\.json\) nor NEXTSTATE_SWE_ROWS"):
        swebench_base("swebench/sweb.eval.x86_64.a_1776_b-1", tmp_path, client=None)



def test_github_not_answering_is_an_unreachable_host_not_an_absent_requirements_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a local repository, a spec's requirements file is read from raw.githubusercontent.com;
    offline that failed as the task's own ("none of tests/requirements/py3.txt exists in django/django")."""
    import io
    import socket
    import urllib.error
    import urllib.request

    from nextstate.envs.swe import images
    from nextstate.envs.swe.specs import SpecError
    from nextstate.envs.validate import infrastructure

    row = {"instance_id": "django__django-15561", "repo": "django/django", "version": "4.1",
           "base_commit": "6991880109e35c879b71b7d9d9c154baeec12b89",
           "environment_setup_commit": "647480166bfe7532e8c471fef0146e3a17e6c0c9"}

    def offline(url: str, timeout: float) -> None:
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(SpecError, match=r"could not reach raw\.githubusercontent\.com for django/django's "
                                        r"tests/requirements/py3\.txt at 647480166bfe") as raised:
        images.requirements(row, {"requirements": ["tests/requirements/py3.txt"]}, None)
    assert infrastructure(f"RuntimeError: building the SWE-bench base: SpecError: {raised.value}") == \
        "unreachable host raw.githubusercontent.com"

    def missing(url: str, timeout: float) -> None:
        raise urllib.error.HTTPError(url, 404, "Not Found", {}, io.BytesIO())

    monkeypatch.setattr(urllib.request, "urlopen", missing)   # GitHub answers: the file is absent
    assert images.read_at("django/django", None, row["base_commit"], "nothing.txt") is None

@pytest.mark.docker
def test_the_offline_uv_installer_installs_uv_where_the_installer_would(terminal_image: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         docker_client) -> None:
    """astral.sh unreachable (said so here, whatever this machine reaches): uv 0.7.13 from its wheel on
    the package registry, in ``$HOME/.local/bin`` with the ``env`` file, sourced by ``~/.bashrc``."""
    monkeypatch.setattr(build_module, "astral_answers", lambda: False)
    (tmp_path / "Dockerfile").write_text(f"FROM {terminal_image}\nUSER root\n"
                                         "RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\n")
    tag = f"nextstate-test/uv-{uuid.uuid4().hex[:8]}:latest"
    try:
        build_image(tmp_path, tag, client=docker_client)
        out = docker_client.containers.run(tag, ["bash", "-c", ". $HOME/.local/bin/env; uv --version; uvx --version; "
                                                 "grep -c local/bin/env $HOME/.bashrc"], remove=True).decode()
        uv, uvx, sourced = out.splitlines()
        assert uv.startswith("uv 0.7.13") and "0.7.13" in uvx and sourced == "1", out
    finally:
        try:
            docker_client.images.remove(tag, force=True)
        except Exception:
            pass


def _adapter_task(folder: Path, row: dict) -> None:
    """A task as terminal-bench's SWE-bench adapter writes one, for the row's instance."""
    name = row["instance_id"].replace("__", "_1776_")
    folder.mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "tests" / "config.json").write_text(json.dumps(row))
    (folder / "task.yaml").write_text("instruction: |\n  " + row["problem_statement"].replace("\n", "\n  ")
                                      + "\nparser_name: swebench\nmax_test_timeout_sec: 300\n")
    (folder / "Dockerfile").write_text(f"FROM swebench/sweb.eval.x86_64.{name}:latest\n"
                                       "RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\n"
                                       "RUN mkdir -p /logs\n")
    (folder / "solution.sh").write_text(f"#!/bin/bash\ncd /testbed\ncat > /tmp/gold.diff <<'EOF'\n{row['patch']}EOF\n"
                                        "git apply /tmp/gold.diff\n")
    (folder / "run-tests.sh").write_text(
        "#!/bin/bash\nset -uo pipefail -x\ncd /testbed\nsource /opt/miniconda3/bin/activate\nconda activate testbed\n"
        f"git checkout {row['base_commit']} tests/test_calendar.py\n"
        f"cat > /tmp/test_patch.diff <<'EOF'\n{row['test_patch']}EOF\ngit apply /tmp/test_patch.diff\n"
        "LOG_FILE=$(mktemp)\nexport LOG_FILE\nexec 3>&1 4>&2\nexec > >(tee \"$LOG_FILE\") 2>&1\n"
        "pytest -rA tests/test_calendar.py || true\nexec 1>&3 2>&4\ncd ..\n"
        "cat > parser.py <<EOF\n# /// script\n# requires-python = \">=3.11\"\n"
        "# dependencies = [\"swebench==4.0.3\"]\n# ///\nimport swebench\nEOF\nuv run parser.py\n")


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_an_adapted_swebench_task_builds_its_base_and_passes_its_oracle_not_its_noop(
        terminal_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    """The whole path offline: the base ``build-swe`` makes from the task's row (the repository from
    NEXTSTATE_SWE_REPOS, pip from the package registry), uv from the registry, the tests in the sandbox
    (no network, so parser.py's ``uv run`` cannot fetch swebench), and swebench's verdict on this host.
    Minutes, and needs the package registry."""
    from nextstate.envs.swe.instances import load_instances
    from nextstate.envs.swe.specs import specs

    spec = importlib.util.spec_from_file_location("make_repos", ROOT / "containers/swe/make_repos.py")
    make_repos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_repos)
    make_repos.build_all(ROOT / "containers/swe/repos", tmp_path / "git")
    extra = tmp_path / "specs.json"
    extra.write_text(json.dumps({"nextstate/datekit": {"0.1": {
        "python": "3.11", "install": "python -m pip install -e .", "pip_packages": ["pytest"],
        "test_cmd": "pytest -rA", "log_parser": "parse_log_pytest"}}}))
    monkeypatch.setenv("NEXTSTATE_SWE_SPECS", str(extra))
    monkeypatch.setenv("NEXTSTATE_SWE_REPOS", str(tmp_path / "git"))
    monkeypatch.setenv("NEXTSTATE_OFFLINE", "1")   # no image registry, as here: the base is built, not pulled
    monkeypatch.setattr(build_module, "astral_answers", lambda: False)
    row = {k: v for k, v in next(r for r in load_instances() if r["instance_id"] == "nextstate__datekit-12").items()
           if k not in ("image", "eval_script", "log_parser", "eval_type")}
    _adapter_task(tmp_path / "tasks" / "swebench-verified__nextstate__datekit-12", row)
    try:
        [check] = validate("terminal", tmp_path / "tasks", parallel=1, backend="docker")
        assert check.ok, check.line()
    finally:
        specs().pop("nextstate/datekit", None)
