#!/bin/bash
set -euo pipefail
mkdir -p /app/api
cat > /app/api/server.py <<'PY'
"""In-memory JSON item API on 127.0.0.1:8080."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ITEMS: dict[int, dict] = {}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def send_json(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts == ["health"]:
            return self.send_json(200, {"status": "ok"})
        if parts == ["items"]:
            with LOCK:
                return self.send_json(200, [ITEMS[k] for k in sorted(ITEMS)])
        if len(parts) == 2 and parts[0] == "items" and parts[1].isdigit():
            with LOCK:
                item = ITEMS.get(int(parts[1]))
            if item is not None:
                return self.send_json(200, item)
        self.send_json(404, {"error": "not found"})

    def do_POST(self) -> None:
        if self.path.split("?")[0].strip("/") != "items":
            return self.send_json(404, {"error": "not found"})
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            return self.send_json(400, {"error": "body is not valid JSON"})
        if not isinstance(body, dict):
            return self.send_json(400, {"error": "body must be a JSON object"})
        name, price = body.get("name"), body.get("price")
        if not isinstance(name, str) or not name:
            return self.send_json(400, {"error": "name must be a non-empty string"})
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
            return self.send_json(400, {"error": "price must be a number >= 0"})
        with LOCK:
            item = {"id": max(ITEMS, default=0) + 1, "name": name, "price": price}
            ITEMS[item["id"]] = item
        self.send_json(201, item)

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", 8080), Handler).serve_forever()
PY
cd /app/api
nohup python3 /app/api/server.py > /dev/null 2>&1 &
echo $! > /app/api/server.pid
sleep 1
