"""A ``pyautogui`` stand-in for this desktop, on ``xdotool`` (pyautogui is not packaged in Debian).

It covers what OSWorld's action code uses: pointer moves, clicks, drags and
scrolls, typing, key presses and hot-keys, screen size, pointer position and
screenshots. Calls take pyautogui's argument names; timing arguments
(``duration``, ``interval``, ``tween``) are honoured where xdotool can,
otherwise ignored. Image search (``locateOnScreen`` ...) is not available.
"""

from __future__ import annotations

import subprocess
import time
from collections import namedtuple
from typing import Any, Iterable

Point = namedtuple("Point", "x y")
Size = namedtuple("Size", "width height")
FAILSAFE = False
PAUSE = 0.0
MINIMUM_DURATION = 0.1

_BUTTONS = {"left": 1, "middle": 2, "right": 3, "primary": 1, "secondary": 3, 1: 1, 2: 2, 3: 3}
_KEYS = {
    "enter": "Return", "return": "Return", "\n": "Return", "\r": "Return", "esc": "Escape",
    "escape": "Escape", "tab": "Tab", "\t": "Tab", "backspace": "BackSpace", "delete": "Delete",
    "del": "Delete", "space": "space", " ": "space", "up": "Up", "down": "Down", "left": "Left",
    "right": "Right", "home": "Home", "end": "End", "pageup": "Prior", "pgup": "Prior",
    "pagedown": "Next", "pgdn": "Next", "insert": "Insert", "ctrl": "ctrl", "ctrlleft": "Control_L",
    "ctrlright": "Control_R", "control": "ctrl", "shift": "shift", "shiftleft": "Shift_L",
    "shiftright": "Shift_R", "alt": "alt", "altleft": "Alt_L", "altright": "Alt_R", "option": "alt",
    "win": "super", "winleft": "Super_L", "winright": "Super_R", "super": "super", "command": "super",
    "cmd": "super", "meta": "super", "capslock": "Caps_Lock", "numlock": "Num_Lock",
    "scrolllock": "Scroll_Lock", "printscreen": "Print", "prtsc": "Print", "prntscrn": "Print",
    "pause": "Pause", "menu": "Menu", "apps": "Menu", "volumeup": "XF86AudioRaiseVolume",
    "volumedown": "XF86AudioLowerVolume", "volumemute": "XF86AudioMute",
    "!": "exclam", '"': "quotedbl", "#": "numbersign", "$": "dollar", "%": "percent",
    "&": "ampersand", "'": "apostrophe", "(": "parenleft", ")": "parenright", "*": "asterisk",
    "+": "plus", ",": "comma", "-": "minus", ".": "period", "/": "slash", ":": "colon",
    ";": "semicolon", "<": "less", "=": "equal", ">": "greater", "?": "question", "@": "at",
    "[": "bracketleft", "\\": "backslash", "]": "bracketright", "^": "asciicircum",
    "_": "underscore", "`": "grave", "{": "braceleft", "|": "bar", "}": "braceright",
    "~": "asciitilde",
}
KEYBOARD_KEYS = sorted(_KEYS) + [chr(c) for c in range(ord("a"), ord("z") + 1)] + \
    [str(d) for d in range(10)] + [f"f{i}" for i in range(1, 25)]


def _xdo(*args: Any) -> str:
    out = subprocess.run(["xdotool", *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"xdotool {' '.join(map(str, args))}: {out.stderr.strip()}")
    return out.stdout


def _key(name: str) -> str:
    """X keysym of a pyautogui key name."""
    if name in _KEYS:
        return _KEYS[name]
    low = name.lower()
    if low in _KEYS:
        return _KEYS[low]
    if len(low) in (2, 3) and low[0] == "f" and low[1:].isdigit():
        return low.upper()
    return name


def _button(button: Any) -> int:
    try:
        return _BUTTONS[button]
    except KeyError:
        raise ValueError(f"unknown mouse button {button!r}") from None


def _xy(x: Any, y: Any) -> tuple[int, int] | None:
    if isinstance(x, (tuple, list)):
        x, y = x[0], x[1]
    if x is None and y is None:
        return None
    cur = position()
    return int(round(cur.x if x is None else x)), int(round(cur.y if y is None else y))


def _pause() -> None:
    if PAUSE:
        time.sleep(PAUSE)


def size() -> Size:
    """The screen's size."""
    w, h = _xdo("getdisplaygeometry").split()
    return Size(int(w), int(h))


def position() -> Point:
    """Where the pointer is."""
    vals = dict(p.split("=", 1) for p in _xdo("getmouselocation", "--shell").split() if "=" in p)
    return Point(int(vals["X"]), int(vals["Y"]))


def onScreen(x: Any, y: Any = None) -> bool:  # noqa: N802
    """Whether a point lies on the screen."""
    if isinstance(x, (tuple, list)):
        x, y = x
    w, h = size()
    return 0 <= x < w and 0 <= y < h


def moveTo(x: Any = None, y: Any = None, duration: float = 0.0, *_: Any, **__: Any) -> None:  # noqa: N802
    """Moves the pointer to (x, y)."""
    to = _xy(x, y)
    if to is not None:
        if duration and duration >= MINIMUM_DURATION:
            time.sleep(duration)
        _xdo("mousemove", *to)
    _pause()


def moveRel(xOffset: float = 0, yOffset: float = 0, duration: float = 0.0, *_: Any, **__: Any) -> None:  # noqa: N802,N803
    """Moves the pointer by an offset."""
    cur = position()
    moveTo(cur.x + (xOffset or 0), cur.y + (yOffset or 0), duration)


move = moveRel


def click(x: Any = None, y: Any = None, clicks: int = 1, interval: float = 0.0, button: Any = "left",
          duration: float = 0.0, *_: Any, **__: Any) -> None:
    """Clicks ``clicks`` times at (x, y) (default: where the pointer is)."""
    to = _xy(x, y)
    if to is not None:
        _xdo("mousemove", *to)
    if clicks > 0:
        _xdo("click", "--repeat", int(clicks), "--delay", int(max(interval, 0.03) * 1000), _button(button))
    _pause()


def leftClick(x: Any = None, y: Any = None, *args: Any, **kw: Any) -> None:  # noqa: N802
    click(x, y, 1, 0.0, "left")


def rightClick(x: Any = None, y: Any = None, *args: Any, **kw: Any) -> None:  # noqa: N802
    click(x, y, 1, 0.0, "right")


def middleClick(x: Any = None, y: Any = None, *args: Any, **kw: Any) -> None:  # noqa: N802
    click(x, y, 1, 0.0, "middle")


def doubleClick(x: Any = None, y: Any = None, interval: float = 0.0, button: Any = "left", *a: Any, **k: Any) -> None:  # noqa: N802
    click(x, y, 2, interval, button)


def tripleClick(x: Any = None, y: Any = None, interval: float = 0.0, button: Any = "left", *a: Any, **k: Any) -> None:  # noqa: N802
    click(x, y, 3, interval, button)


def mouseDown(x: Any = None, y: Any = None, button: Any = "left", *_: Any, **__: Any) -> None:  # noqa: N802
    """Presses a mouse button (at (x, y) if given)."""
    to = _xy(x, y)
    if to is not None:
        _xdo("mousemove", *to)
    _xdo("mousedown", _button(button))
    _pause()


def mouseUp(x: Any = None, y: Any = None, button: Any = "left", *_: Any, **__: Any) -> None:  # noqa: N802
    """Releases a mouse button (at (x, y) if given)."""
    to = _xy(x, y)
    if to is not None:
        _xdo("mousemove", *to)
    _xdo("mouseup", _button(button))
    _pause()


def dragTo(x: Any = None, y: Any = None, duration: float = 0.0, button: Any = "left", *_: Any, **__: Any) -> None:  # noqa: N802
    """Holds ``button`` and moves the pointer to (x, y), in a few steps so pages see the drag."""
    to = _xy(x, y)
    if to is None:
        return
    start = position()
    _xdo("mousedown", _button(button))
    steps = 8
    for i in range(1, steps + 1):
        _xdo("mousemove", start.x + (to[0] - start.x) * i // steps,
             start.y + (to[1] - start.y) * i // steps)
        time.sleep(max(duration, 0.08) / steps)
    _xdo("mouseup", _button(button))
    _pause()


def dragRel(xOffset: float = 0, yOffset: float = 0, duration: float = 0.0, button: Any = "left", *a: Any, **k: Any) -> None:  # noqa: N802,N803
    cur = position()
    dragTo(cur.x + xOffset, cur.y + yOffset, duration, button)


drag = dragRel


def _wheel(clicks: float, x: Any, y: Any, positive: int, negative: int) -> None:
    """Moves to (x, y) when given, then clicks wheel button ``positive`` or ``negative`` |clicks| times."""
    to = _xy(x, y)
    if to is not None:
        _xdo("mousemove", *to)
    n = int(clicks)
    if n:
        _xdo("click", "--repeat", abs(n), "--delay", 20, positive if n > 0 else negative)
    _pause()


def scroll(clicks: float, x: Any = None, y: Any = None, *_: Any, **__: Any) -> None:
    """Scrolls ``clicks`` notches: positive up, negative down."""
    _wheel(clicks, x, y, 4, 5)


vscroll = scroll


def hscroll(clicks: float, x: Any = None, y: Any = None, *_: Any, **__: Any) -> None:
    """Scrolls sideways: positive right, negative left."""
    _wheel(clicks, x, y, 7, 6)


def typewrite(message: str | Iterable[str], interval: float = 0.0, *_: Any, **__: Any) -> None:
    """Types text (a list is pressed key by key, as pyautogui does)."""
    if isinstance(message, str):
        if message:
            _xdo("type", "--delay", int(max(interval, 0.005) * 1000), "--", message)
    else:
        for key in message:
            press(key)
            if interval:
                time.sleep(interval)
    _pause()


write = typewrite


def press(keys: str | Iterable[str], presses: int = 1, interval: float = 0.0, *_: Any, **__: Any) -> None:
    """Presses and releases keys, ``presses`` times."""
    names = [keys] if isinstance(keys, str) else list(keys)
    for _ in range(max(int(presses), 1)):
        for name in names:
            _xdo("key", "--clearmodifiers", _key(name))
            if interval:
                time.sleep(interval)
    _pause()


def keyDown(key: str, *_: Any, **__: Any) -> None:  # noqa: N802
    _xdo("keydown", _key(key))
    _pause()


def keyUp(key: str, *_: Any, **__: Any) -> None:  # noqa: N802
    _xdo("keyup", _key(key))
    _pause()


def hotkey(*keys: Any, **_: Any) -> None:
    """Presses keys together (``hotkey('ctrl', 'c')``; a single list works too)."""
    if len(keys) == 1 and isinstance(keys[0], (list, tuple)):
        keys = tuple(keys[0])
    _xdo("key", "--clearmodifiers", "+".join(_key(k) for k in keys))
    _pause()


def screenshot(imageFilename: str | None = None, region: tuple[int, int, int, int] | None = None) -> Any:  # noqa: N803
    """The screen as a PIL image (saved to ``imageFilename`` when given)."""
    from PIL import ImageGrab
    img = ImageGrab.grab()
    if region is not None:
        x, y, w, h = region
        img = img.crop((x, y, x + w, y + h))
    if imageFilename:
        img.save(imageFilename)
    return img


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def _unavailable(*_: Any, **__: Any) -> None:
    raise NotImplementedError("image search is not available in this desktop's pyautogui")


locateOnScreen = locateCenterOnScreen = locateAllOnScreen = locate = _unavailable  # noqa: N816
