"""The index of a run folder (:class:`RunIndex`), read incrementally as the run appends to it.

The index keeps byte offsets, not records: the list needs only the head of
each ``step`` / ``judge`` line (everything before its large fields), and an
episode's lines are read and parsed when it is opened. Screenshots are PNG
files beside ``rollouts.jsonl`` referenced by relative path, or, in older
runs, inline base64 / data URIs (:mod:`viewer.images`); both are shown.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from nextstate.train.metrics import CURVES
from nextstate.viewer.images import mark_images

ROLLOUTS, ADVANTAGES, METRICS = "rollouts.jsonl", "advantages.jsonl", "metrics.jsonl"
WORKER_ROLLOUTS = "rollouts.*.jsonl"            # one per agent-loop worker process of a veRL run
RESULTS, REPORT, CONFIG = "results.jsonl", "report.json", "config.json"
# a line's head ends where its first large field starts (json.dumps keeps key order)
_CUT = {b"step": b', "messages": ', b"judge": b', "votes": '}
_KIND = re.compile(rb'\{"kind": "(\w+)"(?:, "time": ([-+0-9.eE]+))?')   # match(data, pos): anchored at pos
_TRAIN_STEP = re.compile(r"@s(\d+)$")          # group ids of `python -m train` end in @s<step>
_DECODER = json.JSONDecoder()


Spot = tuple[str, int, int]        # a line of a rollout log: (file name, offset, length)


def rollout_logs(run: Path) -> list[str]:
    """The rollout logs of a run folder: ``rollouts.jsonl`` and the veRL workers' files."""
    names = [ROLLOUTS] if (run / ROLLOUTS).exists() else []
    return names + sorted(p.name for p in run.glob(WORKER_ROLLOUTS))


@dataclass
class Episode:
    """One episode of the index: where its lines are, and what the list shows."""

    id: int
    group_id: str
    task_id: str
    sample: int
    train_step: int | None = None
    status: str = "running"
    outcome: float | None = None
    error: str | None = None
    category: str | None = None
    success: bool | None = None
    heldout: bool = False             # a held-out evaluation episode (not trained on)
    reason: str | None = None         # the grader's reason, when it gave one
    grade: Any = None                 # the grader's details (results.jsonl); else read from `trajectory`
    trajectory: Spot | None = None   # where its trajectory line is
    roles: set[str] = field(default_factory=set)
    steps: dict[int, Spot] = field(default_factory=dict)   # step -> (file, offset, length)
    judges: dict[int, Spot] = field(default_factory=dict)
    length: int = 0

    def summary(self, adv: dict[tuple, dict]) -> dict[str, Any]:
        rewards = [adv[k]["reward"] for i in range(self.length)
                   if (k := (self.group_id, self.sample, i)) in adv]
        ok = self.success if self.success is not None else (
            None if self.outcome is None else self.outcome > 0)
        return {"id": self.id, "group_id": self.group_id, "task_id": self.task_id, "sample": self.sample,
                "train_step": self.train_step, "heldout": self.heldout, "status": self.status,
                "outcome": self.outcome, "success": ok, "error": self.error, "reason": self.reason,
                "category": self.category,
                "steps": self.length, "roles": sorted(self.roles), "has_steps": bool(self.steps),
                "mean_reward": sum(rewards) / len(rewards) if rewards else None}


def _head(data: bytes, begin: int, end: int, kind: bytes | None) -> Any:
    """The small fields of the record ``data[begin:end]``, without parsing (or copying) its
    large ones when the layout allows."""
    cut = _CUT.get(kind) if kind else None
    i = data.find(cut, begin, end) if cut else -1
    if i > 0:
        try:
            return _loads(data[begin:i] + b"}")
        except ValueError:
            pass
    return _loads(data[begin:end])


def _loads(line: bytes) -> Any:
    return _DECODER.decode(line.decode())




class RunIndex:
    """What a run folder holds, read incrementally: call :meth:`refresh` to pick up new lines."""

    def __init__(self, run: str | Path):
        self.run = Path(run)
        if not self.run.is_dir():
            raise FileNotFoundError(f"{self.run} is not a directory")
        self._lock = threading.RLock()
        self._reset()

    def _reset(self) -> None:
        self.episodes: list[Episode] = []
        self._by_key: dict[tuple[str, int], Episode] = {}
        self.advantages: dict[tuple[str, int, int], dict] = {}
        self.bad_lines = 0
        self._offsets: dict[str, int] = {ADVANTAGES: 0}   # bytes read of each log
        self._small: dict[str, tuple[float, int]] = {}
        self.metrics: list[dict] = []
        self.config: Any = None
        self.report: Any = None
        self.results: list[dict] = []
        self.rubric: list[dict] = []    # the training proxy's rubric versions (--rubric), oldest first
        self.version = ""
        self._from_results = False      # episodes made from results.jsonl (no rollouts.jsonl)

    # -- reading -------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read what was appended since the last call; returns whether anything changed."""
        with self._lock:
            if any((self.run / n).exists() and (self.run / n).stat().st_size < off
                   for n, off in self._offsets.items()):
                self._reset()            # a file was rewritten: start over
            stamp = []
            logs = rollout_logs(self.run)
            for name in (*logs, ADVANTAGES, METRICS, RESULTS, REPORT, CONFIG):
                p = self.run / name
                st = p.stat() if p.exists() else None
                stamp.append(f"{st.st_size}:{st.st_mtime_ns}" if st else "-")
            version = "|".join(stamp)
            if version == self.version:
                return False
            self._read_small()
            for data, begin, end, base in self._new_lines(ADVANTAGES):
                self._line(self._advantage_line, data, begin, end, base)
            self._read_rollouts(logs)
            self._join_results()
            self.version = version
            return True

    def _new_lines(self, name: str) -> list[tuple[bytes, int, int, int]]:
        """``(data, begin, end, base)`` for each complete new line ``data[begin:end]`` (at file
        offset ``base + begin``) of ``name``; lines are not copied out whole."""
        path = self.run / name
        if not path.exists():
            return []
        start = self._offsets.setdefault(name, 0)
        with path.open("rb") as f:
            f.seek(start)
            data = f.read()
        end = data.rfind(b"\n") + 1          # a half-written last line waits for the next refresh
        lines, pos = [], 0
        while pos < end:
            nl = data.find(b"\n", pos)
            if nl > pos:
                lines.append((data, pos, nl, start))
            pos = nl + 1
        self._offsets[name] = start + end
        return lines

    def _line(self, handle: Callable[..., None], *args: Any) -> None:
        try:
            handle(*args)
        except (ValueError, KeyError, TypeError):
            self.bad_lines += 1

    def _read_rollouts(self, logs: list[str]) -> None:
        """The new lines of every rollout log, in the order they were recorded (each line's
        ``time``; a line without one keeps its place after the line before it)."""
        lines = []
        for name in logs:
            when = -math.inf
            for data, begin, end, base in self._new_lines(name):
                m = _KIND.match(data, begin, end)
                if m and m.group(2):
                    with contextlib.suppress(ValueError):
                        when = float(m.group(2))
                lines.append((when, name, data, begin, end, base))
        lines.sort(key=lambda line: line[0])      # stable: one log's lines keep their order
        for _, name, data, begin, end, base in lines:
            self._line(self._rollout_line, name, data, begin, end, base)

    def _advantage_line(self, data: bytes, begin: int, end: int, base: int) -> None:
        row = _loads(data[begin:end])
        self.advantages[(row["group_id"], int(row["sample"]), int(row["step"]))] = row
        ep = self._by_key.get((row["group_id"], int(row["sample"])))
        if ep is not None and row.get("train_step") is not None:
            ep.train_step = int(row["train_step"])

    def _rollout_line(self, name: str, data: bytes, begin: int, end: int, base: int) -> None:
        m = _KIND.match(data, begin, end)
        rec = _head(data, begin, end, m.group(1) if m else None)
        spot = (name, base + begin, end - begin)
        if not isinstance(rec, dict) or "group_id" not in rec:
            return
        if rec.get("kind") == "rubric":
            self.rubric.append({k: rec.get(k) for k in ("version", "text", "preferences", "by", "cause", "error")})
            return
        key = (rec["group_id"], int(rec.get("sample", 0)))
        ep = self._by_key.get(key)
        kind = rec.get("kind")
        if (kind == "step" and (ep is None or (rec.get("step") == 0 and ep.status != "running"))
                or kind == "trajectory" and ep is None):
            ep = self._new_episode(rec)   # first step, a resumed run playing it again, or aborted at once
        if ep is None:
            return
        if kind == "step":
            i = int(rec["step"])
            ep.steps[i] = spot
            ep.length = max(ep.length, i + 1)
            if rec.get("role"):
                ep.roles.add(rec["role"])
        elif kind == "judge":
            ep.judges[int(rec["step"])] = spot
        elif kind == "trajectory":
            ep.status, ep.outcome, ep.error = rec.get("status", "finished"), rec.get("outcome"), rec.get("error")
            ep.length = max(ep.length, int(rec.get("steps") or 0))
            ep.trajectory = spot
            ep.reason = _reason(rec.get("grade"))

    def _new_episode(self, rec: dict) -> Episode:
        m = _TRAIN_STEP.search(rec["group_id"])
        step = rec.get("train_step", int(m.group(1)) if m else None)
        ep = Episode(len(self.episodes), rec["group_id"], str(rec.get("task_id", rec["group_id"])),
                     int(rec.get("sample", 0)), train_step=step, heldout=bool(rec.get("heldout")))
        old = self._by_key.get((ep.group_id, ep.sample))
        if old is not None:
            old.status = "superseded"
        self._by_key[(ep.group_id, ep.sample)] = ep
        self.episodes.append(ep)
        return ep

    def _changed(self, name: str) -> Path | None:
        p = self.run / name
        if not p.exists():
            return None
        st = p.stat()
        if self._small.get(name) == (st.st_mtime, st.st_size):
            return None
        self._small[name] = (st.st_mtime, st.st_size)
        return p

    def _read_small(self) -> None:
        """metrics.jsonl, results.jsonl, report.json, config.json: small, read whole when changed."""
        def jsonl(p: Path) -> list[dict]:
            rows = []
            for line in p.read_text(errors="replace").splitlines():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass  # a line being written
            return rows

        def obj(p: Path) -> Any:
            try:
                return json.loads(p.read_text())
            except ValueError:
                return None

        if p := self._changed(METRICS):
            self.metrics = jsonl(p)
        if p := self._changed(RESULTS):
            self.results = jsonl(p)
        if p := self._changed(REPORT):
            self.report = obj(p)
        if p := self._changed(CONFIG):
            self.config = obj(p)
        if self.config is None:
            self.config = self._checkpoint_config()

    def _checkpoint_config(self) -> Any:
        metas = sorted((self.run / "checkpoints").glob("step_*/meta.json"))
        if metas:
            try:
                return json.loads(metas[-1].read_text()).get("config")
            except ValueError:
                return None
        return None

    def _join_results(self) -> None:
        """Evaluation runs: results.jsonl gives category and success; without rollouts, the episodes."""
        if not self.results:
            return
        if not self.episodes:
            for r in self.results:
                ep = self._new_episode({"group_id": r["task_id"], "task_id": r["task_id"]})
                ep.status, ep.length = r.get("status", "finished"), int(r.get("steps") or 0)
            self._from_results = True
        by_task = {r["task_id"]: r for r in self.results}
        for ep in self.episodes:
            r = by_task.get(ep.task_id)
            if r is None:
                continue
            ep.category, ep.success = r.get("category"), r.get("success")
            if ep.trajectory is None:
                ep.grade, ep.reason = r.get("outcome"), _reason(r.get("outcome")) or ep.reason
            if ep.outcome is None:
                ep.outcome = r.get("reward")
            if self._from_results:
                ep.status, ep.error = r.get("status", ep.status), r.get("reason")

    # -- what the page asks for -----------------------------------------------------------
    def overview(self) -> dict[str, Any]:
        """The run: config, report, metrics rows and one summary per episode."""
        with self._lock:
            kind = "train" if (self.run / METRICS).exists() or self.advantages else (
                "evaluate" if self.results or self.report else "rollouts")
            return {"run": str(self.run), "name": self.run.resolve().name, "kind": kind,
                    "version": self.version, "curves": CURVES, "config": self.config, "report": self.report,
                    "metrics": self.metrics, "bad_lines": self.bad_lines, "rubric": self.rubric,
                    "episodes": [e.summary(self.advantages) for e in self.episodes
                                 if e.status != "superseded"]}

    def episode(self, eid: int, link: Callable[[str], str] = lambda p: "files/" + p) -> dict[str, Any]:
        """One episode in full: its steps with judge results, R_t, advantages and screenshots."""
        with self._lock:
            ep = self.episodes[eid]
            where = dict(ep.steps), dict(ep.judges)
            head = ep.summary(self.advantages)
            grade, end = ep.grade, ep.trajectory
        lines = self._read_at([*where[0].values(), *where[1].values(), *([end] if end else [])])
        if end is not None:
            grade = lines.get(end, {}).get("grade")
        steps, prev_after = [], []
        for i in range(max(head["steps"], max(where[0], default=-1) + 1)):
            rec = lines.get(where[0].get(i), {})
            judge = lines.get(where[1].get(i))
            msg_images: list[str] = []
            messages = mark_images(rec.get("messages"), self.run, link, msg_images)
            after: list[str] = []
            rest = mark_images({k: v for k, v in rec.items() if k not in ("messages", "kind")},
                               self.run, link, after)
            adv = self.advantages.get((ep.group_id, ep.sample, i))
            steps.append({
                "index": i, "recorded": bool(rec), "time": rec.get("time"), "role": rec.get("role"),
                "messages": messages,
                "text": rest.get("text"), "action": rest.get("action"), "next_state": rest.get("next_state"),
                "env_reward": rest.get("reward"),
                "extra": {k: v for k, v in rest.items() if k not in _SHOWN},
                "judge": {k: v for k, v in judge.items() if k not in _WHERE} if judge else None,
                "R_t": adv["reward"] if adv else None, "advantage": adv["advantage"] if adv else None,
                "kept": adv["kept"] if adv else None,
                "before": msg_images[-1:] or prev_after, "after": after, "_seen": msg_images[-1:],
            })
            prev_after = after or prev_after
        for s, nxt in zip(steps, steps[1:] + [None]):   # no screenshot recorded after a step: the
            seen = s.pop("_seen")                       # next step's prompt shows the state it left
            if not s["after"] and nxt is not None and nxt["_seen"] != seen:
                s["after"] = nxt["_seen"]
        return {**head, "grade": mark_images(grade, self.run, link), "steps_detail": steps}

    def _read_at(self, spots: list[Spot]) -> dict[Spot, dict]:
        out: dict[Spot, dict] = {}
        for name in sorted({spot[0] for spot in spots}):
            path = self.run / name
            if not path.exists():
                continue
            with path.open("rb") as f:
                for spot in sorted(s for s in spots if s[0] == name):
                    f.seek(spot[1])
                    try:
                        out[spot] = json.loads(f.read(spot[2]))
                    except ValueError:
                        pass
        return out

    def file(self, rel: str) -> Path | None:
        """A file under the run folder (images), or None for anything outside it."""
        path = (self.run / rel).resolve()
        return path if path.is_relative_to(self.run.resolve()) and path.is_file() else None


def _reason(grade: Any) -> str | None:
    """The grader's one-line reason, when its details give one."""
    reason = grade.get("reason") if isinstance(grade, dict) else None
    return str(reason) if reason else None


_WHERE = {"kind", "time", "group_id", "task_id", "sample", "step", "heldout", "train_step"}
_SHOWN = _WHERE | {"role", "text", "action", "next_state", "reward"}
