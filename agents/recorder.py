"""A JSONL log written by a background thread, so logging never slows a rollout.

``record(kind, payload)`` only appends to an unbounded queue (it never blocks
and never drops); the writer thread turns each record into one line
``{"kind": ..., "time": ..., **payload}``. ``close()`` writes everything still
queued and closes the file; it also runs at interpreter exit.

Images never go into the JSONL: PNG bytes and ``data:image/png;base64,...`` URLs
anywhere in a payload (screenshots in observations, in ``next_state``, in the
prompt's ``image_url`` parts) are written once each to ``images/<sha256>.png``
beside the log, and the record holds that relative path instead.
"""

from __future__ import annotations

import atexit
import base64
import dataclasses
import hashlib
import json
import os
import queue
import threading
import time
import weakref
from pathlib import Path
from typing import Any

_STOP = object()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PNG_URL = "data:image/png;base64,"


class Recorder:
    """Fire-and-forget JSONL writer (thread-safe; usable from asyncio code)."""

    def __init__(self, path: str | os.PathLike, flush_every: float = 1.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.images_dir = self.path.parent / "images"
        self._file = self.path.open("a", encoding="utf-8")
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._flush_every = flush_every
        self._closed = False
        self._lock = threading.Lock()
        self.written = 0
        self._thread = threading.Thread(target=self._write_loop, daemon=True, name="recorder")
        self._thread.start()
        atexit.register(_close_ref, weakref.ref(self))

    def record(self, kind: str, payload: dict[str, Any]) -> None:
        """Queue one line; returns at once."""
        item = {"kind": kind, "time": time.time(), **payload}
        with self._lock:  # nothing can slip in behind close()'s end marker
            if self._closed:
                raise RuntimeError(f"recorder {self.path} is closed")
            self._queue.put(item)

    def _write_loop(self) -> None:
        last_flush = time.monotonic()
        while True:
            try:
                item = self._queue.get(timeout=self._flush_every)
            except queue.Empty:
                item = None
            if item is _STOP:
                break
            if item is not None:
                self._file.write(self._line(item) + "\n")
                self.written += 1
            if item is None or time.monotonic() - last_flush >= self._flush_every:
                self._file.flush()
                last_flush = time.monotonic()
        self._file.flush()

    def _line(self, item: dict[str, Any]) -> str:
        """``item`` as one JSON line. Only a record that holds an image (PNG bytes, a PNG data
        URL) is walked to save them (:meth:`_externalize`); the others are written as they are."""
        try:
            line = json.dumps(item, default=_plain, ensure_ascii=False)
            if PNG_URL not in line:
                return line
        except _HasImage:
            pass
        return json.dumps(self._externalize(item), default=_jsonable, ensure_ascii=False)

    def _save_png(self, data: bytes) -> str:
        """Writes ``data`` to ``images/<sha256>.png`` (once); the path relative to the log's folder."""
        name = f"{hashlib.sha256(data).hexdigest()[:32]}.png"
        target = self.images_dir / name
        if not target.exists():
            self.images_dir.mkdir(exist_ok=True)
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(target)
        return f"{self.images_dir.name}/{name}"

    def _externalize(self, obj: Any) -> Any:
        """``obj`` with every PNG (bytes or data URL) replaced by the path of its saved file."""
        if isinstance(obj, dict):
            return {k: self._externalize(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self._externalize(v) for v in obj]
        if isinstance(obj, bytes) and obj.startswith(PNG_MAGIC):
            return self._save_png(obj)
        if isinstance(obj, str) and obj.startswith(PNG_URL):
            try:
                return self._save_png(base64.b64decode(obj[len(PNG_URL):], validate=True))
            except ValueError:
                return obj
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return self._externalize({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
        return obj

    def close(self) -> None:
        """Write out everything queued, then close the file. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()
        self._file.close()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _HasImage(Exception):
    """PNG bytes met while writing a record the quick way (:meth:`Recorder._line`)."""


def _plain(obj: Any) -> Any:
    """What ``json.dumps`` writes for ``obj`` in a record without images: as
    :meth:`Recorder._externalize` then :func:`_jsonable` would (a dataclass as its fields)."""
    if isinstance(obj, bytes) and obj.startswith(PNG_MAGIC):
        raise _HasImage
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return _jsonable(obj)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return f"<{len(obj)} bytes>"
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return str(obj)


def _close_ref(ref: "weakref.ref[Recorder]") -> None:
    rec = ref()
    if rec is not None:
        rec.close()
