"""Grading OSWorld tasks on the desktop container: the evaluator's getters and metrics.

An OSWorld evaluator names a metric (``func``) and getters for the ``result``
(the state the agent left) and the ``expected`` value; several of each are
combined with ``conj`` ("and": every metric must pass, "or": one suffices).
:func:`evaluate` runs ``postconfig``, the getters and the metrics, with the
semantics of OSWorld's own evaluator, over a :class:`~envs.osworld.DesktopClient`.

Only what this desktop can honour is here (see :data:`GETTERS` and
:data:`METRICS`); :func:`envs.osworld.unsupported` marks every other task
skipped. Chrome getters read the profile files (``Preferences``, ``Local
State``, ``Bookmarks``) in ``~/.config/google-chrome`` and the open tabs over
CDP: the active tab is the one whose page is visible (OSWorld reads the
address bar from the accessibility tree; the URL is the same).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

from envs.osworld import HOME, DesktopClient, run_config

PROFILE = f"{HOME}/.config/google-chrome"
# Getters whose value lives on the internet: tasks using them are skipped.
NETWORK_GETTERS = {"cloud_file", "cache_file", "googledrive_file", "pdf_from_url", "info_from_website",
                   "page_info", "gotoRecreationPage_and_get_html_content", "active_tab_html_parse",
                   "active_tab_url_parse", "url_dashPart", "url_path_parse", "rule_relativeTime"}


class Ctx:
    """What getters need: the client and a scratch directory for the files they fetch."""

    def __init__(self, client: DesktopClient, cache: Path):
        self.client, self.cache = client, cache


# ---- getters ---------------------------------------------------------------------------


def _json_file(ctx: Ctx, path: str) -> Any:
    raw = ctx.client.get_file(path)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _prefs(ctx: Ctx) -> dict[str, Any]:
    return _json_file(ctx, f"{PROFILE}/Default/Preferences") or {}


def get_vm_file(ctx: Ctx, cfg: dict[str, Any]) -> Any:
    """Copies files out of the desktop; the local path (None when missing), or a list with ``multi``."""
    paths, dests = cfg["path"], cfg["dest"]
    if not cfg.get("multi"):
        paths, dests = [paths], [dests]
    out = []
    for path, dest in zip(paths, dests):
        data = ctx.client.get_file(path)
        if data is None:
            out.append(None)
            continue
        local = ctx.cache / Path(dest).name
        local.write_bytes(data)
        out.append(str(local))
    if not cfg.get("multi"):
        return out[0]
    gives = cfg.get("gives")
    return [out[i] for i in gives] if gives else out


def get_vm_command_line(ctx: Ctx, cfg: dict[str, Any]) -> str:
    return ctx.client.execute(cfg["command"], bool(cfg.get("shell")))["output"]


def get_vm_command_error(ctx: Ctx, cfg: dict[str, Any]) -> str:
    return ctx.client.execute(cfg["command"], bool(cfg.get("shell")))["error"]


def get_open_tabs_info(ctx: Ctx, cfg: dict[str, Any]) -> list[dict[str, str]]:
    return [{"title": t["title"], "url": t["url"]} for t in ctx.client.tabs()]


def _active_tab(ctx: Ctx) -> dict[str, Any] | None:
    return next((t for t in ctx.client.tabs() if t["active"]), None)


def get_active_tab_info(ctx: Ctx, cfg: dict[str, Any]) -> dict[str, str] | None:
    tab = _active_tab(ctx)
    if tab is None:
        return None
    content = ctx.client.eval_js("document.documentElement.innerText")
    return {"title": tab["title"], "url": tab["url"], "content": content}


def get_active_url_from_accessTree(ctx: Ctx, cfg: dict[str, Any]) -> str | None:  # noqa: N802
    tab = _active_tab(ctx)
    if tab is None:
        return None
    url = tab["url"]
    return url if "://" in url or ":" in url.split("/")[0] else cfg.get("goto_prefix", "https://") + url


def get_enable_do_not_track(ctx: Ctx, cfg: dict[str, Any]) -> str:
    return "true" if _prefs(ctx).get("enable_do_not_track") else "false"


def get_enable_safe_browsing(ctx: Ctx, cfg: dict[str, Any]) -> str:
    return "true" if _prefs(ctx).get("safebrowsing", {}).get("enabled") else "false"


def get_enable_enhanced_safety_browsing(ctx: Ctx, cfg: dict[str, Any]) -> str:
    return "true" if _prefs(ctx).get("safebrowsing", {}).get("enhanced") else "false"


def get_new_startup_page(ctx: Ctx, cfg: dict[str, Any]) -> str:
    prefs = _prefs(ctx)
    if "session" not in prefs:
        return "true"
    return "true" if prefs["session"].get("restore_on_startup") == 5 else "false"


def get_data_delete_automacally(ctx: Ctx, cfg: dict[str, Any]) -> str:
    """Whether site data is deleted when Chrome closes (cookies "session only", content setting 4).

    Stricter than OSWorld's getter (any content-setting entry): Chromium writes
    that section on its own, so doing nothing would pass there.
    """
    values = _prefs(ctx).get("profile", {}).get("default_content_setting_values") or {}
    return "true" if values.get("cookies") == 4 else "false"


def get_default_search_engine(ctx: Ctx, cfg: dict[str, Any]) -> str:
    return _prefs(ctx).get("default_search_provider_data", {}).get("template_url_data", {}).get("short_name", "Google")


def get_profile_name(ctx: Ctx, cfg: dict[str, Any]) -> str | None:
    return _prefs(ctx).get("profile", {}).get("name")


def get_chrome_font_size(ctx: Ctx, cfg: dict[str, Any]) -> dict[str, Any]:
    default = {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}
    return _prefs(ctx).get("webkit", {}).get("webprefs", default)


def get_bookmarks(ctx: Ctx, cfg: dict[str, Any]) -> Any:
    return (_json_file(ctx, f"{PROFILE}/Default/Bookmarks") or {}).get("roots", [])


def get_enabled_experiments(ctx: Ctx, cfg: dict[str, Any]) -> list[str]:
    return (_json_file(ctx, f"{PROFILE}/Local State") or {}).get("browser", {}).get("enabled_labs_experiments", [])


def get_list_directory(ctx: Ctx, cfg: dict[str, Any]) -> Any:
    return ctx.client.list_directory(cfg["path"])


def get_vm_screen_size(ctx: Ctx, cfg: dict[str, Any]) -> dict[str, int]:
    w, h = ctx.client.screen_size()
    return {"width": w, "height": h}


def get_rule(ctx: Ctx, cfg: dict[str, Any]) -> Any:
    return cfg["rules"]


GETTERS: dict[str, Callable[[Ctx, dict[str, Any]], Any]] = {
    name[4:]: fn for name, fn in globals().items() if name.startswith("get_") and callable(fn)}


# ---- metrics ---------------------------------------------------------------------------


def exact_match(result: Any, rules: dict[str, Any]) -> float:
    return float(result == rules["expected"])


def match_in_list(result: Any, rules: dict[str, Any]) -> float:
    return float(result in rules["expected"])


def is_in_list(result: Any, rules: dict[str, Any]) -> float:
    return float(result is not None and rules["expected"] in result)


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    if options.get("type", "str") == "list":
        return float(list(result or []) == list(expected or []))
    if options.get("ignore_case"):
        return float(str(result).lower() == str(expected).lower())
    return float(str(result) == str(expected))


def check_include_exclude(result: str, rules: dict[str, Any]) -> float:
    if result is None:
        return 0.0
    ok = all(s in result for s in rules.get("include", [])) and not any(s in result for s in rules.get("exclude", []))
    return float(ok)


def _url(value: Any) -> str | None:
    return value.get("url") if isinstance(value, dict) else value


def is_expected_url_pattern_match(result: Any, rules: dict[str, Any]) -> float:
    url = _url(result)
    if not url:
        return 0.0
    return float(all(re.search(p, url) for p in rules["expected"]))


def _norm_url(url: str, ignore_query: bool = False) -> tuple[str, str, str, str]:
    p = urlparse(url if "://" in url else "https://" + url)
    host = (p.hostname or "").removeprefix("www.")
    return host, p.path.rstrip("/"), "" if ignore_query else p.query, "" if ignore_query else p.fragment


def compare_urls(a: str, b: str, ignore_query: bool = False) -> bool:
    """Same page: scheme, ``www.`` and a trailing slash ignored."""
    if a is None or b is None:
        return False
    if a.startswith(("chrome:", "about:")) or b.startswith(("chrome:", "about:")):
        return a.rstrip("/") == b.rstrip("/")
    return _norm_url(a, ignore_query) == _norm_url(b, ignore_query)


def is_expected_active_tab(result: Any, rules: dict[str, Any]) -> float:
    if rules.get("type") != "url":
        return 0.0
    return float(compare_urls(_url(result), rules["url"]))


def is_expected_active_tab_approximate(result: Any, rules: dict[str, Any]) -> float:
    if rules.get("type") != "url":
        return 0.0
    return float(compare_urls(_url(result), rules["url"], ignore_query=True))


def is_expected_tabs(result: list[dict[str, str]], rules: dict[str, Any]) -> float:
    if rules.get("type") != "url" or result is None:
        return 0.0
    got = [t["url"] for t in result]
    want = rules["urls"]
    return float(len(got) == len(want) and all(compare_urls(a, b) for a, b in zip(got, want)))


def is_expected_bookmarks(result: Any, rules: dict[str, Any]) -> float:
    if not isinstance(result, dict):
        return 0.0
    bar = result.get("bookmark_bar", {}).get("children", [])
    if rules["type"] == "bookmark_bar_folders_names":
        return float({b["name"] for b in bar if b.get("type") == "folder"} == set(rules["names"]))
    if rules["type"] == "bookmark_bar_websites_urls":
        return float({b["url"] for b in bar if b.get("type") == "url"} == set(rules["urls"]))
    return 0.0


def check_enabled_experiments(result: list[str], rules: dict[str, Any]) -> float:
    names = {e.split("@")[0] for e in result or []}
    return float(rules.get("type") == "names" and names == set(rules["names"]))


def check_font_size(result: dict[str, Any], rules: dict[str, Any]) -> float:
    size = (result or {}).get("default_font_size")
    if size is None:
        return 0.0
    if rules["type"] == "value":
        return float(size == rules["value"])
    if rules["type"] == "range":
        return float(rules["min"] <= size < rules["max"])
    return 0.0


def compare_text_file(result: str | None, expected: str | None, **options: Any) -> float:
    if not result or not expected:
        return 0.0
    a, b = Path(result).read_text(errors="replace"), Path(expected).read_text(errors="replace")
    if options.get("ignore_blanks"):
        a, b = re.sub(r"\s+", " ", a).strip(), re.sub(r"\s+", " ", b).strip()
    if options.get("ignore_case"):
        a, b = a.lower(), b.lower()
    return float(a == b)


def file_contains(result: str | None, rules: dict[str, Any]) -> float:
    if not result:
        return 0.0
    text = Path(result).read_text(errors="replace")
    return float(all(s in text for s in rules["expected"]))


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda v, r: v == r, "ne": lambda v, r: v != r, "in": lambda v, r: v in r,
    "not_in": lambda v, r: v not in r, "contains": lambda v, r: r in v,
}


def check_json(result: str | None, rules: dict[str, Any], **options: Any) -> float:
    """Every ``expect`` rule (``key``: a path of keys, ``method``, ``ref``) holds in the JSON file."""
    if not result:
        return 0.0
    try:
        data = json.loads(Path(result).read_text())
    except ValueError:
        return 0.0
    for rule in rules.get("expect", []):
        value: Any = data
        for key in rule["key"] if isinstance(rule["key"], list) else [rule["key"]]:
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                value = None
                break
        if not _OPS[rule.get("method", "eq")](value, rule.get("ref")):
            return 0.0
    return 1.0


def check_direct_json_object(result: Any, rules: dict[str, Any]) -> float:
    """Each expected key has the expected value (strings compared stripped and case-insensitively)."""
    if not isinstance(result, dict):
        return 0.0
    norm = lambda v: v.strip().lower() if isinstance(v, str) else v  # noqa: E731
    for key, want in rules["expected"].items():
        if key not in result:
            return 0.0
        got = result[key]
        if rules.get("expect_in_result") and isinstance(got, (str, list)):
            if norm(want) not in (norm(got) if isinstance(got, str) else [norm(g) for g in got]):
                return 0.0
        elif norm(got) != norm(want):
            return 0.0
    return 1.0


def infeasible(*_: Any) -> float:
    """Graded in :func:`evaluate` from the agent's last action (FAIL = right)."""
    return 0.0


METRICS: dict[str, Callable[..., float]] = {fn.__name__: fn for fn in (
    exact_match, match_in_list, is_in_list, literal_match, check_include_exclude,
    is_expected_url_pattern_match, is_expected_active_tab, is_expected_active_tab_approximate,
    is_expected_tabs, is_expected_bookmarks, check_enabled_experiments, check_font_size,
    compare_text_file, file_contains, check_json, check_direct_json_object, infeasible)}


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
