"""A run's episodes as ATIF trajectories (Harbor's Agent Trajectory Interchange Format).

:func:`export_atif` writes one JSON file per episode of a run folder (``python -m viewer RUN
--export-atif [--out DIR]``), shaped as Harbor's own models (``harbor.models.trajectories``)
require:

* the episode's first prompt as a ``system`` step and a ``user`` step, then one ``agent`` step per
  recorded step: the model's text as ``message``, the parsed action as one ``tool_calls`` entry,
  the next state as ``observation.results[0]``, linked to the call by ``source_call_id`` (an
  action that did not parse has no call, and its observation is the error, unlinked);
* per step ``metrics.extra``: the judge's votes, score and mean, ``R_t``, the advantage it trained
  with; ``extra``: the role, the next state's fields, the env's reward, the judge's hint;
* ``final_metrics``: ``total_steps`` and, in ``extra``, the outcome, how the episode ended and the
  grader's details.

Screenshots are copied beside the files (``images/``) and referenced by relative path. What ATIF
cannot hold, or the run did not record, is listed in ``docs/standards.md``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from nextstate.viewer.index import RunIndex

#: The ATIF version written: the oldest that has every field used here (``trajectory_id``,
#: ``extra`` on tool calls and observation results: v1.7); Harbor 0.25 and 0.26 read v1.0-v1.8.
SCHEMA_VERSION = "ATIF-v1.7"
_MIME = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
_DATA_URI = re.compile(r"data:(image/[\w.+-]+);base64,(.*)", re.S)


def export_atif(run: str | Path, out: str | Path | None = None) -> tuple[list[Path], list[str]]:
    """Write every episode of ``run`` with recorded steps as ``OUT/<group>-<sample>.json``
    (default ``OUT``: ``RUN/atif``); returns the files and the ids of the episodes left out
    (none of their steps was recorded)."""
    index = RunIndex(run)
    index.refresh()
    dest = Path(out) if out is not None else index.run / "atif"
    dest.mkdir(parents=True, exist_ok=True)
    overview = index.overview()
    agent = _agent(overview)
    written, skipped = [], []
    for summary in overview["episodes"]:
        episode = index.episode(summary["id"], link=lambda p: p)
        name = re.sub(r"[^\w.@-]+", "_", f"{episode['group_id']}-{episode['sample']}")
        trajectory = to_atif(episode, agent, index.run, dest)
        if trajectory is None:
            skipped.append(f"{episode['group_id']}/{episode['sample']}")
            continue
        path = dest / f"{name}.json"
        path.write_text(json.dumps(trajectory, indent=1, ensure_ascii=False))
        written.append(path)
    return written, skipped


def to_atif(episode: dict[str, Any], agent: dict[str, Any], run: Path, dest: Path) -> dict[str, Any] | None:
    """One episode of :meth:`RunIndex.episode` as an ATIF trajectory (a dict), or None when no
    step of it was recorded. Images are copied to ``dest/images``."""
    recorded = [s for s in episode["steps_detail"] if s["recorded"]]
    if not recorded:
        return None
    steps = [*_prompt_steps(recorded[0]["messages"] or [], run, dest)]
    for s in recorded:
        steps.append(_agent_step(s, len(steps) + 1, run, dest))
    ident = f"{episode['group_id']}/{episode['sample']}"
    return {
        "schema_version": SCHEMA_VERSION, "session_id": ident, "trajectory_id": ident, "agent": agent,
        "steps": steps,
        "notes": "Exported by nextstate (python -m viewer --export-atif) from rollouts.jsonl.",
        "final_metrics": {"total_steps": len(steps), "extra": _drop_none({
            "task_id": episode["task_id"], "group_id": episode["group_id"], "sample": episode["sample"],
            "outcome": episode["outcome"], "success": episode["success"], "status": episode["status"],
            "error": episode["error"], "reason": episode["reason"], "category": episode["category"],
            "train_step": episode["train_step"], "heldout": episode["heldout"],
            "agent_steps": len(recorded), "grade": _plain_images(episode.get("grade"))})},
    }


def _agent(overview: dict[str, Any]) -> dict[str, Any]:
    """ATIF's ``agent``: nextstate, and the run's model (or the evaluated policy)."""
    config, report = overview.get("config") or {}, overview.get("report") or {}
    model = (config.get("model") or {}).get("name") if isinstance(config.get("model"), dict) else None
    family = (config.get("env") or {}).get("family") if isinstance(config.get("env"), dict) else None
    family = family or report.get("env")
    agent: dict[str, Any] = {"name": "nextstate", "version": _version(),
                             "model_name": model or report.get("policy")}
    agent["extra"] = _drop_none({"family": family, "run": overview.get("name")})
    return _drop_none(agent)


def _version() -> str:
    try:
        return metadata.version("nextstate")
    except metadata.PackageNotFoundError:
        return "unknown"


def _prompt_steps(messages: list[dict[str, Any]], run: Path, dest: Path) -> list[dict[str, Any]]:
    """The system and user turns before the first answer, as ``system`` / ``user`` steps."""
    steps = []
    for m in messages:
        if m.get("role") == "assistant":
            break
        source = "system" if m.get("role") == "system" else "user"
        steps.append({"step_id": len(steps) + 1, "source": source,
                      "message": _content(m.get("content"), run, dest)})
    return steps or [{"step_id": 1, "source": "user", "message": ""}]


def _agent_step(s: dict[str, Any], step_id: int, run: Path, dest: Path) -> dict[str, Any]:
    step: dict[str, Any] = {"step_id": step_id, "source": "agent", "message": s["text"] or ""}
    if s.get("time") is not None:
        step["timestamp"] = datetime.fromtimestamp(float(s["time"]), timezone.utc).isoformat()
    obs = (s.get("extra") or {}).get("observation")
    content = _observation(obs, s.get("next_state"), run, dest)
    action = s.get("action")
    result: dict[str, Any] = {"content": content}
    if isinstance(action, dict) and action.get("name"):
        call_id = f"call_{s['index']}"
        step["tool_calls"] = [{"tool_call_id": call_id, "function_name": str(action["name"]),
                               "arguments": dict(action.get("arguments") or {})}]
        result["source_call_id"] = call_id
    step["observation"] = {"results": [result]}
    judge = s.get("judge") or {}
    metrics = _drop_none({"judge_votes": judge.get("votes"), "judge_score": judge.get("score"),
                          "judge_mean": judge.get("mean"), "R_t": s.get("R_t"),
                          "advantage": s.get("advantage"), "trained": s.get("kept")})
    if metrics:
        step["metrics"] = {"extra": metrics}
    state = {k: v for k, v in (s.get("next_state") or {}).items() if k not in ("output", "action")}
    step["extra"] = _drop_none({"role": s.get("role"), "env_reward": s.get("env_reward"),
                                "next_state": _plain_images(state) or None,
                                "judge_hint": judge.get("hint"), "judge_error": judge.get("error")})
    return step


def _observation(obs: Any, state: dict[str, Any] | None, run: Path, dest: Path) -> str | list[dict[str, Any]]:
    """What the agent was shown after its action: the observation's text (else the next state's
    output) and its images, as ATIF content."""
    text = obs.get("text") if isinstance(obs, dict) else obs if isinstance(obs, str) else None
    if text is None:
        text = str((state or {}).get("output") or "")
    images = [*(obs.get("images") or []), *([obs["image"]] if obs.get("image") else [])] \
        if isinstance(obs, dict) else []
    return _content([{"type": "text", "text": text}, *({"type": "image", "image": im} for im in images)]
                    if images else text, run, dest)


def _content(content: Any, run: Path, dest: Path) -> str | list[dict[str, Any]]:
    """A chat message's content (a string, or parts with text and images) as ATIF content."""
    if not isinstance(content, list):
        return "" if content is None else str(content)
    parts = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            parts.append({"type": "text", "text": str(part.get("text") or "")})
            continue
        ref = part.get("image") or (part.get("image_url") or {}).get("url")
        source = _image(ref, run, dest)
        if source is not None:
            parts.append({"type": "image", "source": source})
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _image(ref: Any, run: Path, dest: Path) -> dict[str, str] | None:
    """An image reference of the run (``{"__image__": path or data URI}``, a path under the run,
    a data URI) copied to ``dest/images``; ATIF's ``ImageSource`` with the relative path."""
    if isinstance(ref, dict):
        ref = ref.get("__image__")
    if not isinstance(ref, str):
        return None
    found = _DATA_URI.match(ref)
    if found:
        mime, data = found.group(1), base64.b64decode(found.group(2))
        ext = next((e for e, m in _MIME.items() if m == mime), "png")
    else:
        path = (run / ref).resolve()
        ext = path.suffix.lstrip(".").lower()
        if ext not in _MIME or not path.is_file() or not path.is_relative_to(run.resolve()):
            return None
        mime, data = _MIME[ext], path.read_bytes()
    if mime not in _MIME.values():
        return None
    name = f"images/{hashlib.sha256(data).hexdigest()[:32]}.{ext}"
    target = dest / name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return {"media_type": mime, "path": name}


def _plain_images(obj: Any) -> Any:
    """``obj`` with the viewer's image markers back as the references they were."""
    if isinstance(obj, dict):
        if set(obj) == {"__image__"}:
            return obj["__image__"]
        return {k: _plain_images(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain_images(v) for v in obj]
    return obj


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
