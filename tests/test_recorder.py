"""The JSONL recorder never loses a line and never blocks its callers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from nextstate.agents.recorder import Recorder


def test_ten_thousand_records_all_written(tmp_path):
    path = tmp_path / "log.jsonl"
    rec = Recorder(path)
    start = time.monotonic()
    for i in range(10_000):
        rec.record("step", {"i": i, "text": "x" * 50})
    queued_in = time.monotonic() - start
    rec.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 10_000
    assert [json.loads(line)["i"] for line in lines] == list(range(10_000))
    assert queued_in < 5.0  # queueing is cheap: no file I/O on the caller's thread


def test_many_threads_and_odd_payloads(tmp_path):
    path = tmp_path / "log.jsonl"
    with Recorder(path) as rec:
        def burst(t: int) -> None:
            for i in range(1000):
                rec.record("judge", {"t": t, "i": i, "raw": b"\x89PNG", "obj": {1, 2}})
        threads = [threading.Thread(target=burst, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 8000
    assert {(r["t"], r["i"]) for r in rows} == {(t, i) for t in range(8) for i in range(1000)}
    assert rows[0]["kind"] == "judge" and rows[0]["raw"] == "<4 bytes>"


def test_closed_recorder_refuses_and_close_is_idempotent(tmp_path):
    rec = Recorder(tmp_path / "log.jsonl")
    rec.record("a", {})
    rec.close()
    rec.close()
    with pytest.raises(RuntimeError, match="closed"):
        rec.record("b", {})
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 1


def test_flushed_at_interpreter_exit(tmp_path):
    path = tmp_path / "log.jsonl"
    code = ("import sys\nfrom agents.recorder import Recorder\n"
            "rec = Recorder(sys.argv[1])\n"
            "for i in range(5000):\n    rec.record('step', {'i': i})\n")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=120)
    assert len(path.read_text().splitlines()) == 5000


def test_lines_appear_while_running(tmp_path):
    path = tmp_path / "log.jsonl"
    rec = Recorder(path, flush_every=0.05)
    rec.record("step", {"i": 0})
    deadline = time.monotonic() + 5
    while not path.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert json.loads(path.read_text())["i"] == 0
    rec.close()


def test_images_become_png_files_beside_the_log(tmp_path):
    import base64
    import io

    from PIL import Image

    from nextstate.envs.base import Observation
    buf = io.BytesIO()
    Image.new("RGB", (8, 4), "red").save(buf, "PNG")
    png = buf.getvalue()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    with Recorder(tmp_path / "rollouts.jsonl") as rec:
        rec.record("step", {"observation": Observation("screen", [png]),
                            "messages": [{"role": "tool", "content": [{"type": "image_url",
                                                                       "image_url": {"url": url}}]}],
                            "next_state": {"screenshot_after": png, "blob": b"\x00\x01"}})
    text = (tmp_path / "rollouts.jsonl").read_text()
    assert "base64" not in text
    row = json.loads(text)
    ref = row["observation"]["images"][0]
    assert ref.startswith("images/") and (tmp_path / ref).read_bytes() == png
    assert row["messages"][0]["content"][0]["image_url"]["url"] == ref  # one file per distinct image
    assert row["next_state"]["screenshot_after"] == ref and row["next_state"]["blob"] == "<2 bytes>"
    assert row["observation"]["text"] == "screen" and len(list((tmp_path / "images").iterdir())) == 1
