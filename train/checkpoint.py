"""Atomic checkpoints: ``<output>/checkpoints/step_000010/``.

A checkpoint is written into a hidden temporary directory next to its final
place and renamed into place only when complete, so a run killed mid-save
leaves a ``.tmp-*`` directory that :func:`latest` ignores (and the next save
removes) and resumes from the previous checkpoint. Old checkpoints are renamed
to a ``.tmp-*`` name before they are deleted, and a ``step_*`` folder that has
lost its ``meta.json`` (a deletion interrupted before this) is removed by the
next save. Contents:

* ``model/`` -- weights (safetensors, ``save_pretrained``) and tokenizer;
* ``state.pt`` -- optimizer state and torch RNG states;
* ``meta.json`` -- step, data position, Python/numpy RNG states, the config.

A run of several policies (``agents``) writes ``model/`` and ``state.pt`` once per policy, in
``<name>/`` (``step_000010/reader/model/``...), beside one ``meta.json``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

PREFIX = "step_"
TMP_PREFIX = ".tmp-"


def directory(output: str | Path) -> Path:
    """Where the checkpoints of a run live."""
    return Path(output) / "checkpoints"


def rng_state() -> dict[str, Any]:
    """Python and numpy global RNG states as JSON-able data."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def set_rng_state(state: dict[str, Any]) -> None:
    """Undo :func:`rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def save(output: str | Path, step: int, *, parts: dict[str, tuple[Any, Any, dict[str, Any] | None]],
         meta: dict[str, Any], keep: int = 3) -> Path:
    """Write checkpoint ``step`` atomically; keep the newest ``keep``; returns its path.

    ``parts``: ``{name: (model, tokenizer, optimizer_state)}``, each written in ``<name>/``: one
    part named ``""`` (the checkpoint's own folder) for a run of one policy, one per policy of a
    run with several. ``meta`` goes to ``meta.json`` beside the step and the RNG states."""
    root = directory(output)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(TMP_PREFIX + "*"):   # leftovers of a run killed mid-save
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f"{TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    for name, (m, tok, opt) in parts.items():
        part = tmp / name
        m.save_pretrained(part / "model", safe_serialization=True)
        tok.save_pretrained(part / "model")
        torch.save({"optimizer": opt, "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
                   part / "state.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, "rng": rng_state(), **meta}, indent=1))
    _fsync_tree(tmp)
    if final.exists():   # the same step saved again (a resumed run): swap, then drop the old one
        old = root / f"{TMP_PREFIX}old-{final.name}-{uuid.uuid4().hex[:8]}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    for stale in completed(output)[:-keep] if keep > 0 else []:
        _remove(stale)
    for broken in incomplete(output):   # a deletion cut short: meta.json gone, the weights not
        if broken != final:
            _remove(broken)
    return final


def _remove(path: Path) -> None:
    """Delete a checkpoint so that an interruption cannot strand it: it is first renamed to a
    ``.tmp-`` name (one atomic step; the next save removes those), then deleted."""
    doomed = path.parent / f"{TMP_PREFIX}del-{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        path.rename(doomed)
    except OSError:
        doomed = path
    shutil.rmtree(doomed, ignore_errors=True)


def incomplete(output: str | Path) -> list[Path]:
    """``step_*`` folders without ``meta.json``: what an interrupted deletion left behind."""
    root = directory(output)
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir()
            and not (p / "meta.json").is_file()]


def completed(output: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = directory(output)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest(output: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = completed(output)
    return found[-1] if found else None


def resume_line(step: int | None, total: int, where: str | Path) -> str:
    """What ``--resume`` says at start: the step it resumes from, out of ``total``, and the
    checkpoint ``where`` (``step`` None: none was found under ``where``)."""
    if step is None:
        return f"--resume: no checkpoint under {where}: starting from step 0 of {total}"
    left = f"{total - step} to go" if step < total else "nothing left to train (raise --steps)"
    return f"resuming from step {step} of {total} ({where}): {left}"


def load(path: Path, part: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, state)`` of a checkpoint (``state`` of its policy ``part`` in a run with several);
    also restores the global RNG states."""
    meta = json.loads((path / "meta.json").read_text())
    state = load_state(path / part)
    set_rng_state(meta["rng"])
    torch.set_rng_state(state["torch_rng"])
    if torch.cuda.is_available() and state["cuda_rng"]:
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return meta, state


def load_state(part: Path) -> dict[str, Any]:
    """The optimizer and torch RNG states saved in ``part`` (a checkpoint, or one policy's folder)."""
    return torch.load(part / "state.pt", map_location="cpu", weights_only=True)


def _fsync_tree(root: Path) -> None:
    """Flush every file under ``root`` to disk before the rename publishes it."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
