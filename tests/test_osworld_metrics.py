"""Each implemented OSWorld metric and getter helper against the behaviour of OSWorld's own.

One test per metric; each docstring names the function it mirrors in xlang-ai/OSWorld
``desktop_env/evaluators/`` (read there: metrics/general.py, metrics/chrome.py,
metrics/vscode.py, metrics/utils.py, getters/chrome.py, desktop_env.py ``evaluate``).
The cases are the ones where a looser or stricter reading changes a grade.
"""

from __future__ import annotations

import json

import pytest

from nextstate.envs.gui import metrics as ev
from nextstate.envs.gui.osworld import evaluate

M = ev.METRICS


def test_exact_match():
    """metrics/general.py exact_match: ``result == rules["expected"]``, no coercion."""
    assert M["exact_match"]("true", {"expected": "true"}) == 1
    assert M["exact_match"]("True", {"expected": "true"}) == 0
    assert M["exact_match"](1, {"expected": "1"}) == 0


def test_match_in_list():
    """metrics/general.py match_in_list: ``result in rules["expected"]``."""
    assert M["match_in_list"]("Bing", {"expected": ["Microsoft Bing", "Bing"]}) == 1
    assert M["match_in_list"]("bing", {"expected": ["Bing"]}) == 0


def test_is_in_list():
    """metrics/general.py is_in_list: ``rules["expected"] in result``."""
    assert M["is_in_list"](["a", "b"], {"expected": "b"}) == 1
    assert M["is_in_list"](["a"], {"expected": "b"}) == 0


def test_literal_match():
    """metrics/general.py literal_match: str() equality; type "list" needs two lists of the
    same length, compared item by item as strings (ignore_case for both)."""
    assert M["literal_match"](5, "5") == 1
    assert M["literal_match"]("ABC", "abc", ignore_case=True) == 1 and M["literal_match"]("ABC", "abc") == 0
    assert M["literal_match"]([1, "B"], ["1", "b"], type="list", ignore_case=True) == 1
    assert M["literal_match"](None, [], type="list") == 0  # not a list: 0 (was 1 here before)
    assert M["literal_match"](["a"], ["a", "b"], type="list") == 0


def test_check_include_exclude():
    """metrics/general.py check_include_exclude: every include in, no exclude in; None -> 0."""
    rules = {"include": ["good"], "exclude": ["error"]}
    assert M["check_include_exclude"]("all good", rules) == 1
    assert M["check_include_exclude"]("good error", rules) == 0
    assert M["check_include_exclude"](None, rules) == 0


def test_is_expected_url_pattern_match():
    """metrics/chrome.py is_expected_url_pattern_match: every regex re.search-es the URL
    (a string or a dict's "url"); no result -> 0."""
    assert M["is_expected_url_pattern_match"]({"url": "https://a.org/forms?x=1"}, {"expected": [r"forms\?x=1"]}) == 1
    assert M["is_expected_url_pattern_match"]("https://a.org/", {"expected": ["forms"]}) == 0
    assert M["is_expected_url_pattern_match"](None, {"expected": ["."]}) == 0


def test_compare_urls_as_osworld_normalizes():
    """metrics/utils.py compare_urls: scheme kept (http when missing), host without its public
    suffix and a lone www, a bare "/" path dropped, query and fragment kept."""
    assert ev.compare_urls("https://www.airbnb.com/", "https://airbnb.com.sg")
    assert ev.compare_urls("example.com/a", "http://www.example.com/a")
    assert not ev.compare_urls("https://example.com/a", "http://example.com/a")  # scheme matters
    assert not ev.compare_urls("https://example.com/a/", "https://example.com/a")  # only a bare "/"
    assert not ev.compare_urls("https://a.com/?q=1", "https://a.com/?q=2")
    assert ev.compare_urls("https://a.com/?q=1", "https://a.com/?q=2", full=False)
    assert ev.compare_urls("chrome://settings/", "chrome://settings")
    assert ev.compare_urls(None, None) and not ev.compare_urls(None, "https://a.com")


def test_is_expected_active_tab():
    """metrics/chrome.py is_expected_active_tab: compare_urls(expected, actual) for type "url"."""
    rule = {"type": "url", "url": "https://www.drugs.com/npc/"}
    assert M["is_expected_active_tab"]("https://drugs.com/npc/", rule) == 1
    assert M["is_expected_active_tab"]({"url": "https://www.drugs.com/npp/"}, rule) == 0
    assert M["is_expected_active_tab"](None, rule) == 0


def test_is_expected_active_tab_approximate():
    """metrics/chrome.py is_expected_active_tab_approximate: equal once the query is dropped,
    nothing else normalized (so www. and scheme matter here)."""
    rule = {"type": "url", "url": "chrome://password-manager/passwords"}
    assert M["is_expected_active_tab_approximate"]("chrome://password-manager/passwords?q=x", rule) == 1
    rule = {"type": "url", "url": "https://www.a.com/p?x=1"}
    assert M["is_expected_active_tab_approximate"]("https://www.a.com/p?y=2", rule) == 1
    assert M["is_expected_active_tab_approximate"]("https://a.com/p", rule) == 0


def test_is_expected_tabs():
    """metrics/chrome.py is_expected_tabs + utils.are_lists_equal: same number of tabs, each
    expected URL open in some tab, in any order."""
    tabs = [{"url": "https://b.com", "title": "B"}, {"url": "https://www.a.com/", "title": "A"}]
    assert M["is_expected_tabs"](tabs, {"type": "url", "urls": ["https://a.com", "https://www.b.com/"]}) == 1
    assert M["is_expected_tabs"](tabs[:1], {"type": "url", "urls": ["https://a.com", "https://b.com"]}) == 0
    assert M["is_expected_tabs"]([], {"type": "url", "urls": []}) == 0  # no tabs: 0


def test_is_expected_bookmarks():
    """metrics/chrome.py is_expected_bookmarks: folder names / URLs of the bookmark bar as sets;
    "liked_authors_websites_urls": the "Liked Authors" folder holds one choice of each URL."""
    bar = {"bookmark_bar": {"children": [
        {"type": "folder", "name": "Favorites", "children": []},
        {"type": "folder", "name": "Liked Authors", "children": [
            {"type": "url", "url": "https://x.org/a2"}, {"type": "url", "url": "https://x.org/b"}]},
        {"type": "url", "url": "https://x.org/"}]}}
    assert M["is_expected_bookmarks"](bar, {"type": "bookmark_bar_folders_names",
                                            "names": ["Favorites", "Liked Authors"]}) == 1
    assert M["is_expected_bookmarks"](bar, {"type": "bookmark_bar_websites_urls", "urls": ["https://x.org/"]}) == 1
    liked = {"type": "liked_authors_websites_urls", "urls": [["https://x.org/a1", "https://x.org/a2"], "https://x.org/b"]}
    assert M["is_expected_bookmarks"](bar, liked) == 1
    assert M["is_expected_bookmarks"]([], liked) == 0  # get_bookmarks gives [] without a file
    with pytest.raises(TypeError):
        M["is_expected_bookmarks"](bar, {"type": "other"})


def test_check_enabled_experiments():
    """metrics/chrome.py check_enabled_experiments: the flag names, in order, equal the list."""
    got = ["calculate-native-win-occlusion@2", "show-autofill-type-predictions"]
    rule = {"type": "names", "names": ["calculate-native-win-occlusion", "show-autofill-type-predictions"]}
    assert M["check_enabled_experiments"](got, rule) == 1
    assert M["check_enabled_experiments"](got[::-1], rule) == 0  # order counts (a set compare passed)


def test_check_font_size_af630914_default_does_not_pass():
    """metrics/chrome.py check_font_size: "range" is strict, min < size < max. Task af630914
    ("largest font size") has min 16: Chromium's default 16 must fail, as in OSWorld."""
    rule = {"type": "range", "min": 16, "max": 99999999}
    assert M["check_font_size"]({"default_font_size": 16}, rule) == 0
    assert M["check_font_size"]({"default_font_size": 72}, rule) == 1
    assert M["check_font_size"]({"default_font_size": 16}, {"type": "value", "value": 16}) == 1


def test_compare_text_file(tmp_path):
    """metrics/vscode.py compare_text_file: equal text; ignore_blanks collapses whitespace,
    ignore_case lowers; no result -> 0."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("Hello  World\n")
    b.write_text("hello world")
    assert M["compare_text_file"](str(a), str(b)) == 0
    assert M["compare_text_file"](str(a), str(b), ignore_blanks=True, ignore_case=True) == 1
    assert M["compare_text_file"](None, str(b)) == 0


def test_file_contains(tmp_path):
    """metrics/general.py file_contains: every expected string is in the file; no file -> 0."""
    f = tmp_path / "x.txt"
    f.write_text("alpha beta")
    assert M["file_contains"](str(f), {"expected": ["alpha", "beta"]}) == 1
    assert M["file_contains"](str(f), {"expected": ["gamma"]}) == 0
    assert M["file_contains"](str(tmp_path / "none.txt"), {"expected": ["a"]}) == 0


def test_check_json(tmp_path):
    """metrics/general.py check_json + utils._match_value_to_rule: key paths; a missing expect
    key fails; methods eq/ne/lt.., re.FLAGS, approx:T, range.XY, str_set_eq; unexpect rules;
    is_yaml."""
    j = tmp_path / "s.json"
    j.write_text(json.dumps({"editor": {"fontSize": 14, "font": "Fira Code"}, "theme": "dark", "tabs": "a,b"}))
    ok = lambda *rules, **kw: M["check_json"](str(j), {"expect": list(rules)}, **kw)  # noqa: E731
    assert ok({"key": ["editor", "fontSize"], "method": "eq", "ref": 14},
              {"key": ["theme"], "method": "ne", "ref": "light"}) == 1
    assert ok({"key": ["editor", "tabSize"], "method": "eq", "ref": 4}) == 0
    assert ok({"key": ["editor", "font"], "method": "re.I", "ref": "^fira"}) == 1
    assert ok({"key": ["editor", "fontSize"], "method": "approx:0.5", "ref": 14.4}) == 1
    assert ok({"key": ["editor", "fontSize"], "method": "range.te", "ref": [10, 14]}) == 1
    assert ok({"key": ["editor", "fontSize"], "method": "range.tt", "ref": [10, 14]}) == 0
    assert ok({"key": ["tabs"], "method": "str_set_eq", "ref": ["b", "a"]}) == 1
    assert M["check_json"](str(j), {"unexpect": [{"key": ["theme"], "method": "eq", "ref": "dark"}]}) == 0
    assert M["check_json"](str(j), {"unexpect": [{"key": ["nope"], "method": "eq", "ref": "x"}]}) == 1
    y = tmp_path / "c.yaml"
    y.write_text("a:\n  b: 3\n")
    assert M["check_json"](str(y), {"expect": [{"key": ["a", "b"], "method": "eq", "ref": 3}]}, is_yaml=True) == 1
    assert M["check_json"](None, {"expect": []}) == 0


def test_check_direct_json_object():
    """metrics/general.py check_direct_json_object: exact values (no trimming or case folding);
    a JSON text result is parsed; expect_in_result: list -> one item present, str -> substring."""
    assert M["check_direct_json_object"]({"q": "coffee"}, {"expected": {"q": "coffee"}}) == 1
    assert M["check_direct_json_object"]({"q": " Coffee "}, {"expected": {"q": "coffee"}}) == 0
    assert M["check_direct_json_object"]("{'q': 'tea'}", {"expected": {"q": "tea"}}) == 1
    assert M["check_direct_json_object"]({"c": ["x", "y"]}, {"expected": {"c": ["y"]}, "expect_in_result": True}) == 1
    assert M["check_direct_json_object"]({"t": "big city"}, {"expected": {"t": "city"}, "expect_in_result": True}) == 1
    assert M["check_direct_json_object"]({"t": 1}, {"expected": {"t": 1}, "expect_in_result": True}) == 0
    assert M["check_direct_json_object"](None, {"expected": {}}) == 0
    assert M["check_direct_json_object"]({"a": 1}, {"expected": {"a": "__EVALUATION_FAILED__"}}) == 0


def test_infeasible_and_the_conjunction():
    """desktop_env.py DesktopEnv.evaluate: infeasible scores FAIL; a feasible task that ends in
    FAIL scores 0; "and" stops at the first 0, "or" at the first 1, else mean / max."""
    task = {"evaluator": {"func": "infeasible"}}
    assert evaluate(task, None, (1280, 720), "FAIL")[0] == 1.0  # type: ignore[arg-type]
    assert evaluate(task, None, (1280, 720), "DONE")[0] == 0.0  # type: ignore[arg-type]
    rule = lambda v: {"type": "rule", "rules": v}  # noqa: E731
    both = {"func": ["exact_match", "exact_match"], "result": [rule(1), rule(2)],
            "expected": [rule({"expected": 1}), rule({"expected": 1})]}
    assert evaluate({"evaluator": both}, None, (1, 1), "DONE")[0] == 0.0  # type: ignore[arg-type]
    assert evaluate({"evaluator": {**both, "conj": "or"}}, None, (1, 1), "DONE")[0] == 1.0  # type: ignore[arg-type]
    assert evaluate({"evaluator": both}, None, (1, 1), "FAIL")[0] == 0.0  # type: ignore[arg-type]


def test_address_bar_text_as_osworld_reads_the_url():
    """getters/chrome.py get_active_url_from_accessTree: goto_prefix + the address bar's text,
    which Chrome shows without https:// and www. (hence the tasks' prefix "https://www.")."""
    assert ev.address_bar_text("https://www.drugs.com/npc/") == "drugs.com/npc/"
    assert ev.address_bar_text("https://www.google.com/") == "google.com"
    assert ev.address_bar_text("chrome://password-manager/passwords") == "chrome://password-manager/passwords"
    assert ev.address_bar_text("file:///home/user/a.html") == "file:///home/user/a.html"
