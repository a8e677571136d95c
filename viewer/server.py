"""The page's HTTP server and its JSON API (:func:`make_server`), and the page as one file (:func:`export`)."""

from __future__ import annotations

import base64
import json
import math
import mimetypes
import re
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from nextstate.viewer.index import RunIndex

PAGE = Path(__file__).with_name("page.html")


def to_json(obj: Any) -> str:
    """JSON the browser can parse: NaN and infinities (which the recorder may write) become null."""
    try:
        return json.dumps(obj, allow_nan=False, default=str)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False, default=str)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    return obj


def make_server(index: RunIndex, port: int = 8765, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """An HTTP server for the page and its JSON API (``serve_forever`` to run it)."""
    page = PAGE.read_bytes().replace(b"/*EMBEDDED*/null", b"null")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:   # quiet: one line per request is noise here
            pass

        def _send(self, body: bytes, ctype: str, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, obj: Any, status: int = 200) -> None:
            self._send(to_json(obj).encode(), "application/json", status)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            route = url.path
            try:
                if route in ("/", "/index.html"):
                    return self._send(page, "text/html; charset=utf-8")
                if route == "/api/run":
                    index.refresh()
                    since = parse_qs(url.query).get("since", [None])[0]
                    if since is not None and since == index.version:
                        return self._json({"unchanged": True, "version": index.version})
                    return self._json(index.overview())
                if m := re.fullmatch(r"/api/episode/(\d+)", route):
                    index.refresh()
                    if int(m.group(1)) >= len(index.episodes):
                        return self._json({"error": f"no episode {m.group(1)}"}, HTTPStatus.NOT_FOUND)
                    return self._json(index.episode(int(m.group(1))))
                if route.startswith("/files/"):
                    path = index.file(unquote(route[len("/files/"):]))
                    if path is None:
                        return self._json({"error": "not found"}, HTTPStatus.NOT_FOUND)
                    return self._send(path.read_bytes(), mimetypes.guess_type(path.name)[0]
                                      or "application/octet-stream")
                return self._json({"error": f"no route {route}"}, HTTPStatus.NOT_FOUND)
            except (BrokenPipeError, ConnectionResetError):
                pass
            except Exception as e:  # a bug or an unreadable file: say so, keep serving
                self._json({"error": f"{type(e).__name__}: {e}"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    return ThreadingHTTPServer((host, port), Handler)


def export(index: RunIndex, dest: str | Path) -> Path:
    """One self-contained HTML page: the overview, every episode, images inlined as data URIs."""
    def inline(rel: str) -> str:
        path = index.run / rel
        mime = mimetypes.guess_type(path.name)[0] or "image/png"
        return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"

    index.refresh()
    data = {"overview": index.overview(),
            "episodes": {str(e["id"]): index.episode(e["id"], link=inline)
                         for e in index.overview()["episodes"]}}
    blob = to_json(data).replace("</", "<\\/")
    html = PAGE.read_text().replace("/*EMBEDDED*/null", blob)
    dest = Path(dest)
    dest.write_text(html, encoding="utf-8")
    return dest
