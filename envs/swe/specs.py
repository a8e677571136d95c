"""What a plain SWE-bench row needs to be built and graded, derived the way SWE-bench derives it.

A plain row (``instance_id``, ``repo``, ``version``, ``base_commit``,
``environment_setup_commit``, ``test_patch``, ``FAIL_TO_PASS``, ...) names no
image, eval script or log parser. swebench 5 grades with those fields and no
longer ships the per-repository install specs that produced them (swebench 4
did). This module holds those facts for the repositories listed in
:data:`SPECS` (add more with a JSON file named by ``NEXTSTATE_SWE_SPECS``, or
``--specs`` of ``python -m containers build-swe``), and derives from a row:

* the image name, ``sweb.eval.x86_64.<instance_id>:latest`` (swebench's
  :class:`~swebench.image_builder.ImageSpec` naming);
* the log parser, swebench's ``MAP_REPO_TO_PARSER`` entry for the repo;
* the eval type, ``fail_only`` for swebench's ``FAIL_ONLY_REPOS``;
* the eval script, in SWE-bench's shape: activate the ``testbed`` env,
  reinstall the repo, reset the test files, apply ``test_patch``, run the
  spec's test command on the files it touches between swebench's markers;
* the scripts that set up the env and the repository in the image
  (:mod:`envs.swe.images` builds them).

Other datasets: SWE-Gym rows have the same layout (they name their
repositories' specs the same way, so a row of an unlisted repo is refused
with the missing spec named); R2E-Gym rows carry their own ``docker_image``
and no ``test_patch`` split and are refused with that said (:func:`check_row`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

ENV_NAME = "testbed"
TESTBED = "/testbed"
CONDA = "/opt/miniconda3"
ACTIVATE = f"source {CONDA}/bin/activate && conda activate {ENV_NAME}"
HEREDOC = "EOF_114329324912"
PYTEST = "pytest -rA"
# test files by extension that SWE-bench never passes to the test command
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")


def _versions(spec: dict[str, Any], *versions: str) -> dict[str, dict[str, Any]]:
    return {v: spec for v in versions}


_FLASK_PINS_3_11 = ["setuptools==70.0.0", "click==8.1.3", "itsdangerous==2.1.2", "Jinja2==3.1.2",
                    "MarkupSafe==2.1.1", "Werkzeug==2.3.7"]
#: Install specs per repository and version: facts from SWE-bench's harness (swebench 4's
#: ``MAP_REPO_VERSION_TO_SPECS``). ``python``: the interpreter; ``requirements``: files at the
#: environment setup commit to pip-install (first that exists); ``pip_packages``: extra pins;
#: ``install``: how the repo is installed; ``test_cmd``: the test command; optional ``pre_install``,
#: ``eval_commands`` and ``log_parser`` (a name in swebench's ``PARSER_REGISTRY``, for repos it lacks).
SPECS: dict[str, dict[str, dict[str, Any]]] = {
    "pallets/flask": {
        "2.0": {"python": "3.9", "requirements": ["requirements/dev.txt"], "install": "python -m pip install -e .",
                "pip_packages": ["setuptools==70.0.0", "Werkzeug==2.3.7", "Jinja2==3.0.1", "itsdangerous==2.1.2",
                                 "click==8.0.1", "MarkupSafe==2.1.3"], "test_cmd": PYTEST},
        "2.1": {"python": "3.10", "requirements": ["requirements/dev.txt"], "install": "python -m pip install -e .",
                "pip_packages": _FLASK_PINS_3_11, "test_cmd": PYTEST},
        **_versions({"python": "3.11", "requirements": ["requirements/dev.txt"],
                     "install": "python -m pip install -e .", "pip_packages": _FLASK_PINS_3_11,
                     "test_cmd": PYTEST}, "2.2", "2.3", "3.0", "3.1"),
    },
    "marshmallow-code/marshmallow": _versions(
        {"python": "3.9", "install": "python -m pip install -e '.[dev]'", "test_cmd": PYTEST},
        "2.18", "2.19", "2.20", "3.0", "3.1", "3.2", "3.4", "3.8", "3.9", "3.10", "3.11", "3.12", "3.13",
        "3.15", "3.16", "3.19"),
    "psf/requests": _versions(
        {"python": "3.9", "pip_packages": ["pytest"], "install": "python -m pip install .", "test_cmd": PYTEST},
        "0.7", "0.8", "0.9", "0.11", "0.13", "0.14", "1.1", "1.2", "2.0", "2.2", "2.3", "2.4", "2.5", "2.7",
        "2.8", "2.9", "2.10", "2.11", "2.12", "2.17", "2.18", "2.19", "2.22", "2.25", "2.26", "2.27", "2.31",
        "3.0"),
}
_extra_loaded: str | None = None


class SpecError(ValueError):
    """A row cannot be built or graded; the message says what is missing."""


def specs() -> dict[str, dict[str, dict[str, Any]]]:
    """:data:`SPECS`, merged once with the JSON file ``NEXTSTATE_SWE_SPECS`` names (``{repo: {version: spec}}``)."""
    global _extra_loaded
    path = os.environ.get("NEXTSTATE_SWE_SPECS")
    if path and path != _extra_loaded:
        try:
            extra = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SpecError(f"NEXTSTATE_SWE_SPECS={path}: {e}") from None
        for repo, versions in extra.items():
            SPECS.setdefault(repo, {}).update(versions)
        _extra_loaded = path
    return SPECS


def check_row(row: dict[str, Any]) -> None:
    """Refuses rows of other layouts with what they lack (R2E-Gym, rows without tests)."""
    rid = row.get("instance_id") or row.get("docker_image") or "?"
    if "instance_id" not in row and ("docker_image" in row or "parsed_commit_content" in row):
        raise SpecError(
            f"row {rid} is in R2E-Gym's layout (docker_image, parsed_commit_content): it has no "
            "instance_id, base_commit, test_patch, FAIL_TO_PASS or PASS_TO_PASS, so it cannot be graded "
            "the SWE-bench way; convert it to SWE-bench's schema first")


def spec_of(row: dict[str, Any]) -> dict[str, Any]:
    """The install spec for the row's repo and version, or a :class:`SpecError` naming what is missing."""
    table = specs()
    repo, version = row["repo"], str(row.get("version", ""))
    if repo not in table:
        raise SpecError(
            f"instance {row['instance_id']}: no install spec for {repo} (known: {', '.join(sorted(table))}); "
            "give the row image, eval_script, log_parser and eval_type, or add the repo's spec in a JSON "
            "file named by NEXTSTATE_SWE_SPECS ({repo: {version: {python, install, test_cmd, ...}}})")
    if version not in table[repo]:
        raise SpecError(f"instance {row['instance_id']}: no install spec for {repo} version {version!r} "
                        f"(known: {', '.join(sorted(table[repo]))}); add it with NEXTSTATE_SWE_SPECS")
    return table[repo][version]


def image_name(row: dict[str, Any]) -> str:
    """swebench's local image name for the row's instance."""
    from swebench.image_builder import ImageSpec

    return ImageSpec(instance_id=row["instance_id"], dockerfile="-", namespace=None).name


def log_parser(row: dict[str, Any]) -> str:
    """The name of swebench's log parser for the row's repository (a spec's ``log_parser`` first)."""
    from swebench.harness import log_parsers

    named = specs().get(row["repo"], {}).get(str(row.get("version", "")), {}).get("log_parser")
    if named:
        return named

    parser = None
    for language, suffix in (("python", "PY"), ("javascript", "JS"), ("c", "C"), ("go", "GO"),
                             ("java", "JAVA"), ("php", "PHP"), ("ruby", "RUBY"), ("rust", "RUST")):
        table = getattr(getattr(log_parsers, language), f"MAP_REPO_TO_PARSER_{suffix}")
        parser = parser or table.get(row["repo"])
    if parser is None:
        raise SpecError(f"instance {row['instance_id']}: swebench has no log parser for {row['repo']}")
    return parser.__name__


def eval_type(row: dict[str, Any]) -> str:
    """``fail_only`` for swebench's FAIL_ONLY_REPOS, else ``pass_and_fail``."""
    from swebench.harness.constants import FAIL_ONLY_REPOS, EvalType

    return (EvalType.FAIL_ONLY if row["repo"] in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL).value


def modified_files(patch: str) -> list[str]:
    """Files a diff changes that exist before it (the ones to reset), in order."""
    files = []
    for old, new in re.findall(r"^--- (\S+)\n\+\+\+ (\S+)", patch, re.MULTILINE):
        if old != "/dev/null" and old.startswith("a/"):
            files.append(old[2:])
    return list(dict.fromkeys(files))


def test_directives(row: dict[str, Any]) -> list[str]:
    """The test files the test patch touches (SWE-bench's test directives; Django's as modules)."""
    found = [d for d in re.findall(r"diff --git a/.* b/(.*)", row["test_patch"])
             if not d.endswith(NON_TEST_EXTS)]
    if row["repo"] == "django/django":
        found = [d.removesuffix(".py").removeprefix("tests/").replace("/", ".") for d in found]
    return found


def eval_script(row: dict[str, Any]) -> str:
    """The eval script for the row, in SWE-bench's shape (markers swebench's grader reads)."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    spec = spec_of(row)
    base, test_patch = row["base_commit"], row["test_patch"]
    reset = f"git checkout {base} {' '.join(modified_files(test_patch))}"
    test_command = " ".join([spec["test_cmd"], *test_directives(row)])
    lines = ["#!/bin/bash", "set -uxo pipefail", ACTIVATE, f"cd {TESTBED}", *spec.get("eval_commands", []),
             f"git config --global --add safe.directory {TESTBED}", f"cd {TESTBED}", "git status", "git show",
             f"git -c core.fileMode=false diff {base}", ACTIVATE]
    if spec.get("install"):
        lines.append(spec["install"])
    lines += [reset, f"git apply -v - <<'{HEREDOC}'\n{test_patch}\n{HEREDOC}", f": '{START_TEST_OUTPUT}'",
              test_command, f": '{END_TEST_OUTPUT}'", reset]
    return "\n".join(lines) + "\n"


def complete_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row with ``image``, ``eval_script``, ``log_parser`` and ``eval_type`` filled in where absent."""
    check_row(row)
    if all(row.get(k) for k in ("image", "eval_script", "log_parser", "eval_type")):
        return row
    row = dict(row)
    row.setdefault("version", "")
    row["eval_script"] = row.get("eval_script") or eval_script(row)
    row["image"] = row.get("image") or image_name(row)
    row["log_parser"] = row.get("log_parser") or log_parser(row)
    row["eval_type"] = row.get("eval_type") or eval_type(row)
    return row
