"""The desktop container's HTTP controller (stdlib ``http.server``; runs as the non-root user).

It speaks the request and response shapes of OSWorld's VM server, so code
written for that server can drive this desktop:

    GET  /platform                 "Linux"
    GET  /screenshot               PNG of the screen (with the pointer drawn; ?cursor=0 leaves it out)
    GET|POST /screen_size          {"width", "height"}
    GET  /cursor_position          [x, y]
    POST /execute, /setup/execute  {"command": [...] | "...", "shell": bool, "timeout": s}
                                   -> {"status", "output", "error", "returncode"}
    POST /run_python               {"code", "timeout"} -> {"status", "output", "error", "return_code"}
    GET  /accessibility            {"AT": text}: the windows, and the active Chromium tab's
                                   visible elements with screen positions (see ``tree``)
    POST /file                     form or JSON ``file_path`` -> the file's bytes (404 if absent)
    POST /setup/upload             multipart (file_path, file_data) or JSON {"file_path", "data_b64"}
    POST /setup/launch             {"command", "shell"}: start a program, detached
    POST /setup/open_file          {"path", "window_name", "timeout_seconds"}
    POST /setup/activate_window    {"window_name", "strict", "by_class"}
    POST /setup/close_window       same
    POST /list_directory           {"path"} -> {"name", "type", "children"} tree
    POST /desktop_path             {"desktop_path"}

plus Chromium over the DevTools protocol (CDP, 127.0.0.1:9222):

    GET  /browser/tabs             [{"id", "url", "title", "active"}], oldest first
    POST /browser/open             {"urls": [...]}: one new tab each, the last one active
    POST /browser/close            {"urls": [...]}: close the tabs showing these URLs
    POST /browser/eval             {"expression", "tab": "active" | id} -> {"result"}
    POST /browser/locate           {"selector"} -> screen box {"x", "y", "w", "h", "cx", "cy", "in_view"}
                                   of the first match in the active tab (404 if none)

Agent code runs in child processes (``python3`` with the ``pyautogui`` shim
on PYTHONPATH), never inside this server.
"""

from __future__ import annotations

import argparse
import base64
import email.parser
import io
import json
import os
import shlex
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import websocket  # Debian's python3-websocket
from PIL import ImageDraw, ImageGrab

CDP = "http://127.0.0.1:9222"
LOG = Path("/tmp/launched.log")
HOME = Path.home()

# Screen coordinates of the page's viewport origin, and the visible elements
# an agent can act on: role, name, text and their boxes in screen pixels.
PAGE_OFFSET_JS = """(() => {
  const dx = window.screenX + Math.max(0, (window.outerWidth - window.innerWidth) / 2);
  const dy = window.screenY + Math.max(0, window.outerHeight - window.innerHeight);
  return [dx, dy];
})()"""
TREE_JS = """(() => {
  const [dx, dy] = %s;
  const rows = [];
  const interactive = 'a,button,input,select,textarea,summary,label,[role],[onclick],[tabindex],[contenteditable=true]';
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1 || r.bottom < 0 || r.right < 0 ||
        r.top > innerHeight || r.left > innerWidth) continue;
    const st = getComputedStyle(el);
    if (st.visibility === 'hidden' || st.display === 'none') continue;
    const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join(' ').trim();
    if (!el.matches(interactive) && !own) continue;
    const name = el.getAttribute('aria-label') || el.getAttribute('name') || el.id || el.getAttribute('title') || '';
    const value = ('value' in el && el.tagName !== 'BUTTON') ? String(el.value) :
                  (el.type === 'checkbox' || el.type === 'radio') ? String(el.checked) : '';
    rows.push([el.getAttribute('role') || el.tagName.toLowerCase() + (el.type ? '[' + el.type + ']' : ''),
               name, (own || value).slice(0, 120).replace(/\\s+/g, ' '),
               '(' + Math.round(dx + r.left) + ', ' + Math.round(dy + r.top) + ')',
               '(' + Math.round(r.width) + ', ' + Math.round(r.height) + ')']);
    if (rows.length >= 400) break;
  }
  return rows;
})()""" % PAGE_OFFSET_JS


# ---- screen ------------------------------------------------------------------------


def screen_size() -> tuple[int, int]:
    """Width and height of the X screen."""
    out = subprocess.run(["xdotool", "getdisplaygeometry"], capture_output=True, text=True, check=True)
    w, h = out.stdout.split()
    return int(w), int(h)


def cursor_position() -> tuple[int, int]:
    """Where the pointer is."""
    out = subprocess.run(["xdotool", "getmouselocation", "--shell"], capture_output=True, text=True)
    vals = dict(line.split("=", 1) for line in out.stdout.split() if "=" in line)
    return int(vals.get("X", 0)), int(vals.get("Y", 0))


def screenshot_png(cursor: bool = True) -> bytes:
    """The screen as PNG, fast compression; the pointer drawn as a small arrow."""
    img = ImageGrab.grab().convert("RGB")
    if cursor:
        x, y = cursor_position()
        arrow = [(x, y), (x, y + 16), (x + 4, y + 12), (x + 7, y + 18), (x + 9, y + 17), (x + 6, y + 11), (x + 11, y + 11)]
        ImageDraw.Draw(img).polygon(arrow, fill="white", outline="black")
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


# ---- processes ---------------------------------------------------------------------


def _argv(command: Any, shell: bool) -> Any:
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    if isinstance(command, list):
        command = [os.path.expanduser(a) if isinstance(a, str) and a.startswith("~/") else a for a in command]
    return command


def execute(command: Any, shell: bool = False, timeout: float = 120) -> dict[str, Any]:
    """Runs a command to completion; OSWorld's /execute answer."""
    try:
        r = subprocess.run(_argv(command, shell), shell=shell, capture_output=True, text=True,
                           timeout=timeout, cwd=HOME, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        return {"status": "error", "output": _text(e.stdout), "error": f"timed out after {timeout}s",
                "returncode": 124}
    except (OSError, ValueError) as e:
        return {"status": "error", "output": "", "error": str(e), "returncode": 127}
    return {"status": "success", "output": r.stdout, "error": r.stderr, "returncode": r.returncode}


def _text(data: Any) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def run_python(code: str, timeout: float = 60) -> dict[str, Any]:
    """Runs Python code in a child ``python3`` (where ``import pyautogui`` is the xdotool shim)."""
    r = execute(["python3", "-c", code], timeout=timeout)
    return {"status": "success" if r["returncode"] == 0 else "error", "output": r["output"],
            "error": r["error"], "return_code": r["returncode"], "returncode": r["returncode"]}


def launch(command: Any, shell: bool = False) -> str:
    """Starts a program detached (``setsid -f``: PID 1 adopts and reaps it), output to /tmp/launched.log.

    Raises ``FileNotFoundError`` when the program does not exist.
    """
    argv = _argv(command, shell)
    if not shell and not shutil.which(argv[0]):
        raise FileNotFoundError(f"program not found: {argv[0]}")
    with LOG.open("ab") as log:
        subprocess.run(["setsid", "-f", *(["sh", "-c", argv] if shell else argv)], stdout=log, stderr=log,
                       stdin=subprocess.DEVNULL, cwd=HOME, check=True)
    return f"{argv if shell else ' '.join(argv)} launched successfully"


# ---- windows -----------------------------------------------------------------------


def windows() -> list[dict[str, Any]]:
    """Top-level windows: id, desktop, x, y, w, h, class and title (``wmctrl -lGx``)."""
    out = subprocess.run(["wmctrl", "-lGx"], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split(None, 8)
        if len(parts) >= 8:
            wid, desk, x, y, w, h, klass = parts[:7]
            rows.append({"id": wid, "x": int(x), "y": int(y), "w": int(w), "h": int(h),
                         "class": klass, "title": parts[8] if len(parts) > 8 else ""})
    return rows


def wmctrl_window(action: str, name: str, strict: bool = False, by_class: bool = False) -> int:
    """``wmctrl -a`` (activate) or ``-c`` (close) a window by title or class."""
    flags = "-" + ("x" if by_class else "") + ("F" if strict else "") + action
    return subprocess.run(["wmctrl", flags, name], capture_output=True).returncode


def open_file(path: str, window_name: str | None, timeout: float) -> tuple[int, str]:
    """Opens a file (HTML and URLs in Chromium; otherwise xdg-open if present) and waits for its window."""
    target = os.path.expanduser(path)
    if not os.path.exists(target) and not shutil.which(target) and "://" not in target:
        return 404, f"Application/file not found: {path}"
    if shutil.which(target):
        launch([target])
    elif "://" in target or target.endswith((".html", ".htm", ".pdf", ".svg", ".png", ".jpg")):
        launch(["google-chrome", target if "://" in target else "file://" + os.path.abspath(target)])
    elif shutil.which("xdg-open"):
        launch(["xdg-open", target])
    else:
        return 501, f"no application in this desktop opens {path}"
    stem = Path(target).name
    wanted = [window_name] if window_name else [stem, os.path.splitext(stem)[0]]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for win in windows():
            if any(w and w in win["title"] for w in wanted):
                subprocess.run(["wmctrl", "-i", "-a", win["id"]])
                return 200, "File opened and window activated successfully"
        time.sleep(0.25)
    return 500, f"Failed to find window for {wanted} within {timeout:g} seconds."


def list_directory(path: str) -> dict[str, Any]:
    """A directory as a nested {"name", "type", "children"} tree."""
    p = Path(os.path.expanduser(path))
    if p.is_dir():
        return {"name": p.name, "type": "directory",
                "children": [list_directory(str(c)) for c in sorted(p.iterdir())]}
    return {"name": p.name, "type": "file"}


# ---- Chromium over CDP ---------------------------------------------------------------


def cdp_json(path: str, method: str = "GET") -> Any:
    """One call of Chromium's DevTools HTTP endpoint."""
    req = urllib.request.Request(CDP + path, method=method)
    with urllib.request.urlopen(req, timeout=5) as resp:
        body = resp.read()
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return body.decode(errors="replace")


def wait_for_browser(timeout: float = 20) -> None:
    """Blocks until Chromium's DevTools endpoint answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            cdp_json("/json/version")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Chromium's DevTools endpoint {CDP} did not answer in {timeout:g}s")
            time.sleep(0.2)


def evaluate(ws_url: str, expression: str, timeout: float = 10) -> Any:
    """``Runtime.evaluate`` in one page target; the value (promises awaited)."""
    ws = websocket.create_connection(ws_url, timeout=timeout, suppress_origin=True)
    try:
        ws.send(json.dumps({"id": 1, "method": "Runtime.evaluate", "params": {
            "expression": expression, "returnByValue": True, "awaitPromise": True}}))
        while True:
            msg = json.loads(ws.recv())
            if msg.get("id") == 1:
                break
    finally:
        ws.close()
    res = msg.get("result", {})
    if "exceptionDetails" in res:
        raise RuntimeError(res["exceptionDetails"].get("exception", {}).get("description")
                           or res["exceptionDetails"].get("text", "JavaScript error"))
    if "error" in msg:
        raise RuntimeError(msg["error"].get("message", str(msg["error"])))
    return res.get("result", {}).get("value")


def tabs() -> list[dict[str, Any]]:
    """Open page tabs, oldest document first; ``active`` is the one whose document is visible.

    CDP lists targets most recently used first; with several tabs each page is
    asked for its visibility and its document's start time, and the list is
    sorted by that time (the tab-strip order, unless a tab navigated later).
    """
    pages = [t for t in cdp_json("/json/list") if t.get("type") == "page"]
    out = []
    for t in pages:
        visible, born = len(pages) == 1, 0.0
        if not visible:
            try:
                state, born = evaluate(t["webSocketDebuggerUrl"],
                                       "[document.visibilityState, performance.timeOrigin]", 3)
                visible = state == "visible"
            except Exception:
                pass
        out.append({"id": t["id"], "url": t.get("url", ""), "title": t.get("title", ""),
                    "active": visible, "ws": t.get("webSocketDebuggerUrl"), "born": born})
    out.sort(key=lambda t: t.pop("born"))
    if out and not any(t["active"] for t in out):
        out[0]["active"] = True
    return out


def tab_ws(which: str) -> str:
    """The websocket URL of the active tab, or of the tab with id ``which``."""
    for t in tabs():
        if (which == "active" and t["active"]) or t["id"] == which:
            return t["ws"]
    raise LookupError(f"no browser tab {which!r}")


def open_tabs(urls: list[str]) -> list[str]:
    """Opens each URL in a new tab, waiting for it to load; returns the tab ids."""
    wait_for_browser()
    ids = []
    for url in urls:
        tab = cdp_json("/json/new?" + urllib.parse.quote(url, safe=":/?&=#%"), method="PUT")
        ids.append(tab["id"])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if evaluate(tab["webSocketDebuggerUrl"], "document.readyState", 3) == "complete":
                    break
            except Exception:
                pass
            time.sleep(0.2)
    if ids:
        cdp_json(f"/json/activate/{ids[-1]}")
    return ids


def _same_url(a: str, b: str) -> bool:
    norm = lambda u: u.rstrip("/").split("://", 1)[-1].removeprefix("www.")  # noqa: E731
    return norm(a) == norm(b)


def close_tabs(urls: list[str]) -> int:
    """Closes every tab showing one of ``urls``; returns how many."""
    closed = 0
    for t in tabs():
        if any(_same_url(t["url"], u) for u in urls):
            cdp_json(f"/json/close/{t['id']}")
            closed += 1
    return closed


LOCATE_JS = """((sel) => {
  const el = document.querySelector(sel);
  if (!el) return null;
  const [dx, dy] = %s;
  const r = el.getBoundingClientRect();
  return {x: dx + r.left, y: dy + r.top, w: r.width, h: r.height,
          cx: Math.round(dx + r.left + r.width / 2), cy: Math.round(dy + r.top + r.height / 2),
          in_view: r.top >= 0 && r.bottom <= innerHeight && r.left >= 0 && r.right <= innerWidth};
})""" % PAGE_OFFSET_JS


def locate(selector: str) -> dict[str, Any] | None:
    """Screen box of the first element matching ``selector`` in the active tab."""
    return evaluate(tab_ws("active"), f"{LOCATE_JS}({json.dumps(selector)})")


def tree() -> str:
    """A text accessibility tree: the windows, then the active tab's visible elements.

    Columns follow OSWorld's linearised tree: tag, name, text, position
    (top-left x, y on screen) and size (w, h).
    """
    lines = ["tag\tname\ttext\tposition (top-left x&y)\tsize (w&h)"]
    for win in windows():
        lines.append(f"window\t{win['class']}\t{win['title']}\t({win['x']}, {win['y']})\t({win['w']}, {win['h']})")
    try:
        rows = evaluate(tab_ws("active"), TREE_JS, 5) or []
    except Exception:  # no browser, or a page that will not answer
        rows = []
    lines += ["\t".join(str(c) for c in row) for row in rows]
    return "\n".join(lines)


# ---- HTTP ------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    """Routes requests to the functions above."""

    server_version = "nextstate-desktop/1"

    def log_message(self, fmt: str, *args: Any) -> None:  # keep the container's log quiet
        pass

    def _send(self, code: int, body: Any, ctype: str | None = None) -> None:
        if isinstance(body, (dict, list)):
            data, ctype = json.dumps(body).encode(), "application/json"
        elif isinstance(body, str):
            data, ctype = body.encode(), ctype or "text/plain; charset=utf-8"
        else:
            data = body
        self.send_response(code)
        self.send_header("Content-Type", ctype or "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ctype = self.headers.get("Content-Type", "")
        if ctype.startswith("multipart/form-data"):
            msg = email.parser.BytesParser().parsebytes(
                f"Content-Type: {ctype}\r\n\r\n".encode() + raw)
            fields: dict[str, Any] = {}
            for part in msg.get_payload():
                name = part.get_param("name", header="content-disposition")
                data = part.get_payload(decode=True)
                fields[name] = data if part.get_filename() else data.decode()
            return fields
        if ctype.startswith("application/x-www-form-urlencoded"):
            return {k: v[0] for k, v in urllib.parse.parse_qs(raw.decode()).items()}
        return json.loads(raw) if raw.strip() else {}

    def do_GET(self) -> None:  # noqa: N802
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        try:
            if url.path == "/platform":
                return self._send(200, "Linux")
            if url.path == "/screenshot":
                return self._send(200, screenshot_png(query.get("cursor", ["1"])[0] != "0"), "image/png")
            if url.path == "/screen_size":
                w, h = screen_size()
                return self._send(200, {"width": w, "height": h})
            if url.path == "/cursor_position":
                return self._send(200, list(cursor_position()))
            if url.path == "/accessibility":
                return self._send(200, {"AT": tree()})
            if url.path == "/browser/tabs":
                return self._send(200, [{k: v for k, v in t.items() if k != "ws"} for t in tabs()])
            return self._send(404, f"no such endpoint: GET {url.path}")
        except Exception as e:  # report, never kill the server
            return self._send(500, {"status": "error", "message": f"{type(e).__name__}: {e}"})

    def do_POST(self) -> None:  # noqa: N802
        path = urllib.parse.urlparse(self.path).path
        try:
            body = self._body()
            if path in ("/execute", "/setup/execute"):
                return self._send(200, execute(body.get("command", ""), bool(body.get("shell")),
                                               float(body.get("timeout", 120))))
            if path == "/run_python":
                return self._send(200, run_python(body["code"], float(body.get("timeout", 60))))
            if path == "/screen_size":
                w, h = screen_size()
                return self._send(200, {"width": w, "height": h})
            if path == "/file":
                p = Path(os.path.expanduser(body["file_path"]))
                if not p.is_file():
                    return self._send(404, f"File not found: {p}")
                return self._send(200, p.read_bytes())
            if path == "/setup/upload":
                p = Path(os.path.expanduser(body["file_path"]))
                data = body["file_data"] if "file_data" in body else base64.b64decode(body["data_b64"])
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data if isinstance(data, bytes) else data.encode())
                return self._send(200, "File uploaded")
            if path == "/setup/launch":
                try:
                    return self._send(200, launch(body["command"], bool(body.get("shell"))))
                except FileNotFoundError as e:
                    return self._send(404, str(e))
            if path == "/setup/open_file":
                code, msg = open_file(body["path"], body.get("window_name"),
                                      float(body.get("timeout_seconds", 30)))
                return self._send(code, msg)
            if path in ("/setup/activate_window", "/setup/close_window"):
                rc = wmctrl_window("a" if path.endswith("activate_window") else "c", body["window_name"],
                                   bool(body.get("strict")), bool(body.get("by_class")))
                return self._send(200 if rc == 0 else 404,
                                  "done" if rc == 0 else f"Window {body['window_name']} not found")
            if path == "/list_directory":
                return self._send(200, list_directory(body["path"]))
            if path == "/desktop_path":
                return self._send(200, {"desktop_path": str(HOME / "Desktop")})
            if path == "/browser/open":
                return self._send(200, {"ids": open_tabs(list(body["urls"]))})
            if path == "/browser/close":
                return self._send(200, {"closed": close_tabs(list(body["urls"]))})
            if path == "/browser/eval":
                value = evaluate(tab_ws(body.get("tab", "active")), body["expression"],
                                 float(body.get("timeout", 10)))
                return self._send(200, {"result": value})
            if path == "/browser/locate":
                box = locate(body["selector"])
                return self._send(200 if box else 404, box or f"nothing matches {body['selector']!r}")
            return self._send(404, f"no such endpoint: POST {path}")
        except Exception as e:  # report, never kill the server
            return self._send(500, {"status": "error", "message": f"{type(e).__name__}: {e}"})


def main() -> None:
    """``controller.py [--host H] [--port P]``"""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000)
    args = ap.parse_args()
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
