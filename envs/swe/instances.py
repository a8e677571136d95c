"""SWE-bench instances: loading them and what their sandboxes need.

Instances use SWE-bench's schema (``instance_id``, ``repo``, ``base_commit``,
``problem_statement``, ``hints_text``, ``patch``, ``test_patch``,
``FAIL_TO_PASS``, ``PASS_TO_PASS`` as JSON-encoded lists or lists,
``version``, ``environment_setup_commit``, ``created_at``). The fields with
which swebench 5 grades an instance (``image``, ``eval_script``,
``log_parser``, ``eval_type``) are used when a row has them and otherwise
derived the way SWE-bench derives them (:mod:`envs.swe.specs`); the images of
plain rows are built by ``python -m containers build-swe``.

The built-in set (``envs/swe/tasks/instances.jsonl``) runs offline: its
repositories are made by ``containers/swe`` into the image
``nextstate/swe:latest``, and an episode clones the instance's repository
into ``/testbed``. A SWE-bench image already holds its repository there at
the base commit; its image must be present locally or pullable.
"""

from __future__ import annotations

import json
import shlex
import threading
from pathlib import Path
from typing import Any

from nextstate.envs.base import read_rows
from nextstate.envs.swe.specs import check_row, complete_row

BUILTIN = Path(__file__).parent / "tasks" / "instances.jsonl"
OFFLINE_IMAGE = "nextstate/swe:latest"
OFFLINE_REPOS = "/opt/nextstate/swe"
TESTBED = "/testbed"
REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
            "FAIL_TO_PASS", "PASS_TO_PASS")
HARNESS_FIELDS = ("image", "eval_script", "log_parser", "eval_type")

_checked_images: set[str] = set()
_image_lock = threading.Lock()


class InstanceError(ValueError):
    """An instance (or a set of them) cannot be used; the message says why."""


def load_instances(source: Any = None, ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Instances from ``source`` (only those of ``ids``, chosen before anything is derived, when given).

    ``None`` or ``"builtin"``: the offline set; a ``.jsonl``, ``.json`` or
    ``.parquet`` file; a list of instance dicts; otherwise a Hugging Face
    dataset name, optionally ``NAME:SPLIT`` (default split ``test``), loaded
    with swebench's loader.
    """
    if source is None or source == "builtin":
        rows = read_rows(BUILTIN)
    elif isinstance(source, (list, tuple)):
        rows = [dict(r) for r in source]
    else:
        path = Path(source)
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            rows = list(data.values()) if isinstance(data, dict) else data
        elif path.suffix in (".jsonl", ".parquet"):
            rows = read_rows(path)
        elif path.is_file():
            raise InstanceError(f"{path}: instance files must be .jsonl, .json or .parquet")
        else:
            rows = _load_dataset(str(source))
    if ids:
        unknown = sorted(set(ids) - {row.get("instance_id") for row in rows})
        if unknown:
            raise InstanceError(f"unknown instance ids in {source}: {', '.join(unknown)}")
        rows = [row for row in rows if row.get("instance_id") in set(ids)]
    for row in rows:
        check_row(row)
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise InstanceError(f"instance {row.get('instance_id', '?')} lacks {', '.join(missing)}")
    return [complete_row(row) for row in rows]


def _load_dataset(name: str) -> list[dict[str, Any]]:
    from swebench.harness.utils import load_swebench_dataset

    name, _, split = name.partition(":")
    try:
        return [dict(r) for r in load_swebench_dataset(name, split or "test")]
    except Exception as e:  # the hub unreachable, an unknown name, a broken file
        raise InstanceError(
            f"cannot load the SWE-bench dataset {name!r} (split {split or 'test'}): "
            f"{type(e).__name__}: {str(e)[:300]}. Without network access, pass a .jsonl, .json "
            "or .parquet file of instances, or 'builtin' for the offline set.") from None


def listed_tests(instance: dict[str, Any], key: str) -> list[str]:
    """``FAIL_TO_PASS`` or ``PASS_TO_PASS`` as a list, however the row stores it."""
    value = instance[key]
    return json.loads(value) if isinstance(value, str) else list(value)


def harness_image(instance: dict[str, Any]) -> str:
    """The image the instance runs in; raises :class:`InstanceError` when the row cannot be graded."""
    missing = [k for k in HARNESS_FIELDS if not instance.get(k)]
    if missing:
        raise InstanceError(
            f"instance {instance['instance_id']} has no {', '.join(missing)}: load it with "
            "load_instances, which derives them from the row")
    return instance["image"]


def make_test_spec(instance: dict[str, Any]) -> Any:
    """swebench's ``TestSpec`` for the instance (image, eval script, log parser, F2P/P2P)."""
    harness_image(instance)
    from swebench.harness.utils import make_test_spec as swebench_test_spec

    return swebench_test_spec(instance)


def is_offline(instance: dict[str, Any]) -> bool:
    """Whether the instance's repository comes from the ``nextstate/swe`` image."""
    return instance.get("image") == OFFLINE_IMAGE


def sandbox_user(instance: dict[str, Any]) -> str:
    """The user that owns ``/testbed``: ``agent`` in our image, root in SWE-bench's."""
    if is_offline(instance):
        return "agent"
    from swebench.image_builder.constants import CONTAINER_USER

    return CONTAINER_USER


#: The message of the commit SWE-bench's image setup makes on top of ``base_commit`` (its ``pre_install``
#: edits of tracked files, e.g. sphinx's ``tox.ini`` ``pytest -rA``): an image at that commit is at its base.
SETUP_COMMIT_MESSAGE = "SWE-bench"


def checkout_command(instance: dict[str, Any]) -> str:
    """Shell that puts the repository at ``base_commit`` in ``/testbed`` (a SWE-bench image's setup commit
    on top of it counts as there, as swebench's harness leaves it) and changes into it."""
    base = shlex.quote(instance["base_commit"])
    clone = ""
    at_base = f"[ \"$(git rev-parse HEAD)\" = {base} ]"
    if not is_offline(instance):
        at_base = (f"{{ {at_base} || {{ [ \"$(git log -1 --format=%s HEAD)\" = {SETUP_COMMIT_MESSAGE} ] && "
                   f"[ \"$(git rev-parse -q --verify HEAD^)\" = {base} ]; }}; }}")
    if is_offline(instance):
        source = f"{OFFLINE_REPOS}/{instance['repo'].replace('/', '__')}.git"
        # --no-hardlinks: the sandbox's writable layer may sit on its own disk (the disk limit),
        # where overlayfs can't keep a copied-up file's inode, and git rejects the hardlinks
        clone = f"{{ test -d {TESTBED}/.git || git clone -q --no-hardlinks {shlex.quote(source)} {TESTBED}; }} && "
    return f"{clone}cd {TESTBED} && {{ {at_base} || git -c advice.detachedHead=false checkout -q {base}; }}"


def ensure_image(image: str, instance_id: str = "INSTANCE_ID") -> None:
    """Make sure ``image`` is on the Docker engine: build ours, pull others, else a clear error."""
    with _image_lock:
        if image in _checked_images:
            return
        import docker

        from nextstate import containers

        client = containers.connect()
        try:
            if image == OFFLINE_IMAGE:
                containers.ensure_image("swe", client=client)
            else:
                try:
                    client.images.get(image)
                except docker.errors.ImageNotFound:
                    try:
                        client.images.pull(image)
                    except docker.errors.DockerException as e:
                        raise InstanceError(
                            f"image {image} is not on this Docker engine and pulling it failed; build it "
                            f"with `python -m containers build-swe --tasks ROWS --ids {instance_id}` "
                            "(--repo-source DIR without GitHub access). Docker said: "
                            f"{' '.join(str(e).split())}") from None
        finally:
            client.close()
        _checked_images.add(image)
