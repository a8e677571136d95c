"""The desktop container's controller, seen from the host: :class:`DesktopClient` talks to it
(``containers/desktop/controller.py``, OSWorld's VM-server protocol) through the sandbox's shell:
every request is a ``curl`` to 127.0.0.1 inside the container, so the desktop needs no network and
no published port."""

from __future__ import annotations

import base64
import json
import shlex
import time
from typing import Any

from nextstate.containers.protocol import Sandbox

CONTROLLER_PORT = 5000
HOME = "/home/user"  # OSWorld's paths; the image links it to the agent's home


class DesktopError(RuntimeError):
    """The controller answered with an error (or not at all)."""


class DesktopClient:
    """The container's controller, reached with ``curl`` through the sandbox's shell."""

    OUT = "/tmp/.nextstate-controller-reply"

    def __init__(self, sandbox: Sandbox, port: int = CONTROLLER_PORT):
        self.sandbox, self.port = sandbox, port

    def request(self, method: str, path: str, payload: Any = None, timeout: float = 60) -> tuple[int, bytes]:
        """One HTTP request; the status and the body."""
        data = ""
        if payload is not None:
            b64 = base64.b64encode(json.dumps(payload).encode()).decode()
            data = f"printf %s {b64} | base64 -d | "
        body_opts = "-H 'Content-Type: application/json' --data-binary @- " if payload is not None else ""
        cmd = (f"{data}curl -sS -m {timeout:g} -X {method} {body_opts}-o {self.OUT} -w '%{{http_code}}' "
               f"http://127.0.0.1:{self.port}{shlex.quote(path)}")
        r = self.sandbox.run(cmd, timeout=timeout + 5)
        try:
            code = int(r.stdout.strip()[-3:])
        except ValueError:
            code = 0
        if code == 0:
            raise DesktopError(f"{method} {path}: the controller did not answer: {r.output.strip()[:300]}")
        try:
            body = self.sandbox.read_file(self.OUT)
        except FileNotFoundError:
            body = b""
        return code, body

    def call(self, method: str, path: str, payload: Any = None, timeout: float = 60) -> Any:
        """A request that must succeed; JSON answers decoded, others as text."""
        code, body = self.request(method, path, payload, timeout)
        if code != 200:
            raise DesktopError(f"{method} {path} -> {code}: {body.decode(errors='replace')[:500]}")
        try:
            return json.loads(body)
        except ValueError:
            return body.decode(errors="replace")

    # -- lifecycle --
    def start(self, width: int, height: int, timeout: float = 90) -> None:
        """Starts Xvfb, the window manager and the controller unless they answer already.

        Raises :class:`DesktopError` with the start-up logs when the start script gives up
        (it exits when openbox fails three times) or nothing answers within ``timeout``.
        """
        probe = f"curl -s -m 1 -o /dev/null http://127.0.0.1:{self.port}/platform"
        if self.sandbox.run(probe, timeout=5).exit_code == 0:
            return
        # The start script's pid, written before the launch returns: it stays the same through the
        # script's `exec` of the controller. (`pgrep -f` can miss a process in the middle of an exec,
        # its command line empty for a moment: a desktop still starting was taken for one that exited.)
        pid = "/tmp/.nextstate-desktop.pid"
        self.sandbox.run(f"rm -f {pid}; SCREEN_SIZE={width}x{height} CONTROLLER_PORT={self.port} "
                         f"setsid -f sh -c 'echo $$ >{pid}; exec nextstate-desktop' >/tmp/desktop.log 2>&1; "
                         f"for i in $(seq 200); do [ -s {pid} ] && break; sleep 0.05; done", timeout=20)
        # up: the controller answers; gone: the start script (the controller, once it execs) runs no more
        check = f'{probe} && echo up || kill -0 "$(cat {pid} 2>/dev/null)" 2>/dev/null || echo gone'
        deadline = time.monotonic() + timeout
        while (state := self.sandbox.run(check, timeout=5).stdout.strip()) != "up":
            if state == "gone" or time.monotonic() > deadline:
                log = self.sandbox.run("tail -n 20 /tmp/desktop.log /tmp/openbox.log /tmp/xvfb.log",
                                       timeout=5).output
                why = "the desktop's start script exited" if state == "gone" else f"no answer in {timeout:g}s"
                raise DesktopError(f"the desktop did not start ({why}):\n{log}")
            time.sleep(0.1)

    # -- OSWorld's endpoints --
    def screenshot(self) -> bytes:
        code, body = self.request("GET", "/screenshot")
        if code != 200:
            raise DesktopError(f"screenshot failed ({code}): {body[:300]!r}")
        return body

    def screen_size(self) -> tuple[int, int]:
        size = self.call("GET", "/screen_size")
        return int(size["width"]), int(size["height"])

    def execute(self, command: str | list[str], shell: bool = False, timeout: float = 120) -> dict[str, Any]:
        return self.call("POST", "/execute", {"command": command, "shell": shell, "timeout": timeout},
                         timeout=timeout + 5)

    def run_python(self, code: str, timeout: float = 60) -> dict[str, Any]:
        return self.call("POST", "/run_python", {"code": code, "timeout": timeout}, timeout=timeout + 5)

    def launch(self, command: str | list[str], shell: bool = False) -> None:
        self.call("POST", "/setup/launch", {"command": command, "shell": shell})

    def open_file(self, path: str, window_name: str | None = None, timeout: float = 30) -> None:
        self.call("POST", "/setup/open_file", {"path": path, "window_name": window_name,
                                                "timeout_seconds": timeout}, timeout=timeout + 5)

    def window(self, action: str, name: str, strict: bool = False, by_class: bool = False) -> bool:
        """``action`` is ``activate`` or ``close``; whether a window matched."""
        code, _ = self.request("POST", f"/setup/{action}_window",
                               {"window_name": name, "strict": strict, "by_class": by_class})
        return code == 200

    def upload(self, path: str, data: bytes) -> None:
        self.call("POST", "/setup/upload", {"file_path": path,
                                            "data_b64": base64.b64encode(data).decode()})

    def get_file(self, path: str) -> bytes | None:
        """A file's bytes, or None when it does not exist."""
        code, body = self.request("POST", "/file", {"file_path": path})
        return body if code == 200 else None

    def accessibility(self) -> str:
        return self.call("GET", "/accessibility")["AT"]

    def list_directory(self, path: str) -> dict[str, Any]:
        return self.call("POST", "/list_directory", {"path": path})

    # -- Chromium --
    def tabs(self) -> list[dict[str, Any]]:
        return self.call("GET", "/browser/tabs")

    def open_tabs(self, urls: list[str]) -> None:
        self.call("POST", "/browser/open", {"urls": urls}, timeout=90)

    def close_tabs(self, urls: list[str]) -> None:
        self.call("POST", "/browser/close", {"urls": urls})

    def eval_js(self, expression: str, tab: str = "active") -> Any:
        return self.call("POST", "/browser/eval", {"expression": expression, "tab": tab})["result"]

    def locate(self, selector: str) -> dict[str, Any]:
        """Screen box of the first element matching a CSS selector in the active tab."""
        return self.call("POST", "/browser/locate", {"selector": selector})


def wait_for_browser(client: DesktopClient, timeout: float = 30) -> None:
    """Blocks until Chromium's DevTools endpoint (127.0.0.1:9222 in the desktop) lists its tabs."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client.tabs():
                return
        except DesktopError:
            pass
        if time.monotonic() > deadline:
            raise DesktopError(f"Chromium's DevTools endpoint did not answer within {timeout:g}s")
        time.sleep(0.25)
