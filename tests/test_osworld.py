"""OSWorld task loading, the support report, and the evaluator's metrics (no Docker needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs import osworld, osworld_eval
from envs.osworld import is_local_url, load_tasks, program_names, substitute, support_report, unsupported

REPO = Path(__file__).resolve().parents[1]
OSWORLD = REPO.parent / "shared" / "data" / "osworld"
needs_data = pytest.mark.skipif(not (OSWORLD / "examples").is_dir(),
                                reason=f"OSWorld examples not found at {OSWORLD}")


@needs_data
def test_every_example_is_runnable_or_skipped_with_a_reason():
    tasks = load_tasks(OSWORLD / "examples")
    files = sorted((OSWORLD / "examples").glob("*/*.json"))
    assert len(tasks) == len(files) == 370
    report = support_report(tasks)
    assert report["total"] == 370
    assert report["runnable"] + report["skipped"] == 370
    assert sum(report["by_reason"].values()) == report["skipped"]
    assert len(report["runnable_tasks"]) == report["runnable"] >= 15
    assert all(s["reason"] for s in report["skipped_tasks"])
    for counts in report["by_domain"].values():
        assert counts["runnable"] + counts["skipped"] == counts["total"]
    # Applications the container lacks are skipped whole; Chrome tasks without network are runnable.
    for app in ("gimp", "libreoffice_calc", "libreoffice_impress", "libreoffice_writer", "thunderbird", "vlc",
                "vs_code"):
        assert report["by_domain"][app]["runnable"] == 0
    assert report["by_domain"]["chrome"]["runnable"] >= 10
    assert report["by_reason"]["needs network (download)"] > 0
    assert report["by_reason"]["needs network (opens web sites)"] > 0
    by_id = {t.id: t for t in tasks}
    assert by_id["030eeff7-b492-4218-b312-701ec99ee0cc"].data["skip"] is None  # Do Not Track
    assert "sudo" in by_id["e0df059f-28a6-4169-924f-b9623e7184cc"].data["skip"]


@needs_data
def test_index_and_directory_loading():
    via_index = load_tasks(OSWORLD)  # the directory has test_all.json: the index is used
    assert len(via_index) == sum(len(v) for v in json.loads((OSWORLD / "test_all.json").read_text()).values())
    one = load_tasks(next((OSWORLD / "examples" / "chrome").glob("*.json")))
    assert len(one) == 1 and one[0].category == "chrome"
    assert {t.category for t in via_index} >= {"chrome", "os", "multi_apps"}


def test_unsupported_reasons():
    base = {"instruction": "x", "related_apps": ["chrome"], "evaluator": {"func": "exact_match",
            "result": {"type": "vm_command_line", "command": "echo hi", "shell": True},
            "expected": {"type": "rule", "rules": {"expected": "hi\n"}}}}
    assert unsupported(base) == []
    assert unsupported({**base, "related_apps": ["gimp"]}) == ["needs app: gimp"]
    assert unsupported({**base, "config": [{"type": "download", "parameters": {}}]}) == ["needs network (download)"]
    tabs = {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.org"]}}
    assert unsupported({**base, "config": [tabs]}) == ["needs network (opens web sites)"]
    local = {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["file:///tmp/a.html"]}}
    assert unsupported({**base, "config": [local]}) == []
    sudo = {"type": "execute", "parameters": {"command": "echo {CLIENT_PASSWORD} | sudo -S ls", "shell": True}}
    assert unsupported({**base, "config": [sudo]}) == ["needs root (sudo)"]
    assert unsupported({**base, "config": [{"type": "teleport"}]}) == ["unsupported setup step: teleport"]
    ev = {**base["evaluator"], "func": "compare_pptx_files"}
    assert unsupported({**base, "evaluator": ev}) == ["unsupported metric: compare_pptx_files"]
    ev = {**base["evaluator"], "result": {"type": "cloud_file"}}
    assert unsupported({**base, "evaluator": ev}) == ["needs network (getter cloud_file)"]


def test_command_parsing_helpers():
    assert program_names(["gsettings", "get", "x"]) == ["gsettings"]
    assert program_names("A=1 timeout 10 gsettings get x | grep y && echo $(pactl list)") == \
        ["gsettings", "grep", "echo", "pactl"]
    assert is_local_url("file:///home/user/a.html") and is_local_url("http://127.0.0.1:8000/x")
    assert is_local_url("chrome://settings") and not is_local_url("https://www.example.com")
    assert substitute({"c": ["click({SCREEN_WIDTH_HALF}, {SCREEN_HEIGHT_HALF})"]}, 1280, 720) == \
        {"c": ["click(640, 360)"]}
    assert osworld._adapt(["pkill", "chrome"]) == ["pkill", "-x", "chromium"]
    assert osworld._adapt(["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"])[1] == "tcp-listen:9222,reuseaddr,fork"


def test_metrics(tmp_path):
    m = osworld_eval.METRICS
    assert m["exact_match"]("true", {"expected": "true"}) == 1 and m["exact_match"]("false", {"expected": "true"}) == 0
    assert m["match_in_list"]("Bing", {"expected": ["Microsoft Bing", "Bing"]}) == 1
    assert m["check_include_exclude"]("all good", {"include": ["good"], "exclude": ["error"]}) == 1
    assert m["check_include_exclude"]("good error", {"include": ["good"], "exclude": ["error"]}) == 0
    assert m["is_expected_url_pattern_match"]({"url": "https://a.org/forms?x=1"}, {"expected": [r"forms\?x=1"]}) == 1
    assert m["is_expected_url_pattern_match"]("https://a.org/", {"expected": ["forms"]}) == 0
    tabs = [{"url": "https://www.a.com/", "title": "A"}, {"url": "https://b.com", "title": "B"}]
    assert m["is_expected_tabs"](tabs, {"type": "url", "urls": ["https://a.com", "https://www.b.com/"]}) == 1
    assert m["is_expected_tabs"](tabs[:1], {"type": "url", "urls": ["https://a.com", "https://b.com"]}) == 0
    assert m["is_expected_active_tab_approximate"]("chrome://password-manager/passwords",
                                                   {"type": "url", "url": "chrome://password-manager/passwords"}) == 1
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("Hello  World\n")
    b.write_text("hello world")
    assert m["compare_text_file"](str(a), str(b)) == 0
    assert m["compare_text_file"](str(a), str(b), ignore_blanks=True, ignore_case=True) == 1
    j = tmp_path / "s.json"
    j.write_text(json.dumps({"editor": {"fontSize": 14}, "theme": "dark"}))
    assert m["check_json"](str(j), {"expect": [{"key": ["editor", "fontSize"], "method": "eq", "ref": 14},
                                              {"key": "theme", "method": "ne", "ref": "light"}]}) == 1
    assert m["check_json"](str(j), {"expect": [{"key": ["editor", "tabSize"], "method": "eq", "ref": 4}]}) == 0
    assert m["check_font_size"]({"default_font_size": 20}, {"type": "range", "min": 16, "max": 99999}) == 1
    bookmarks = {"bookmark_bar": {"children": [{"type": "folder", "name": "Favorites"}]}}
    assert m["is_expected_bookmarks"](bookmarks, {"type": "bookmark_bar_folders_names", "names": ["Favorites"]}) == 1
    assert m["check_direct_json_object"]({"q": " Coffee "}, {"expected": {"q": "coffee"}}) == 1
    assert set(m) >= {"exact_match", "check_include_exclude", "is_expected_url_pattern_match",
                      "compare_text_file", "check_json", "infeasible"}


def test_infeasible_is_graded_on_the_last_action():
    task = {"evaluator": {"func": "infeasible"}}
    assert osworld_eval.evaluate(task, None, (1280, 720), "FAIL")[0] == 1.0  # type: ignore[arg-type]
    assert osworld_eval.evaluate(task, None, (1280, 720), "DONE")[0] == 0.0  # type: ignore[arg-type]
    feasible = {"evaluator": {"func": "exact_match", "result": {"type": "rule", "rules": 1},
                              "expected": {"type": "rule", "rules": {"expected": 1}}}}
    assert osworld_eval.evaluate(feasible, None, (1280, 720), "FAIL")[0] == 0.0  # type: ignore[arg-type]
