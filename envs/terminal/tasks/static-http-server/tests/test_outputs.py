"""Fetches the site from the server that must be running on port 8000."""
import json
import time
import urllib.request

BASE = "http://127.0.0.1:8000"


def fetch(path: str) -> tuple[int, bytes]:
    last: Exception | None = None
    for _ in range(6):
        try:
            with urllib.request.urlopen(BASE + path, timeout=3) as resp:
                return resp.status, resp.read()
        except OSError as exc:  # connection refused while a server is still starting
            last = exc
            time.sleep(0.3)
    raise AssertionError(f"no answer from {BASE}{path}: {last}")


def test_index_page():
    status, body = fetch("/")
    assert status == 200
    assert b"nextstate is up" in body


def test_status_json():
    status, body = fetch("/api/status.json")
    assert status == 200
    assert json.loads(body) == {"status": "ok", "version": 3}


def test_serves_site_directory():
    status, body = fetch("/index.html")
    assert status == 200 and b"nextstate is up" in body
