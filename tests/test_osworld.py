"""OSWorld task loading and the support report (no Docker needed); metrics are in test_osworld_metrics.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nextstate.envs.gui import osworld
from nextstate.envs.gui.osworld import is_local_url, load_tasks, program_names, substitute, support_report, unsupported

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


# ---- the project's own OSWorld-format fixtures (tests/fixtures/osworld; no ../shared needed) ----

FIXTURES = REPO / "tests" / "fixtures" / "osworld"


def test_fixture_directory_loads_whole_with_every_problem_reported():
    tasks = {t.id: t for t in load_tasks(FIXTURES)}
    files = sorted((FIXTURES / "examples").glob("*/*.json"))
    assert len(tasks) == len(files) == 17  # malformed files are loaded as skipped, never dropped
    skip = {tid: t.data["skip"] for tid, t in tasks.items()}
    assert {tid for tid, r in skip.items() if r is None} == {"font-size-largest", "do-not-track", "make-dir",
                                                             "bluetooth-infeasible", "password-manager"}
    assert skip["win-cmd"] == skip["win-path"] == "unsupported: Windows task"
    assert skip["install-player"] == "needs root and network (installs software)"
    assert skip["needs-gimp"] == "needs app: gimp"
    expected = {"dict-config": "config is an object, not a list of steps",
                "string-step": "config[0] is a string",
                "string-result": "evaluator.result holds a string",
                "list-evaluator": "evaluator is a list, not an object",
                "dict-func": "evaluator.func is an object",
                "no-evaluator": "no evaluator",
                "not-json": "not valid JSON",
                "list-file": "the file holds a list"}
    for tid, why in expected.items():
        assert skip[tid].startswith("malformed task: ") and why in skip[tid], (tid, skip[tid])
        assert tasks[tid].data["path"].endswith(f"broken/{tid}.json")
    report = support_report(tasks.values())
    assert report["by_domain"]["broken"] == {"total": 8, "runnable": 0, "skipped": 8}
    assert all(s["path"] for s in report["skipped_tasks"])


def test_report_command_names_the_malformed_files(capsys):
    assert osworld.main(["report", str(FIXTURES)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("17 tasks: 5 runnable, 12 skipped")
    assert "broken/dict-func.json: evaluator.func is an object" in out
    assert "2  unsupported: Windows task" in out


def test_windows_detection():
    cmd = {"instruction": "x", "config": [{"type": "execute", "parameters": {"command": "cmd /c dir"}}],
           "evaluator": {"func": "infeasible"}}
    assert osworld.is_windows(cmd)
    path = {"instruction": "x", "evaluator": {"func": "exact_match", "result": {
        "type": "vm_file", "path": "%USERPROFILE%\\Desktop\\a.txt", "dest": "a.txt"}}}
    assert osworld.is_windows(path)
    linux = {"instruction": "x", "config": [{"type": "execute", "parameters": {
        "command": "printf 'a:b\\\\c' > /tmp/x; python3 -c 'print(1)'", "shell": True}}],
             "evaluator": {"func": "infeasible"}}
    assert not osworld.is_windows(linux)
    office = {"instruction": "Copy the totals into the slides.", "config": [],
              "related_apps": ["Excel", "PowerPoint", "Word"], "evaluator": {"func": "compare_pptx_files"}}
    assert osworld.is_windows(office)  # no path or command says so: the apps do
    assert not osworld.is_windows({**office, "related_apps": ["libreoffice_calc", "vlc"]})


def test_evaluate_reports_malformed_and_windows_tasks_as_skipped_by_id(tmp_path):
    from nextstate.train.evaluate import evaluate
    ids = ["no-evaluator", "win-cmd", "dict-func"]
    report = evaluate("gui", f"osworld:{FIXTURES}", "noop", output=tmp_path, ids=ids)
    assert report["total"] == 0 and report["skipped"] == 3
    assert report["skipped_reasons"]["no-evaluator"] == "malformed task: no evaluator"
    assert report["skipped_reasons"]["win-cmd"] == "unsupported: Windows task"


@needs_data
def test_spotify_needs_root_and_network():
    by_id = {t.id: t for t in load_tasks(OSWORLD / "examples" / "os")}
    assert by_id["94d95f96-9699-4208-98ba-3c3119edf9c2"].data["skip"] == "needs root and network (installs software)"
