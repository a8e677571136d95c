"""Grading OSWorld tasks on the desktop container: the evaluator's getters and metrics.

An OSWorld evaluator names a metric (``func``) and getters for the ``result``
(the state the agent left) and the ``expected`` value; several of each are
combined with ``conj`` ("and": every metric must pass, "or": one suffices).
:func:`evaluate` runs ``postconfig``, the getters and the metrics, with the
semantics of OSWorld's own evaluator, over a :class:`~envs.gui.desktop.DesktopClient`.

Only what this desktop can honour is here (see :data:`GETTERS` and
:data:`METRICS`); :func:`envs.gui.osworld.unsupported` marks every other task
skipped. Chrome getters read the profile files (``Preferences``, ``Local
State``, ``Bookmarks``) in ``~/.config/google-chrome`` and the open tabs over
CDP: the active tab is the one whose page is visible (OSWorld reads the
address bar from the accessibility tree; the URL is the same).
"""

from __future__ import annotations

import itertools
import json
import operator
import re
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse, urlunparse

from nextstate.envs.gui.desktop import HOME, DesktopClient

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
    """Title, URL and HTML (``content``) of the active tab, as OSWorld's getter (which reloads
    the page) returns them."""
    tab = _active_tab(ctx)
    if tab is None:
        return None
    content = ctx.client.eval_js("document.documentElement.outerHTML")
    return {"title": tab["title"], "url": tab["url"], "content": content}


def address_bar_text(url: str) -> str:
    """What Chrome's address bar shows for ``url`` when it is not focused: web addresses
    without ``http(s)://`` and a leading ``www.``, the bare ``/`` of a site's root dropped;
    other schemes (``chrome:``, ``file:``) in full."""
    p = urlparse(url)
    if p.scheme not in ("http", "https"):
        return url
    text = url.split("://", 1)[1].removeprefix("www.")
    return text[:-1] if p.path == "/" and not (p.query or p.fragment) and text.endswith("/") else text


def get_active_url_from_accessTree(ctx: Ctx, cfg: dict[str, Any]) -> str | None:  # noqa: N802
    """``goto_prefix`` (default ``https://``) + the address bar's text, as OSWorld reads it from
    the accessibility tree (so ``https://www.`` + ``example.com/x`` for https://www.example.com/x)."""
    tab = _active_tab(ctx)
    if tab is None:
        return None
    return cfg.get("goto_prefix", "https://") + address_bar_text(tab["url"])


def get_enable_do_not_track(ctx: Ctx, cfg: dict[str, Any]) -> str:
    return "true" if _prefs(ctx).get("enable_do_not_track") else "false"


def get_enable_safe_browsing(ctx: Ctx, cfg: dict[str, Any]) -> str:
    """"true" when standard or enhanced protection is on."""
    sb = _prefs(ctx).get("safebrowsing", {})
    return "true" if sb.get("enabled") or sb.get("enhanced") else "false"


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
    """The ``roots`` of the Bookmarks file; [] when there is no file."""
    data = _json_file(ctx, f"{PROFILE}/Default/Bookmarks")
    return [] if not data else data.get("roots", {})


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
# Each mirrors the OSWorld function of the same name (desktop_env/evaluators/metrics/:
# general.py, chrome.py, vscode.py, utils.py); tests/test_osworld_metrics.py checks the
# cases where a looser or stricter reading would change a grade.


def exact_match(result: Any, rules: dict[str, Any]) -> float:
    return float(result == rules["expected"])


def match_in_list(result: Any, rules: dict[str, Any]) -> float:
    return float(result in rules["expected"])


def is_in_list(result: Any, rules: dict[str, Any]) -> float:
    return float(result is not None and rules["expected"] in result)


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    """``type="str"`` (default): ``str()`` equality; ``type="list"``: two lists (or tuples) of
    the same length whose items are equal as strings; ``ignore_case`` for both."""
    fold = (lambda v: str(v).lower()) if options.get("ignore_case") else str  # noqa: E731
    kind = options.get("type", "str")
    if kind == "str":
        return float(fold(result) == fold(expected))
    if kind == "list":
        if not isinstance(result, (list, tuple)) or not isinstance(expected, (list, tuple)) \
                or len(result) != len(expected):
            return 0.0
        return float([fold(v) for v in result] == [fold(v) for v in expected])
    raise NotImplementedError(f"literal_match type {kind!r}")


def check_include_exclude(result: str, rules: dict[str, Any]) -> float:
    if result is None:
        return 0.0
    ok = all(s in result for s in rules.get("include", [])) and not any(s in result for s in rules.get("exclude", []))
    return float(ok)


def _url(value: Any) -> str | None:
    return value.get("url") if isinstance(value, dict) else value


def is_expected_url_pattern_match(result: Any, rules: dict[str, Any]) -> float:
    url = _url(result)
    if not url or not isinstance(url, str):
        return 0.0
    return float(all(re.search(p, url) for p in rules["expected"]))


_DOMAINS = None


def _registered_domain(netloc: str) -> tuple[str, str]:
    """(subdomain, domain) of a host, the public suffix dropped (``airbnb.com.sg`` -> airbnb)."""
    global _DOMAINS
    if _DOMAINS is None:
        import tldextract
        _DOMAINS = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)  # the bundled list: no network
    parts = _DOMAINS(netloc)
    return parts.subdomain, parts.domain


def _normalize_url(url: str, full: bool = True) -> str:
    if not re.match(r"^[a-zA-Z][a-zA-Z0-9+\-.]*://", url):
        url = "http://" + url
    p = urlparse(url)
    sub, domain = _registered_domain(p.netloc.lower())
    netloc = f"{sub}.{domain}" if sub and sub != "www" else domain
    return urlunparse((p.scheme.lower(), netloc, "" if p.path == "/" else p.path,
                       p.params if full else "", p.query if full else "", p.fragment if full else ""))


def compare_urls(a: str | None, b: str | None, full: bool = True) -> bool:
    """OSWorld's URL equality: scheme (default http) and path kept; the host compared without
    its public suffix and without a lone ``www``; a bare ``/`` path is no path; query and
    fragment kept unless ``full`` is False."""
    if a is None or b is None:
        return a == b
    return _normalize_url(a, full) == _normalize_url(b, full)


def is_expected_active_tab(result: Any, rules: dict[str, Any]) -> float:
    if not result or rules.get("type") != "url":
        return 0.0
    return float(compare_urls(rules["url"], _url(result)))


def is_expected_active_tab_approximate(result: Any, rules: dict[str, Any]) -> float:
    """The URLs equal once the query is removed (nothing else normalized)."""
    if not result or rules.get("type") != "url":
        return 0.0
    strip = lambda u: urlunparse(urlparse(u)._replace(query=""))  # noqa: E731
    actual = _url(result)
    return float(actual is not None and strip(rules["url"]) == strip(actual))


def is_expected_tabs(result: list[dict[str, str]], rules: dict[str, Any]) -> float:
    """As many tabs as expected URLs, each expected URL open in some tab (any order)."""
    if not result or rules.get("type") != "url":
        return 0.0
    got, want = [t["url"] for t in result], rules["urls"]
    return float(len(got) == len(want) and all(any(compare_urls(w, g) for g in got) for w in want))


def is_expected_bookmarks(result: Any, rules: dict[str, Any]) -> float:
    if not result or not isinstance(result, dict):
        return 0.0
    bar = result.get("bookmark_bar", {}).get("children", [])
    kind = rules["type"]
    if kind == "bookmark_bar_folders_names":
        return float({b["name"] for b in bar if b.get("type") == "folder"} == set(rules["names"]))
    if kind == "bookmark_bar_websites_urls":
        return float({b["url"] for b in bar if b.get("type") == "url"} == set(rules["urls"]))
    if kind == "liked_authors_websites_urls":
        folder = next((b for b in bar if b.get("type") == "folder" and b.get("name") == "Liked Authors"), None)
        if folder is None:
            return 0.0
        urls = {b["url"] for b in folder.get("children", []) if b.get("type") == "url"}
        choices = [[u] if isinstance(u, str) else list(u) for u in rules["urls"]]
        return float(any(set(combo) == urls for combo in itertools.product(*choices)))
    raise TypeError(f"is_expected_bookmarks: rule type {kind!r} is not supported")


def check_enabled_experiments(result: list[str], rules: dict[str, Any]) -> float:
    """The enabled flags' names, in order, are exactly ``rules["names"]``."""
    if rules.get("type") != "names":
        raise TypeError(f"check_enabled_experiments: rule type {rules.get('type')!r} is not supported")
    return float([e.split("@")[0] for e in result or []] == rules["names"])


def check_font_size(result: dict[str, Any], rules: dict[str, Any]) -> float:
    """``type="value"``: the default font size equals it; ``"range"``: strictly between min and max."""
    size = (result or {}).get("default_font_size")
    if size is None:
        return 0.0
    if rules["type"] == "value":
        return float(size == rules["value"])
    if rules["type"] == "range":
        return float(rules["min"] < size < rules["max"])
    raise TypeError(f"check_font_size: rule type {rules['type']!r} is not supported")


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
    try:
        text = Path(result).read_text()
    except (OSError, UnicodeDecodeError):
        return 0.0
    return float(all(s in text for s in rules["expected"]))


def match_value_to_rule(value: Any, rule: dict[str, Any]) -> bool:
    """One ``{"method", "ref"}`` rule: ``re[.FLAG...]`` (search), ``eq ne lt le gt ge``,
    ``approx:T`` (within T), ``range.XY`` (X, Y each ``t`` strict or ``e`` inclusive),
    ``str_list_eq`` / ``str_set_eq`` (the comma-separated value as a list / set)."""
    method, ref = rule["method"], rule.get("ref")
    if method.startswith("re"):
        flags = 0
        for name in method.split(".")[1:]:
            flags |= getattr(re, name)
        return re.search(ref, value, flags) is not None
    if method in ("eq", "ne", "lt", "le", "gt", "ge"):
        return bool(getattr(operator, method)(value, ref))
    if method.startswith("approx"):
        try:
            return abs(float(value) - ref) <= float(method.split(":")[1])
        except (TypeError, ValueError):
            return False
    if method.startswith("range."):
        left, right = (getattr(operator, "l" + c) for c in method[6:8])
        return bool(left(ref[0], value) and right(value, ref[1]))
    if method in ("str_list_eq", "str_set_eq"):
        kind = list if method == "str_list_eq" else set
        return kind(value.strip("\"'").split(",")) == kind(ref)
    raise NotImplementedError(f"check_json: method {method!r} is not supported")


def check_json(result: str | None, rules: dict[str, Any], is_yaml: bool = False, **_: Any) -> float:
    """Every ``expect`` rule (``key``: a path of keys) holds -- a missing key fails -- and no
    ``unexpect`` rule does (a missing key there counts as None)."""
    if not result:
        return 0.0
    try:
        text = Path(result).read_text(encoding="utf-8")
        if is_yaml:
            import yaml
            data = yaml.safe_load(text)
            if data is None:
                return 0.0
        else:
            data = json.loads(text)
    except Exception:  # unreadable, not JSON, yaml.YAMLError: 0, as OSWorld
        return 0.0

    def lookup(rule: dict[str, Any]) -> tuple[bool, Any]:
        value = data
        for key in rule["key"]:
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                return False, None
        return True, value

    for rule in rules.get("expect", []):
        found, value = lookup(rule)
        if not found or not match_value_to_rule(value, rule):
            return 0.0
    for rule in rules.get("unexpect", []):
        if match_value_to_rule(lookup(rule)[1], rule):
            return 0.0
    return 1.0


def check_direct_json_object(result: Any, rules: dict[str, Any]) -> float:
    """Each expected key has exactly the expected value (a JSON text result is parsed first).

    ``expect_in_result``: an expected list needs one of its items in the result's list (or
    equal to its string); an expected string must be a substring of the result's.
    ``expected["ignore_list_order"]`` compares lists sorted.
    """
    try:
        if isinstance(result, str):
            result = json.loads(result.strip().replace("'", '"'))
        if result is None:
            return 0.0
        expected = rules.get("expected") or {}
        if any(v == "__EVALUATION_FAILED__" for v in expected.values()):
            return 0.0
        if not rules.get("expect_in_result", False):
            for key, want in expected.items():
                got = result.get(key)
                if expected.get("ignore_list_order", False):
                    want, got = sorted(want), sorted(got)
                if want != got:
                    return 0.0
            return 1.0
        for key, want in expected.items():
            got = result.get(key)
            if isinstance(want, list):
                if not any((isinstance(got, list) and w in got) or (isinstance(got, str) and w == got)
                           for w in want):
                    return 0.0
            elif isinstance(want, str):
                if want not in got:
                    return 0.0
            else:
                return 0.0
        return 1.0
    except Exception:  # as OSWorld: a result that is not a JSON object scores 0
        return 0.0


def infeasible(*_: Any) -> float:
    """Graded in :func:`evaluate` from the agent's last action (FAIL = right)."""
    return 0.0


METRICS: dict[str, Callable[..., float]] = {fn.__name__: fn for fn in (
    exact_match, match_in_list, is_in_list, literal_match, check_include_exclude,
    is_expected_url_pattern_match, is_expected_active_tab, is_expected_active_tab_approximate,
    is_expected_tabs, is_expected_bookmarks, check_enabled_experiments, check_font_size,
    compare_text_file, file_contains, check_json, check_direct_json_object, infeasible)}
