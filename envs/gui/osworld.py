"""OSWorld tasks on the desktop container: the task loader, the setup steps and the evaluator.

* :func:`load_tasks` reads OSWorld task JSON (a directory of
  ``examples/<domain>/<id>.json``, a ``test_all.json`` index or one file).
  Each task carries :func:`unsupported` reasons: what the desktop container
  cannot honour (a Windows task, an application it lacks, a download with no
  network, root, an unknown setup step, getter or metric). A file that is not
  a well-formed task (:func:`malformed`: bad JSON, a dict ``config``, a string
  step, no ``evaluator``...) is loaded as a task skipped with
  ``"malformed task: <why>"`` and its path, so one bad file never hides the
  rest of a directory. Such tasks are *skipped with the reason*, never graded.
  :func:`support_report` counts them.
* :func:`run_config` performs a task's ``config`` (and an evaluator's
  ``postconfig``) steps, through the desktop's controller (:mod:`envs.gui.desktop`).
* :func:`evaluate` grades a task with OSWorld's getters and metrics (:mod:`envs.gui.metrics`).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlparse

from nextstate.envs.base import Task, TaskUnsupported
from nextstate.envs.gui.desktop import DesktopClient, DesktopError, wait_for_browser
from nextstate.envs.gui.metrics import GETTERS, METRICS, NETWORK_GETTERS, Ctx

# Applications of OSWorld's Ubuntu image that the desktop container does not have.
MISSING_APPS = {"gimp", "libreoffice_calc", "libreoffice_impress", "libreoffice_writer", "vlc",
                "vs_code", "vscode", "thunderbird"}
# Programs OSWorld tasks call that the desktop container lacks (GNOME, audio, office, root).
MISSING_PROGRAMS = {
    "sudo": "needs root (sudo)", "su": "needs root (su)", "apt": "needs root and network (apt)",
    "apt-get": "needs root and network (apt-get)", "snap": "needs snap", "gsettings": "needs GNOME (gsettings)",
    "dconf": "needs GNOME (dconf)", "gnome-terminal": "needs GNOME (gnome-terminal)",
    "gnome-control-center": "needs GNOME", "nautilus": "needs app: nautilus",
    "timedatectl": "needs systemd (timedatectl)", "systemctl": "needs systemd",
    "pactl": "needs audio (pactl)", "pulseaudio": "needs audio (pulseaudio)",
    "libreoffice": "needs app: libreoffice", "soffice": "needs app: libreoffice",
    "gimp": "needs app: gimp", "vlc": "needs app: vlc", "code": "needs app: vs_code",
    "thunderbird": "needs app: thunderbird", "xdg-open": "needs xdg-open", "xclip": "needs xclip",
}
CONFIG_STEPS = {"launch", "open", "execute", "command", "sleep", "activate_window", "close_window",
                "chrome_open_tabs", "chrome_close_tabs"}
NETWORK_STEPS = {"download": "needs network (download)", "googledrive": "needs network (Google Drive)",
                 "login": "needs network (login)"}
LOCAL_HOSTS = {"localhost", "127.0.0.1", ""}
WINDOWS = "unsupported: Windows task"
# A drive-letter path (C:\\Users\\...) or a Windows environment variable anywhere in a task.
_WINDOWS_PATH = re.compile(r"(?i)(?<![\w/])[a-z]:\\|%(?:userprofile|appdata|localappdata|programfiles|"
                           r"systemroot|windir|homepath)%")
_WINDOWS_PROGRAMS = {"cmd", "powershell", "pwsh", "explorer", "taskkill", "reg", "msiexec"}
# ``related_apps`` only Windows has (OSWorld's Windows examples name Microsoft Office and Windows' own apps).
_WINDOWS_APPS = {"excel", "powerpoint", "word", "outlook", "onenote", "microsoft_paint", "mspaint", "notepad",
                 "windows_calc", "file_explorer", "microsoft_edge", "edge"}
_INSTALLS = re.compile(r"(?i)\binstall(?:ed|ing|s)?\b")


# ---- loading ---------------------------------------------------------------------------


def load_tasks(source: str | Path) -> list[Task]:
    """OSWorld tasks from a directory, a ``test_all.json``-style index or one task file.

    A directory is read through its ``test_all.json`` when it has one, else
    every ``examples/<domain>/*.json`` (or ``<domain>/*.json``) below it.
    A task's id is its file name without ``.json`` (as in OSWorld's index). Each
    :class:`~envs.base.Task` has ``category`` = domain and ``data`` =
    ``{"osworld": <the JSON>, "domain", "path", "skip": <reason or None>}``.
    """
    path = Path(source)
    if path.is_dir():
        index = path / "test_all.json"
        if index.is_file():
            return load_tasks(index)
        base = path / "examples" if (path / "examples").is_dir() else path
        files = [(f.parent.name, f) for f in sorted(base.glob("*/*.json"))]
        files += [("", f) for f in sorted(base.glob("*.json"))]
    elif path.is_file():
        doc = json.loads(path.read_text())
        if _is_index(doc):
            root = path.parent / "examples" if (path.parent / "examples").is_dir() else path.parent
            files = [(domain, root / domain / f"{tid}.json") for domain, ids in doc.items() for tid in ids]
        else:
            files = [(path.parent.name, path)]
    else:
        raise FileNotFoundError(f"no OSWorld tasks at {path}")
    tasks, seen = [], set()
    for domain, file in files:
        tid = file.stem if file.stem not in seen else f"{domain}/{file.stem}"  # OSWorld names tasks by file
        seen.add(tid)
        try:
            doc: Any = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError) as e:
            doc, problem = None, f"cannot read the file ({type(e).__name__}: {e.strerror or e})"
        except ValueError as e:
            doc, problem = None, f"not valid JSON ({e})"
        else:
            problem = malformed(doc)
        if problem:
            reasons = [f"malformed task: {problem}"]
        else:
            reasons = [WINDOWS] if is_windows(doc) else unsupported(doc)
        ok = problem is None
        instruction = doc.get("instruction") if isinstance(doc, dict) else None
        tasks.append(Task(id=tid, instruction=instruction if isinstance(instruction, str) else "",
                          category=domain or (ok and doc.get("snapshot")) or "osworld",
                          data={"osworld": doc if ok else {}, "domain": domain, "path": str(file),
                                "skip": reasons[0] if reasons else None, "reasons": reasons}))
    return tasks


def _is_index(doc: Any) -> bool:
    return isinstance(doc, dict) and bool(doc) and all(
        isinstance(v, list) and all(isinstance(i, str) for i in v) for v in doc.values())


# ---- what the desktop container can honour ---------------------------------------------


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}")


def _steps_problem(steps: Any, where: str) -> str | None:
    if steps is None:
        return None
    if not isinstance(steps, list):
        return f"{where} is {_kind(steps)}, not a list of steps"
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("type"), str):
            return f"{where}[{i}] is {_kind(step)}, not a step object with a \"type\""
        if not isinstance(step.get("parameters", {}), dict):
            return f"{where}[{i}].parameters is {_kind(step['parameters'])}, not an object"
    return None


def malformed(doc: Any) -> str | None:
    """Why ``doc`` is not a well-formed OSWorld task (None when it is): the shape OSWorld's
    ``DesktopEnv`` reads -- an instruction, ``config`` a list of step objects, an ``evaluator``
    object whose ``func`` is a metric name (or a list, with ``result``/``expected`` lists of
    the same length) and whose getters are objects with a ``type``."""
    if not isinstance(doc, dict):
        return f"the file holds {_kind(doc)}, not a task object"
    if not isinstance(doc.get("instruction"), str) or not doc["instruction"].strip():
        return "no instruction (a non-empty string)"
    problem = _steps_problem(doc.get("config"), "config")
    if problem:
        return problem
    if "evaluator" not in doc:
        return "no evaluator"
    ev = doc["evaluator"]
    if not isinstance(ev, dict):
        return f"evaluator is {_kind(ev)}, not an object"
    func = ev.get("func")
    funcs = func if isinstance(func, list) else [func]
    if not funcs or not all(isinstance(f, str) and f for f in funcs):
        return f"evaluator.func is {_kind(func)}, not a metric name or a list of them"
    if funcs != ["infeasible"] and ev.get("result") is None:
        return "evaluator has no result getter"
    for key in ("result", "expected"):
        spec = ev.get(key)
        if spec is None:
            continue
        if isinstance(spec, list) != isinstance(func, list):
            return f"evaluator.{key} is {_kind(spec)}, but func is {_kind(func)}"
        if isinstance(spec, list) and len(spec) != len(funcs):
            return f"evaluator.{key} has {len(spec)} entries for {len(funcs)} metrics"
        for one in spec if isinstance(spec, list) else [spec]:
            if one is not None and not (isinstance(one, dict) and isinstance(one.get("type"), str)):
                return f"evaluator.{key} holds {_kind(one)}, not a getter object with a \"type\""
    options = ev.get("options")
    if options is not None and not isinstance(options, (dict, list)):
        return f"evaluator.options is {_kind(options)}, not an object"
    if ev.get("conj", "and") not in ("and", "or"):
        return f"evaluator.conj is {ev.get('conj')!r}, not \"and\" or \"or\""
    return _steps_problem(ev.get("postconfig"), "evaluator.postconfig")


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def is_windows(task: dict[str, Any]) -> bool:
    """Whether a (well-formed) task is one of OSWorld's Windows examples: its related apps are Windows
    apps (Excel, PowerPoint, Word...), or its setup or grading uses drive-letter paths or Windows
    variables, or starts ``cmd``/``powershell``/``*.exe``."""
    apps = {re.sub(r"[\s-]+", "_", str(a).strip().lower()) for a in task.get("related_apps") or []}
    if apps & _WINDOWS_APPS:
        return True
    body = {k: task.get(k) for k in ("config", "evaluator")}
    if any(_WINDOWS_PATH.search(s) for s in _strings(body)):
        return True
    ev = task.get("evaluator") or {}
    specs = [s for key in ("result", "expected") for s in (ev.get(key) if isinstance(ev.get(key), list)
                                                           else [ev.get(key)]) if isinstance(s, dict)]
    commands = [(st.get("parameters") or {}).get("command") for st in
                list(task.get("config") or []) + list(ev.get("postconfig") or [])] + \
               [s.get("command") for s in specs]
    return any(name.lower().removesuffix(".exe") in _WINDOWS_PROGRAMS or name.lower().endswith(".exe")
               for c in commands if c for name in program_names(c))


def unsupported(task: dict[str, Any]) -> list[str]:
    """Why this desktop cannot run an OSWorld task (empty: it can). The first reason is the main one."""
    reasons: list[str] = []
    add = lambda r: reasons.append(r) if r not in reasons else None  # noqa: E731
    for app in task.get("related_apps") or []:
        if app in MISSING_APPS:
            add(f"needs app: {'vs_code' if app == 'vscode' else app}")
    ev = task.get("evaluator") or {}
    if ev.get("func") != "infeasible" and _INSTALLS.search(task.get("instruction") or ""):
        add("needs root and network (installs software)")  # no apt, no sudo, no network here
    for step in list(task.get("config") or []) + list(ev.get("postconfig") or []):
        for r in _step_problems(step):
            add(r)
    funcs = ev.get("func")
    for func in funcs if isinstance(funcs, list) else [funcs]:
        if func not in METRICS:
            add(f"unsupported metric: {func}")
    for key in ("result", "expected"):
        specs = ev.get(key)
        for spec in specs if isinstance(specs, list) else [specs]:
            if not spec:
                continue
            kind = spec.get("type")
            if kind in NETWORK_GETTERS:
                add(f"needs network (getter {kind})")
            elif kind not in GETTERS:
                add(f"unsupported getter: {kind}")
            elif kind in ("vm_command_line", "vm_command_error"):
                for r in _command_problems(spec.get("command")):
                    add(r)
    return reasons


def _step_problems(step: dict[str, Any]) -> list[str]:
    kind, params = step.get("type"), step.get("parameters") or {}
    if kind in NETWORK_STEPS:
        return [NETWORK_STEPS[kind]]
    if kind not in CONFIG_STEPS:
        return [f"unsupported setup step: {kind}"]
    if kind in ("launch", "execute", "command"):
        return _command_problems(params.get("command"))
    if kind == "chrome_open_tabs":
        remote = [u for u in params.get("urls_to_open") or [] if not is_local_url(u)]
        return ["needs network (opens web sites)"] if remote else []
    if kind == "open" and not str(params.get("path", "")).lower().endswith((".html", ".htm")):
        return [f"needs an application to open {Path(str(params.get('path'))).name}"]
    return []


def is_local_url(url: str) -> bool:
    """Whether a URL needs no network (file:, about:, chrome:, data:, localhost)."""
    parts = urlparse(url if "://" in url or url.startswith(("about:", "data:")) else "http://" + url)
    return parts.scheme in ("file", "about", "chrome", "data") or parts.hostname in LOCAL_HOSTS


_PREFIXES = {"export", "exec", "time", "timeout", "nohup", "env", "nice", "then", "do", "else", "if",
             "while", "!"}


def program_names(command: Any) -> list[str]:
    """The programs a command (argv list or shell text) starts, as far as simple parsing tells."""
    if isinstance(command, list):
        return [Path(str(command[0])).name] if command else []
    names = []
    for part in re.split(r"\|\||&&|[;|&\n(`]|\$\(", str(command or "")):
        words = part.strip().split()
        while words and (re.match(r"^\w+=", words[0]) or words[0] in _PREFIXES or
                         re.fullmatch(r"[\d.]+[smh]?|-\w+", words[0])):
            words = words[1:]
        if words:
            names.append(Path(words[0]).name)
    return names


def _command_problems(command: Any) -> list[str]:
    reasons = [MISSING_PROGRAMS[p] for p in program_names(command) if p in MISSING_PROGRAMS]
    if "{CLIENT_PASSWORD}" in json.dumps(command) and "needs root (sudo)" not in reasons:
        reasons.append("needs root (sudo)")
    return reasons


def support_report(tasks: Iterable[Task]) -> dict[str, Any]:
    """How many tasks are runnable and how many are skipped, by reason and by domain."""
    tasks = list(tasks)
    by_reason: collections.Counter[str] = collections.Counter()
    domains: dict[str, dict[str, int]] = {}
    skipped = []
    for t in tasks:
        reason = t.data.get("skip")
        d = domains.setdefault(t.category, {"total": 0, "runnable": 0, "skipped": 0})
        d["total"] += 1
        d["skipped" if reason else "runnable"] += 1
        if reason:
            by_reason[reason] += 1
            skipped.append({"id": t.id, "domain": t.category, "reason": reason, "path": t.data.get("path")})
    return {"total": len(tasks), "runnable": sum(d["runnable"] for d in domains.values()),
            "skipped": len(skipped), "by_reason": dict(by_reason.most_common()),
            "by_domain": dict(sorted(domains.items())), "skipped_tasks": skipped,
            "runnable_tasks": [t.id for t in tasks if not t.data.get("skip")]}


# ---- setup steps -------------------------------------------------------------------------


def substitute(value: Any, width: int, height: int) -> Any:
    """OSWorld's placeholders ({SCREEN_WIDTH_HALF} ...) filled in, recursively."""
    if isinstance(value, str):
        for key, val in {"{SCREEN_WIDTH}": width, "{SCREEN_HEIGHT}": height,
                         "{SCREEN_WIDTH_HALF}": width // 2, "{SCREEN_HEIGHT_HALF}": height // 2}.items():
            value = value.replace(key, str(val))
        return value
    if isinstance(value, list):
        return [substitute(v, width, height) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, width, height) for k, v in value.items()}
    return value


def _adapt(command: Any) -> Any:
    """OSWorld's Chrome commands for this desktop: Debian's Chromium runs as ``chromium``, and the
    CDP forwarder (socat) must rebind its port while old connections linger (a reused desktop)."""
    if isinstance(command, list) and command[:1] == ["socat"]:
        return [re.sub(r"^(tcp-listen:\d+)(?!.*reuseaddr)", r"\1,reuseaddr", str(a)) for a in command]
    if isinstance(command, list) and command[:1] == ["pkill"] and any("chrome" in str(a) for a in command[1:]):
        return ["pkill", "-x", "chromium"]
    if isinstance(command, str) and re.search(r"\bpkill\b.*\bchrome\b", command):
        return re.sub(r"\bchrome\b", "chromium", command)
    return command


def run_config(client: DesktopClient, steps: list[dict[str, Any]], size: tuple[int, int]) -> list[str]:
    """Performs OSWorld setup steps in order; returns notes on steps that did not fully succeed.

    Raises :class:`TaskUnsupported` for a step this desktop cannot perform.
    """
    notes, browser = [], False
    for step in steps or []:
        problems = _step_problems(step)
        if problems:
            raise TaskUnsupported(problems[0])
        kind = step["type"]
        p = substitute(step.get("parameters") or {}, *size)
        if kind == "launch":
            command = _adapt(p["command"])
            if command == ["pkill", "-x", "chromium"]:
                client.execute("pkill -x chromium; for i in $(seq 50); do pgrep -x chromium >/dev/null || exit 0; "
                               "sleep 0.1; done", shell=True, timeout=10)
            else:
                browser = browser or any(b in json.dumps(command) for b in ("google-chrome", "chromium"))
                try:
                    client.launch(command, bool(p.get("shell")))
                except DesktopError as e:
                    if "program not found" in str(e):
                        raise TaskUnsupported(f"needs program {command[0]} (not in the desktop image)") from e
                    raise
        elif kind in ("execute", "command"):
            r = client.execute(_adapt(p["command"]), bool(p.get("shell")))
            if r.get("returncode"):
                notes.append(f"{kind} {p['command']!r:.80} exited {r.get('returncode')}: {r.get('error', '')[:200]}")
        elif kind == "open":
            client.open_file(p["path"])
        elif kind == "sleep":
            time.sleep(float(p.get("seconds", 1)))
        elif kind in ("activate_window", "close_window"):
            if not client.window(kind.split("_")[0], p["window_name"], bool(p.get("strict")),
                                 bool(p.get("by_class"))):
                notes.append(f"{kind}: no window {p['window_name']!r}")
        elif kind == "chrome_open_tabs":
            client.open_tabs(list(p["urls_to_open"]))
        elif kind == "chrome_close_tabs":
            client.close_tabs(list(p["urls_to_close"]))
    if browser:
        wait_for_browser(client)
    return notes


# ---- the evaluator -----------------------------------------------------------------------


def evaluate(task: dict[str, Any], client: DesktopClient, size: tuple[int, int],
             last_action: str | None) -> tuple[float, dict[str, Any]]:
    """The task's score in [0, 1] and what it was computed from.

    ``last_action`` is the agent's final action kind (``"FAIL"``, ``"DONE"``,
    ...): an infeasible task scores 1 exactly when the agent gave up with
    FAIL, and a feasible one scores 0 when it did.
    """
    ev = task["evaluator"]
    funcs = ev["func"] if isinstance(ev["func"], list) else [ev["func"]]
    if funcs == ["infeasible"]:
        return float(last_action == "FAIL"), {"metric": "infeasible", "last_action": last_action}
    if last_action == "FAIL":
        return 0.0, {"reason": "the agent declared a feasible task infeasible (FAIL)"}
    notes = run_config(client, ev.get("postconfig") or [], size)
    as_list = lambda v: v if isinstance(v, list) else [v] * len(funcs)  # noqa: E731
    results, expecteds = as_list(ev.get("result")), as_list(ev.get("expected"))
    options = as_list(ev.get("options") or {})
    conj = ev.get("conj", "and")
    scores, details = [], []
    with tempfile.TemporaryDirectory(prefix="nextstate-osworld-") as tmp:
        ctx = Ctx(client, Path(tmp))
        for func, res_cfg, exp_cfg, opts in zip(funcs, results, expecteds, options):
            result = GETTERS[res_cfg["type"]](ctx, res_cfg) if res_cfg else None
            args = [result]
            if exp_cfg:
                args.append(GETTERS[exp_cfg["type"]](ctx, exp_cfg))
            score = float(METRICS[func](*args, **(opts or {})))
            scores.append(score)
            details.append({"metric": func, "result": _short(result), "score": score})
            if (conj == "and" and score == 0) or (conj == "or" and score == 1):
                break
    if conj == "or":
        total = max(scores)
    else:
        total = 0.0 if len(scores) < len(funcs) or 0 in scores else sum(scores) / len(scores)
    return total, {"metrics": details, "conj": conj, "postconfig_notes": notes}


def _short(value: Any) -> Any:
    text = json.dumps(value, default=str)
    return value if len(text) <= 300 else text[:300] + "..."


def main(argv: list[str] | None = None) -> int:
    """``python -m envs.gui.osworld report DIR|INDEX [--json]``: which tasks this desktop can run."""
    ap = argparse.ArgumentParser(prog="python -m envs.gui.osworld", description=main.__doc__)
    ap.add_argument("command", choices=["report"])
    ap.add_argument("source", help="an OSWorld directory, a test_all.json index or a task file")
    ap.add_argument("--json", action="store_true", help="print the whole report as JSON")
    args = ap.parse_args(argv)
    report = support_report(load_tasks(args.source))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['total']} tasks: {report['runnable']} runnable, {report['skipped']} skipped")
    for domain, d in report["by_domain"].items():
        print(f"  {domain:20s} {d['runnable']:4d} runnable {d['skipped']:4d} skipped")
    print("skipped by reason:")
    for reason, n in report["by_reason"].items():
        print(f"  {n:4d}  {reason}")
    bad = [s for s in report["skipped_tasks"] if s["reason"].startswith("malformed task")]
    if bad:
        print("malformed task files (loaded as skipped):")
        for s in bad:
            print(f"  {s['path']}: {s['reason'].removeprefix('malformed task: ')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
