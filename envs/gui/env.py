"""The GUI family: an agent drives a desktop (Xvfb + openbox + Chromium) by mouse and keyboard.

Observation (a ``gymnasium.spaces.Dict``)::

    {"screenshot": PIL.Image (RGB, screen_size), "accessibility_tree": str,
     "instruction": str, "output": str}

The agent and the judge see it through :meth:`GUIEnv.present` (the
:class:`~envs.base.Observation` contract): the screenshot as a PNG image, and
as text the instruction (first observation), the last action's output and the
accessibility tree, cut to ``a11y_tree_max_chars``.

``accessibility_tree`` is a tab-separated table in the columns of OSWorld's
linearised tree (tag, name, text, position, size): the windows, then the
visible elements of the active Chromium tab with screen coordinates (read
over CDP; the container has no AT-SPI bus). ``output`` is what the last
action printed, or why it failed. The default screen is 1280x720 (OSWorld
uses 1920x1080; pass ``screen_size``) -- smaller screenshots are faster to
take, ship and encode.

Actions, in any of these forms (see :meth:`GUIEnv.parse`):

* OSWorld ``pyautogui`` code as text (optionally in a ```python fence); it
  runs *inside* the container with an xdotool-backed ``pyautogui``;
* OSWorld ``computer_13`` dicts: ``{"action_type": "CLICK", "x": 10, "y": 20}``
  (flat or with ``"parameters"``), and the strings ``WAIT``, ``DONE``, ``FAIL``;
* the shared tool-call format with the tools ``computer`` (the same actions
  as ``{"action": "click", "x": .., "y": ..}``) and ``pyautogui`` (``{"code"}``).

``DONE`` ends the episode and grades it; ``FAIL`` ends it saying the task is
infeasible (right only for OSWorld's infeasible tasks). The outcome is ``2s - 1``
of the task's score ``s`` in [0, 1], in [-1, 1] as in every family.
``info["next_state"]`` carries ``screenshot_before``/``screenshot_after``
(PNG bytes; the rollout recorder saves them as PNG files) and the code that ran.

Tasks: ``"builtin"`` (default; the web tasks in ``envs/gui/tasks/``, each
with a JavaScript check and a scripted solution), ``"osworld:DIR"`` (OSWorld
task JSON, see :mod:`envs.gui.osworld`), or :class:`~envs.base.Task` objects.
Desktops (``desktop=``): ``"container"`` (the ``nextstate/desktop`` image) or
``"osworld"`` (OSWorld's own ``desktop_env.DesktopEnv`` with its VM providers,
if installed). :meth:`GUIEnv.solve` is the oracle: the scripted solution of a
built-in task (FAIL for an infeasible OSWorld task).
"""

from __future__ import annotations

import ast
import io
import json
import re
import time
from pathlib import Path
from typing import Any, ClassVar, Iterator

import gymnasium
import numpy as np
from PIL import Image

from nextstate.containers.protocol import Sandbox
from nextstate.envs.actions import ActionError, NoToolCall, ToolCall, parse_action, tool_schema
from nextstate.envs.base import AnyText, NextStateEnv, Observation, Outcome, Task, TaskUnsupported, ToolResult
from nextstate.envs.gui import osworld
from nextstate.envs.gui.desktop import DesktopClient, DesktopError

TASKS_DIR = Path(__file__).parent / "tasks"
WEB_ROOT = "/home/agent/web"
POINTER_ACTIONS = ("MOVE_TO", "CLICK", "MOUSE_DOWN", "MOUSE_UP", "RIGHT_CLICK", "DOUBLE_CLICK",
                   "DRAG_TO", "SCROLL")
KEY_ACTIONS = ("TYPING", "PRESS", "KEY_DOWN", "KEY_UP", "HOTKEY")
ACTIONS = POINTER_ACTIONS + KEY_ACTIONS + ("WAIT", "DONE", "FAIL")
_FENCED = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)

COMPUTER_TOOL = tool_schema(
    "computer",
    "Act on the desktop with the mouse or keyboard (OSWorld's computer_13 actions). action is one of "
    + ", ".join(ACTIONS) + " (any case). CLICK/RIGHT_CLICK/DOUBLE_CLICK/MOVE_TO/DRAG_TO/MOUSE_DOWN/"
    "MOUSE_UP take x, y in screen pixels (CLICK also button and num_clicks); SCROLL takes dx/dy notches "
    "(dy > 0 scrolls up) and optionally x, y; TYPING takes text; PRESS/KEY_DOWN/KEY_UP take key "
    "(pyautogui names: enter, tab, ctrl, a ...); HOTKEY takes keys; WAIT takes seconds; DONE ends the "
    "task; FAIL says the task cannot be done.",
    {"action": ("string", "the action type"), "x": ("number", "x in pixels"), "y": ("number", "y in pixels"),
     "button": {"type": "string", "enum": ["left", "right", "middle"]},
     "num_clicks": {"type": "integer", "minimum": 1}, "text": ("string", "text to type"),
     "key": ("string", "a key name"), "keys": {"type": "array", "items": {"type": "string"}},
     "dx": ("integer", "horizontal scroll notches"), "dy": ("integer", "vertical scroll notches"),
     "seconds": ("number", "how long to WAIT")},
    required=["action"])
PYAUTOGUI_TOOL = tool_schema(
    "pyautogui", "Run Python code on the desktop; `pyautogui` and `time` are imported. Coordinates are "
    "screen pixels.", {"code": ("string", "Python code, e.g. pyautogui.click(100, 200)")})


class ImageSpace(gymnasium.Space):
    """RGB ``PIL.Image`` screenshots of one size (``shape`` is the matching ``(h, w, 3)`` array)."""

    def __init__(self, width: int, height: int, seed: int | None = None):
        super().__init__(shape=(height, width, 3), dtype=np.uint8, seed=seed)
        self.width, self.height = width, height

    def contains(self, x: Any) -> bool:
        return isinstance(x, Image.Image) and x.size == (self.width, self.height) and x.mode == "RGB"

    def sample(self, mask: Any = None, probability: Any = None) -> Image.Image:
        return Image.fromarray(self.np_random.integers(0, 256, self.shape, dtype=np.uint8), "RGB")

    @property
    def is_np_flattenable(self) -> bool:
        return True


class NoSolution(LookupError):
    """The task has no scripted solution."""


# ---- built-in web tasks -------------------------------------------------------------------


def builtin_tasks(root: Path = TASKS_DIR) -> list[Task]:
    """The web tasks: one ``<id>/task.json`` (instruction, check, solution) beside its pages each."""
    tasks = []
    for spec_file in sorted(root.glob("*/task.json")):
        spec = json.loads(spec_file.read_text())
        tasks.append(Task(id=spec_file.parent.name, instruction=spec["instruction"], category="web",
                          data={"builtin": spec, "dir": str(spec_file.parent), "skip": None}))
    return tasks


# ---- actions -------------------------------------------------------------------------------


def computer13_code(kind: str, args: dict[str, Any], size: tuple[int, int]) -> str:
    """The pyautogui code for one computer_13 action; raises :class:`ActionError` when incomplete."""
    def need(*keys: str) -> list[Any]:
        missing = [k for k in keys if args.get(k) is None]
        if missing:
            raise ActionError(f"{kind} needs {', '.join(missing)}.")
        return [args[k] for k in keys]

    def point(required: bool) -> str:
        if args.get("x") is None and args.get("y") is None and not required:
            return ""
        x, y = need("x", "y")
        if not (0 <= x < size[0] and 0 <= y < size[1]):
            raise ActionError(f"({x}, {y}) is off the {size[0]}x{size[1]} screen.")
        return f"{round(x)}, {round(y)}"

    button = repr(args.get("button") or "left")
    if kind == "MOVE_TO":
        return f"pyautogui.moveTo({point(True)})"
    if kind == "CLICK":
        clicks = int(args.get("num_clicks") or 1)
        xy = point(False)
        return f"pyautogui.click({xy + ', ' if xy else ''}button={button}, clicks={clicks})"
    if kind in ("RIGHT_CLICK", "DOUBLE_CLICK"):
        return f"pyautogui.{'rightClick' if kind == 'RIGHT_CLICK' else 'doubleClick'}({point(False)})"
    if kind in ("MOUSE_DOWN", "MOUSE_UP"):
        xy = point(False)
        return f"pyautogui.{'mouseDown' if kind == 'MOUSE_DOWN' else 'mouseUp'}({xy + ', ' if xy else ''}button={button})"
    if kind == "DRAG_TO":
        return f"pyautogui.dragTo({point(True)}, duration=0.3, button={button})"
    if kind == "SCROLL":
        dx, dy, xy = int(args.get("dx") or 0), int(args.get("dy") or 0), point(False)
        if not dx and not dy:
            raise ActionError("SCROLL needs dx or dy.")
        at = f", {xy}" if xy else ""
        return "; ".join(([f"pyautogui.hscroll({dx}{at})"] if dx else []) +
                         ([f"pyautogui.vscroll({dy}{at})"] if dy else []))
    if kind == "TYPING":
        return f"pyautogui.typewrite({need('text')[0]!r})"
    if kind in ("PRESS", "KEY_DOWN", "KEY_UP"):
        fn = {"PRESS": "press", "KEY_DOWN": "keyDown", "KEY_UP": "keyUp"}[kind]
        return f"pyautogui.{fn}({str(need('key')[0])!r})"
    if kind == "HOTKEY":
        keys = need("keys")[0]
        if not isinstance(keys, list) or not keys:
            raise ActionError("HOTKEY needs keys, a non-empty list of key names.")
        return f"pyautogui.hotkey({', '.join(repr(str(k)) for k in keys)})"
    raise ActionError(f"Unknown action {kind!r}; use one of {', '.join(ACTIONS)}.")


def checker_js(check: str) -> str:
    """A built-in task's check as an expression that never throws: ``true`` when it passes, else
    ``false`` or ``{"error": ...}`` (an element it reads is missing, say)."""
    return f"(() => {{ try {{ return ({check}) === true; }} catch (e) {{ return {{error: String(e)}}; }} }})()"


def outcome_of(score: float) -> float:
    """A GUI score in [0, 1] (OSWorld's) as an outcome in [-1, 1], as every family scores: ``2s - 1``."""
    return max(-1.0, min(1.0, 2.0 * score - 1.0))


def truncate_tree(tree: str, max_chars: int) -> str:
    """``tree`` cut to whole lines within ``max_chars``, saying how many lines were left out."""
    if len(tree) <= max_chars:
        return tree
    lines, kept, used = tree.splitlines(), [], 0
    for line in lines:
        if used + len(line) + 1 > max_chars:
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept) + f"\n[... {len(lines) - len(kept)} more lines cut to fit the budget]"


def _code_in(text: str) -> str | None:
    """The Python code an agent wrote: a fenced block, or the whole text if it looks like code."""
    m = _FENCED.search(text)
    if m:
        return m.group(1).strip()
    body = text.strip()
    if "pyautogui" in body:
        return body
    try:
        ast.parse(body)
    except SyntaxError:
        return None
    return body if re.search(r"[(=]", body) else None


def computer_call(action: dict[str, Any]) -> ToolCall:
    """An OSWorld ``computer_13`` dict (``{"action_type": "CLICK", "x": 10, "y": 20}``) as the
    ``computer`` tool's call."""
    args = {k: v for k, v in action.items() if k not in ("action_type", "parameters")}
    args.update(action.get("parameters") or {})
    args["action"] = action["action_type"]
    return ToolCall("computer", args)


# ---- backends -------------------------------------------------------------------------------


class ContainerDesktop:
    """The ``nextstate/desktop`` container behind its controller."""

    def __init__(self, sandbox: Sandbox, size: tuple[int, int]):
        self.sandbox, self.size = sandbox, size
        self.client = DesktopClient(sandbox)
        self.notes: list[str] = []

    def start(self, task: Task) -> None:
        """Starts the desktop and sets the task up (opens its page, or runs its OSWorld config)."""
        self.client.start(*self.size)
        # A clean slate when the pool hands out a used desktop (reset="reuse"): no apps, no profile.
        self.client.execute("pkill -x chromium; pkill -x socat; pkill -x xterm; for i in $(seq 50); do "
                            "pgrep -x chromium >/dev/null || break; sleep 0.1; done; "
                            f"rm -rf ~/.config/google-chrome {WEB_ROOT}", shell=True, timeout=15)
        if "builtin" in task.data:
            spec = task.data["builtin"]
            site = spec.get("site", task.id)  # a task may reuse another task's pages
            self.sandbox.copy_in(Path(task.data["dir"]).parent / site, f"{WEB_ROOT}/{site}")
            self.sandbox.run(f"rm -f {WEB_ROOT}/{site}/task.json")  # checks and solutions stay on the host
            self.open_page(f"file://{WEB_ROOT}/{site}/{spec.get('page', 'index.html')}")
        else:
            self.notes = osworld.run_config(self.client, task.data["osworld"].get("config") or [], self.size)
        self.wait_painted()

    def wait_painted(self, timeout: float = 10.0, interval: float = 0.25) -> bytes:
        """The screenshot once the screen has been drawn: the page has painted (when a page is open) and
        two frames in a row are the same. After ``timeout`` s, the last frame."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.client.eval_js("performance.getEntriesByType('paint').length > 0") is True:
                    break
            except DesktopError:
                break  # no page to ask (an OSWorld desktop task): the frames decide
            time.sleep(interval)
        frame = self.client.screenshot()
        while time.monotonic() < deadline:
            time.sleep(interval)
            previous, frame = frame, self.client.screenshot()
            if frame == previous:
                break
        return frame

    def open_page(self, url: str, timeout: float = 45) -> None:
        """Starts Chromium on ``url`` and waits until the page has loaded."""
        self.client.launch(["google-chrome", url])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if any(t["url"] == url for t in self.client.tabs()) and \
                        self.client.eval_js("document.readyState") == "complete":
                    return
            except DesktopError:
                pass
            time.sleep(0.2)
        raise DesktopError(f"Chromium did not load {url} within {timeout:g}s")

    def run_code(self, code: str, timeout: float) -> tuple[str, int]:
        r = self.client.run_python("import pyautogui, time\n" + code, timeout=timeout)
        text = (r.get("output") or "") + (r.get("error") or "")
        return text, int(r.get("returncode", r.get("return_code", 1)))

    def screenshot(self) -> bytes:
        return self.client.screenshot()

    def tree(self) -> str:
        return self.client.accessibility()

    def grade(self, task: Task, last_action: str | None) -> tuple[float, dict[str, Any]]:
        if "builtin" in task.data:
            try:
                ok = self.client.eval_js(checker_js(task.data["builtin"]["check"]))
            except DesktopError as e:
                return 0.0, {"check": False, "error": str(e)}
            if isinstance(ok, dict):
                return 0.0, {"check": False, "error": f"the check failed: {ok.get('error')}"}
            return float(ok is True), {"check": ok}
        try:
            score, details = osworld.evaluate(task.data["osworld"], self.client, self.size,
                                                           last_action)
        except (DesktopError, KeyError, TypeError, ValueError, OSError) as e:
            return 0.0, {"error": f"{type(e).__name__}: {e}", "setup_notes": self.notes}
        return score, {**details, "setup_notes": self.notes}

    def close(self) -> None:
        """Nothing to do: the sandbox goes back to its pool."""


class OSWorldDesktop:
    """OSWorld's own ``desktop_env.DesktopEnv`` (a VM through one of its providers)."""

    def __init__(self, size: tuple[int, int], **kwargs: Any):
        try:
            from desktop_env.desktop_env import DesktopEnv
        except ImportError as e:
            raise ImportError("backend='osworld' needs OSWorld's desktop_env package and a VM provider "
                              "(see github.com/xlang-ai/OSWorld: pip install -r requirements.txt, then "
                              "a provider such as docker or vmware); it is not installed here. "
                              "desktop='container' needs neither") from e
        self.env = DesktopEnv(action_space="pyautogui", screen_size=size, require_a11y_tree=True, **kwargs)
        self.obs: dict[str, Any] = {}

    def start(self, task: Task) -> None:
        if "osworld" not in task.data:
            raise TaskUnsupported("desktop='osworld' runs OSWorld tasks only")
        self.obs = self.env.reset(task_config=task.data["osworld"])

    def run_code(self, code: str, timeout: float) -> tuple[str, int]:
        self.obs, _, _, info = self.env.step(code, pause=0)
        return str(info.get("error", "") if isinstance(info, dict) else ""), 0

    def finish(self, kind: str) -> None:
        """Records DONE/FAIL in OSWorld's action history (infeasible tasks are graded on it)."""
        self.obs, _, _, _ = self.env.step(kind, pause=0)

    def screenshot(self) -> bytes:
        return self.obs.get("screenshot") or b""

    def tree(self) -> str:
        return self.obs.get("accessibility_tree") or ""

    def grade(self, task: Task, last_action: str | None) -> tuple[float, dict[str, Any]]:
        return float(self.env.evaluate()), {"backend": "osworld"}

    def close(self) -> None:
        self.env.close()


# ---- the environment ------------------------------------------------------------------------


class GUIEnv(NextStateEnv):
    """Desktop tasks driven by pyautogui code or computer_13 actions (see the module docstring).

    Args:
        tasks: ``"builtin"`` (default), ``"osworld:DIR"`` (or a path), or Tasks.
        desktop: ``"container"`` or ``"osworld"`` (``osworld_kwargs`` go to ``DesktopEnv``).
        screen_size: ``(width, height)`` of the virtual screen.
        observation_type: ``"screenshot_a11y_tree"`` (default), ``"screenshot"`` or ``"a11y_tree"``.
        settle: seconds to wait after an action before the screenshot.
        a11y_tree_max_chars: the budget of the accessibility tree in what the agent is shown
            (whole lines are kept, the rest is counted; OSWorld's agents cap it in tokens).
        **kwargs: :class:`~envs.base.NextStateEnv`'s (``pool``, ``max_steps``, ...); pools the env
            makes get 2 GiB of memory and 1024 pids unless told otherwise.
    """

    family: ClassVar[str] = "gui"
    tools: ClassVar[list[dict[str, Any]]] = [COMPUTER_TOOL, PYAUTOGUI_TOOL]
    default_max_steps: ClassVar[int] = 30
    image: ClassVar[str] = "nextstate/desktop:latest"
    lease_at_reset: ClassVar[bool] = False
    sandbox_defaults: ClassVar[dict[str, Any]] = {"memory": "2g", "pids_limit": 1024}
    fresh_sandbox: ClassVar[str] = ("a desktop's session (its X server, window manager and browser, children of "
                                    "the container's command) is state a reset cannot check")

    def __init__(self, tasks: Any = "builtin", *, desktop: str = "container",
                 screen_size: tuple[int, int] = (1280, 720), observation_type: str = "screenshot_a11y_tree",
                 settle: float = 0.3, a11y_tree_max_chars: int = 12000,
                 osworld_kwargs: dict[str, Any] | None = None, **kwargs: Any):
        if desktop not in ("container", "osworld"):
            raise ValueError(f"desktop must be 'container' or 'osworld', got {desktop!r}")
        if observation_type not in ("screenshot_a11y_tree", "screenshot", "a11y_tree"):
            raise ValueError(f"unknown observation_type {observation_type!r}")
        super().__init__(tasks, **kwargs)
        self.desktop_kind, self.size = desktop, (int(screen_size[0]), int(screen_size[1]))
        self.observation_type, self.settle = observation_type, settle
        self.a11y_tree_max_chars = a11y_tree_max_chars
        self.osworld_kwargs = osworld_kwargs or {}
        self.observation_space = gymnasium.spaces.Dict({
            "screenshot": ImageSpace(*self.size), "accessibility_tree": AnyText(1 << 22),
            "instruction": AnyText(1 << 16), "output": AnyText(1 << 20)})
        self.desktop: ContainerDesktop | OSWorldDesktop | None = None
        self._vm: OSWorldDesktop | None = None
        self._shot: bytes = b""
        self._shown: tuple[Image.Image | None, bytes] = (None, b"")  # the last screenshot, decoded and as PNG
        self._tree = ""
        self._last_kind: str | None = None

    # -- tasks --
    def load_tasks(self, source: Any) -> list[Task]:
        """``"builtin"``/None, ``"osworld:DIR"``, a path to OSWorld JSON, or Task objects."""
        if source is None or source == "builtin":
            return builtin_tasks()
        if isinstance(source, str) and source.startswith("osworld:"):
            return osworld.load_tasks(source.split(":", 1)[1])
        if isinstance(source, (str, Path)) and Path(source).exists():
            return osworld.load_tasks(source)
        return super().load_tasks(source)

    def sandbox_overrides(self, task: Task) -> dict[str, Any]:
        """A shared pool of another image is not used: the env then makes a desktop pool."""
        return {"image": self.image}

    def skip_reason(self, task: Task) -> str | None:
        """Why this desktop cannot run ``task`` (report it skipped), or None."""
        return task.data.get("skip")

    # -- episode --
    def start_episode(self, task: Task) -> Any:
        reason = self.skip_reason(task)
        if reason:
            raise TaskUnsupported(reason)
        self._last_kind = None
        if self.desktop_kind == "osworld":
            if self._vm is None:
                self._vm = OSWorldDesktop(self.size, **self.osworld_kwargs)
            self.desktop = self._vm
        else:
            self.desktop = ContainerDesktop(self.sandbox, self.size)
        self.desktop.start(task)
        self._observe_desktop()
        return None

    def first_observation(self, task: Task, extras: Any) -> dict[str, Any]:
        return self._obs("")

    def observe(self, result: ToolResult) -> dict[str, Any]:
        """The screen after the step. A step that ran nothing (an invalid action) takes a new screenshot
        too; where none can be taken the output says the image is the previous one."""
        output = result.output
        if "screenshot_after" not in result.extra and self.desktop is not None and not self._ended:
            try:
                self._observe_desktop()
            except (DesktopError, OSError) as e:
                output += f"\n[the screenshot is the previous one: the screen could not be captured ({e})]"
        return self._obs(output)

    def _obs(self, output: str) -> dict[str, Any]:
        if self._shot:
            shot = Image.open(io.BytesIO(self._shot)).convert("RGB")
        else:
            shot = Image.new("RGB", self.size)
        self._shown = (shot, self._shot)
        return {"screenshot": shot, "accessibility_tree": self._tree,
                "instruction": self.task.instruction if self.task else "", "output": output}

    def present(self, obs: Any) -> Observation:
        """What the agent and judge are shown: the instruction (first observation only; the
        chat keeps it), the action's output and the accessibility tree as text; the
        screenshot as a PNG image (none with ``observation_type="a11y_tree"``)."""
        if not isinstance(obs, dict):
            return Observation.of(obs)
        parts = [f"Task: {obs['instruction']}"] if not obs.get("output") else \
                [f"Result of the action: {obs['output']}"]
        tree = obs.get("accessibility_tree") or ""
        if tree:
            parts.append("Accessibility tree of the screen:\n" + truncate_tree(tree, self.a11y_tree_max_chars))
        images = []
        shot = obs.get("screenshot")
        if self.observation_type != "a11y_tree" and isinstance(shot, Image.Image):
            if shot is self._shown[0] and self._shown[1]:
                images.append(self._shown[1])
            else:
                buf = io.BytesIO()
                shot.save(buf, "PNG")
                images.append(buf.getvalue())
        return Observation("\n\n".join(parts), images,
                           {"output": obs.get("output", ""), "screen_size": list(self.size)})

    def _observe_desktop(self) -> None:
        assert self.desktop is not None
        self._shot = self.desktop.screenshot() if self.observation_type != "a11y_tree" else b""
        self._tree = self.desktop.tree() if self.observation_type != "screenshot" else ""

    def parse(self, action: Any) -> ToolCall:
        """computer_13 dicts, WAIT/DONE/FAIL, pyautogui code text, or a tool call."""
        if isinstance(action, dict) and "action_type" in action:
            action = {"name": "computer", "arguments": computer_call(action).arguments}
        elif isinstance(action, str):
            word = action.strip().strip("`").strip().upper()
            if word in ("WAIT", "DONE", "FAIL"):
                return ToolCall("computer", {"action": word})
            try:
                return parse_action(action, self.tools)
            except NoToolCall:
                code = _code_in(action)
                if code is None:
                    raise
                action = {"name": "pyautogui", "arguments": {"code": code}}
        return parse_action(action, self.tools)

    def call_tool(self, call: ToolCall) -> ToolResult:
        assert self.desktop is not None
        before = self._shot
        if call.name == "pyautogui":
            kind, code = "CODE", str(call.arguments["code"])
        else:
            kind = str(call.arguments.get("action", "")).strip().upper()
            if kind not in ACTIONS:
                raise ActionError(f"Unknown action {call.arguments.get('action')!r}; use one of {', '.join(ACTIONS)}.")
            code = "" if kind in ("WAIT", "DONE", "FAIL") else computer13_code(kind, call.arguments, self.size)
        self._last_kind = kind
        if kind in ("DONE", "FAIL"):
            if isinstance(self.desktop, OSWorldDesktop):
                self.desktop.finish(kind)
            return ToolResult(kind, 0, done=True,
                              extra={"screenshot_before": before, "screenshot_after": before, "code": None})
        if kind == "WAIT":
            time.sleep(min(float(call.arguments.get("seconds") or 1.0), self.step_timeout))
            output, rc = "waited", 0
        else:
            output, rc = self.desktop.run_code(code, timeout=self.step_timeout)
            time.sleep(self.settle)
        self._observe_desktop()
        return ToolResult(output.strip() or "ok" if rc == 0 else output.strip() or f"exit code {rc}", rc,
                          extra={"screenshot_before": before, "screenshot_after": self._shot, "code": code})

    def compute_outcome(self) -> Outcome:
        assert self.task is not None and self.desktop is not None
        score, details = self.desktop.grade(self.task, self._last_kind)
        return Outcome(outcome_of(score), {"domain": self.task.category, "last_action": self._last_kind,
                                           "score": score, **details})

    def close(self) -> None:
        if self._vm is not None:
            self._vm.close()
            self._vm = None
        super().close()

    # -- the oracle --
    def solve(self) -> Iterator[dict[str, Any]]:
        """The current task's scripted solution as computer_13 actions, ending with DONE (or FAIL).

        Element positions are read from the page (over CDP) when each action
        is drawn, so step the env with an action before drawing the next.
        Raises :class:`NoSolution` for a task without one.
        """
        task = self.task
        if task is None:
            raise NoSolution("no episode is running")
        if "builtin" in task.data:
            for step in task.data["builtin"]["solution"]:
                yield from self._gold(step)
            yield {"action_type": "DONE"}
        elif task.data.get("osworld", {}).get("evaluator", {}).get("func") == "infeasible":
            yield {"action_type": "FAIL"}
        else:
            raise NoSolution(f"task {task.id} has no scripted solution")

    def oracle_actions(self, task: Task, kind: str) -> Iterator[dict[str, Any]] | list[dict[str, Any]]:
        """gold: :meth:`solve` (drawn lazily, step by step); noop: DONE at once."""
        if kind == "noop":
            return [{"action_type": "DONE"}]
        infeasible = task.data.get("osworld", {}).get("evaluator", {}).get("func") == "infeasible"
        if "builtin" not in task.data and not infeasible:
            raise NoSolution(f"task {task.id} has no scripted solution")
        return self.solve()

    def _gold(self, step: dict[str, Any]) -> Iterator[dict[str, Any]]:
        (op, arg), = step.items()
        if op in ("click", "double_click", "right_click", "triple_click"):
            box = yield from self._in_view(arg)
            kind = "CLICK" if op == "triple_click" else op.upper()
            yield {"action_type": kind, "x": box["cx"], "y": box["cy"], **({"num_clicks": 3} if op == "triple_click" else {})}
        elif op == "drag":
            start = yield from self._in_view(arg[0])
            yield {"action_type": "MOVE_TO", "x": start["cx"], "y": start["cy"]}
            end = yield from self._in_view(arg[1])
            yield {"action_type": "DRAG_TO", "x": end["cx"], "y": end["cy"]}
        elif op == "type":
            yield {"action_type": "TYPING", "text": arg}
        elif op == "press":
            yield {"action_type": "PRESS", "key": arg}
        elif op == "hotkey":
            yield {"action_type": "HOTKEY", "keys": list(arg)}
        else:
            raise ValueError(f"unknown solution step {step!r}")

    def _in_view(self, selector: str) -> Iterator[dict[str, Any]]:
        """Scrolls (by yielding SCROLL actions) until ``selector`` is on screen; returns its box."""
        assert isinstance(self.desktop, ContainerDesktop)
        for _ in range(20):
            box = self.desktop.client.locate(selector)
            if box["in_view"]:
                return box
            w, h = self.size
            yield {"action_type": "SCROLL", "dy": -3 if box["y"] > h / 2 else 3, "x": w // 2, "y": h // 2}
        raise DesktopError(f"could not scroll {selector!r} into view")

