"""Exercises the item API that must be running on 127.0.0.1:8080."""
import json
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

BASE = "http://127.0.0.1:8080"


def call(method: str, path: str, body: bytes | None = None) -> tuple[int, dict | list, str]:
    request = urllib.request.Request(BASE + path, data=body, method=method,
                                     headers={"Content-Type": "application/json"} if body is not None else {})
    for attempt in range(3):
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                return resp.status, json.loads(resp.read()), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read()), err.headers.get("Content-Type", "")
        except urllib.error.URLError:
            if attempt == 2:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def post_item(name: str, price) -> tuple[int, dict]:
    status, body, _ = call("POST", "/items", json.dumps({"name": name, "price": price}).encode())
    return status, body


def test_health_and_pid_file():
    status, body, ctype = call("GET", "/health")
    assert (status, body) == (200, {"status": "ok"})
    assert ctype.startswith("application/json")
    pid = int(Path("/app/api/server.pid").read_text().strip())
    assert Path(f"/proc/{pid}").exists()


def test_create_and_fetch_item():
    name = f"widget-{uuid.uuid4().hex[:8]}"
    status, item = post_item(name, 9.5)
    assert status == 201
    assert item["name"] == name and item["price"] == 9.5 and isinstance(item["id"], int)
    status, fetched, ctype = call("GET", f"/items/{item['id']}")
    assert (status, fetched) == (200, item)
    assert ctype.startswith("application/json")
    status, listing, _ = call("GET", "/items")
    assert status == 200 and item in listing
    assert [i["id"] for i in listing] == sorted(i["id"] for i in listing)


def test_ids_increase_by_one():
    _, first = post_item("first", 1)
    _, second = post_item("second", 0)
    assert second["id"] == first["id"] + 1
    status, listing, _ = call("GET", "/items")
    assert [i["id"] for i in listing] == list(range(1, len(listing) + 1))


def test_invalid_bodies_rejected():
    _, before, _ = call("GET", "/items")
    for body in (b"not json", b"[1, 2]", json.dumps({"price": 3}).encode(),
                 json.dumps({"name": "x", "price": "3"}).encode(), json.dumps({"name": "", "price": 3}).encode(),
                 json.dumps({"name": "x", "price": True}).encode(), json.dumps({"name": "x", "price": -1}).encode()):
        status, error, ctype = call("POST", "/items", body)
        assert status == 400, body
        assert "error" in error and ctype.startswith("application/json")
    _, after, _ = call("GET", "/items")
    assert after == before


def test_not_found():
    for path in ("/items/999999", "/items/abc", "/nope"):
        status, body, _ = call("GET", path)
        assert (status, body) == (404, {"error": "not found"}), path
