"""The GUI environment: action parsing (no Docker), then real episodes on one desktop container."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from nextstate.envs.actions import ActionError
from nextstate.envs.base import Task, play
from nextstate.envs.gui import GUIEnv, NoSolution, builtin_tasks, computer13_code
from nextstate.envs.gui.osworld import TaskUnsupported, load_tasks

REPO = Path(__file__).resolve().parents[1]
OSWORLD = REPO.parent / "shared" / "data" / "osworld"  # optional extra coverage
FIXTURES = REPO / "tests" / "fixtures" / "osworld"  # the project's own OSWorld-format tasks
DESKTOP_IMAGE = "nextstate/desktop:latest"


# ---- no container ----------------------------------------------------------------------


def test_builtin_tasks_are_complete():
    tasks = builtin_tasks()
    assert len(tasks) >= 12
    for t in tasks:
        spec = t.data["builtin"]
        assert t.instruction and spec["check"] and spec["solution"], t.id
        site = Path(t.data["dir"]).parent / spec.get("site", t.id)
        assert (site / spec.get("page", "index.html")).is_file(), t.id


EMPTY_PAGE = """
const document = {querySelector: () => null, querySelectorAll: () => [], getElementById: () => null};
const localStorage = {getItem: () => null};
const location = {pathname: '/', search: '', href: 'about:blank'};
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the checks' JavaScript")
def test_every_builtin_check_reports_failure_on_an_empty_page_instead_of_raising():
    """A page without the task's elements (still loading, or another tab): each check says false, or the
    error it met; none throws (table-sort's read `.dataset` of null and the controller answered 500)."""
    from nextstate.envs.gui.env import checker_js

    checks = {t.id: t.data["builtin"]["check"] for t in builtin_tasks()}
    script = EMPTY_PAGE + "console.log(JSON.stringify({" + ", ".join(
        f"{json.dumps(name)}: {checker_js(check)}" for name, check in checks.items()) + "}));"
    ran = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    verdicts = json.loads(ran.stdout)
    assert set(verdicts) == set(checks) and all(v is False or "error" in v for v in verdicts.values())
    assert "dataset" in verdicts["table-sort"]["error"]
    assert subprocess.run(["node", "-e", EMPTY_PAGE + f"console.log({checker_js('1 === 1')})"],
                          capture_output=True, text=True).stdout.strip() == "true"


def test_gui_outcomes_are_in_minus_one_to_one_like_every_family():
    from nextstate.envs.gui.env import outcome_of

    assert (outcome_of(0.0), outcome_of(1.0), outcome_of(0.5)) == (-1.0, 1.0, 0.0)


def test_computer13_translation():
    size = (1280, 720)
    assert computer13_code("CLICK", {"x": 10, "y": 20}, size) == "pyautogui.click(10, 20, button='left', clicks=1)"
    assert computer13_code("CLICK", {}, size) == "pyautogui.click(button='left', clicks=1)"
    assert computer13_code("TYPING", {"text": "a'b"}, size) == 'pyautogui.typewrite("a\'b")'
    assert computer13_code("HOTKEY", {"keys": ["ctrl", "c"]}, size) == "pyautogui.hotkey('ctrl', 'c')"
    assert computer13_code("SCROLL", {"dy": -3}, size) == "pyautogui.vscroll(-3)"
    assert computer13_code("DRAG_TO", {"x": 5, "y": 6}, size).startswith("pyautogui.dragTo(5, 6")
    with pytest.raises(ActionError, match="off the 1280x720 screen"):
        computer13_code("CLICK", {"x": 2000, "y": 5}, size)
    with pytest.raises(ActionError, match="needs text"):
        computer13_code("TYPING", {}, size)


def test_parse_accepts_every_action_format():
    env = GUIEnv()
    try:
        assert env.parse({"action_type": "CLICK", "x": 1, "y": 2}).arguments == {"x": 1, "y": 2, "action": "CLICK"}
        nested = env.parse({"action_type": "PRESS", "parameters": {"key": "enter"}})
        assert (nested.name, nested.arguments) == ("computer", {"key": "enter", "action": "PRESS"})
        assert env.parse("DONE").arguments == {"action": "DONE"}
        assert env.parse("```python\npyautogui.click(3, 4)\n```").arguments == {"code": "pyautogui.click(3, 4)"}
        call = env.parse('<tool_call>{"name": "computer", "arguments": {"action": "wait"}}</tool_call>')
        assert call.name == "computer"
        with pytest.raises(ActionError):
            env.parse("I think I should click the button")
        assert env.observation_space["screenshot"].contains(Image.new("RGB", (1280, 720)))
        assert not env.observation_space["screenshot"].contains(Image.new("RGB", (10, 10)))
    finally:
        env.close()


def test_missing_osworld_package_gives_a_clear_error():
    env = GUIEnv([Task("t", "x", data={"osworld": {"evaluator": {"func": "infeasible"}}})], desktop="osworld")
    try:
        with pytest.raises(ImportError, match="desktop_env"):
            env.reset(options={"task": "t"})
    finally:
        env.close()


# ---- on a desktop container ------------------------------------------------------------------



@pytest.fixture(scope="module")
def pool(docker_client):
    from nextstate import containers
    from nextstate.envs.pool import SandboxPool
    containers.ensure_image("desktop", client=docker_client)
    p = SandboxPool(DESKTOP_IMAGE, size=1, reset="reuse", memory="2g", pids_limit=1024)
    yield p
    p.close()


@pytest.mark.docker
def test_a_desktop_that_cannot_start_fails_at_once_with_its_logs(pool):
    """The start script gives up (here: an Xvfb that exits) -> DesktopError with the log, not a wait to the timeout."""
    from nextstate.envs.gui.desktop import DesktopClient, DesktopError
    from nextstate.envs.pool import SandboxPool
    fresh = SandboxPool(DESKTOP_IMAGE, size=1, warm=False, memory="2g", pids_limit=1024)
    try:
        with fresh.lease() as sb:
            sb.run("mkdir -p /tmp/broken && printf '#!/bin/sh\\necho no screen >&2; exit 1\\n' > /tmp/broken/Xvfb"
                   " && chmod +x /tmp/broken/Xvfb && export PATH=/tmp/broken:$PATH")
            with pytest.raises(DesktopError, match="start script exited") as e:  # not "no answer in 120s"
                DesktopClient(sb).start(1280, 720, timeout=120)
            assert "Xvfb did not start" in str(e.value) and "no screen" in str(e.value)
    finally:
        fresh.close()


@pytest.mark.docker
def test_a_starting_desktop_is_not_taken_for_one_that_exited(pool):
    """Whether the start script still runs does not rest on matching command lines: `pgrep -f` misses a
    process in the middle of an exec (its command line is empty for a moment), here one that never matches."""
    from nextstate.envs.gui.desktop import DesktopClient
    from nextstate.envs.pool import SandboxPool
    fresh = SandboxPool(DESKTOP_IMAGE, size=1, warm=False, memory="2g", pids_limit=1024)
    try:
        with fresh.lease() as sb:
            sb.run("mkdir -p /tmp/blind && printf '#!/bin/sh\\nexit 1\\n' > /tmp/blind/pgrep"
                   " && chmod +x /tmp/blind/pgrep && export PATH=/tmp/blind:$PATH")
            DesktopClient(sb).start(1280, 720, timeout=120)
            assert sb.run("curl -s -m 5 http://127.0.0.1:5000/platform").stdout.strip() == "Linux"
    finally:
        fresh.close()


@pytest.fixture(scope="module")
def env(pool):
    tasks = builtin_tasks() + load_tasks(FIXTURES / "examples" / "chrome") + load_tasks(FIXTURES / "examples" / "os")
    if (OSWORLD / "examples").is_dir():
        tasks += load_tasks(OSWORLD / "examples" / "chrome")
    e = GUIEnv(tasks, pool=pool, settle=0.2)
    yield e
    e.close()


@pytest.mark.docker
@pytest.mark.browser
def test_episode_clicks_and_types_to_success(env):
    obs, info = env.reset(options={"task": "signup-form"})
    assert env.observation_space.contains(obs)
    assert "Ada Lovelace" in obs["instruction"]
    rows = {line.split("\t")[1]: line.split("\t") for line in obs["accessibility_tree"].splitlines()[1:]}
    name_box = eval(rows["name"][3])  # "(x, y)" of the Full name field, on screen
    # Three action formats: pyautogui code, a computer_13 dict, a tool call.
    _, r, done, _, info = env.step(f"```python\npyautogui.click({name_box[0] + 5}, {name_box[1] + 5})\n"
                                   "pyautogui.write('Ada Lovelace')\n```")
    ns = info["next_state"]
    assert ns["valid"] and ns["exit_code"] == 0 and not done and r == 0
    before, after = (Image.open(io.BytesIO(ns[k])) for k in ("screenshot_before", "screenshot_after"))
    assert before.size == after.size == (1280, 720) and before.tobytes() != after.tobytes()
    assert env.desktop.client.eval_js("document.getElementById('name').value") == "Ada Lovelace"
    for step in env.task.data["builtin"]["solution"][2:]:  # the rest of the scripted solution
        for action in env._gold(step):
            _, r, done, _, info = env.step(action)
            assert info["next_state"]["valid"], info["next_state"]
    _, reward, done, truncated, info = env.step(
        '<tool_call>{"name": "computer", "arguments": {"action": "done"}}</tool_call>')
    assert done and not truncated and reward == 1.0
    assert info["outcome"]["check"] is True


@pytest.mark.docker
@pytest.mark.browser
def test_the_first_screenshot_shows_the_painted_page_and_invalid_actions_recapture(env):
    """calculator's 16 buttons are on the first screenshot, not a white page; after an invalid action the
    observation holds the screen as it is now."""
    import numpy as np

    obs, _ = env.reset(options={"task": "calculator"})
    pixels = np.asarray(obs["screenshot"])
    not_white = (pixels.min(axis=2) < 200).mean()
    assert not_white > 0.01 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20, not_white
    env.desktop.client.eval_js("document.body.style.background = 'rgb(0, 0, 0)'; true")
    time.sleep(0.5)
    after, _, _, _, info = env.step({"action_type": "JUMP"})
    assert not info["next_state"]["valid"]
    assert after["screenshot"].tobytes() != obs["screenshot"].tobytes()


@pytest.mark.docker
@pytest.mark.browser
def test_wrong_episode_fails_and_bad_actions_are_observed(env):
    obs, _ = env.reset(options={"task": "signup-form"})
    _, _, _, _, info = env.step("pyautogui.click(")  # not Python
    assert info["next_state"]["valid"] and info["next_state"]["exit_code"] != 0
    assert "SyntaxError" in info["next_state"]["output"]
    _, _, _, _, info = env.step({"action_type": "JUMP"})
    assert not info["next_state"]["valid"] and "Unknown action" in info["next_state"]["error"]
    box = env.desktop.client.locate("#email")
    env.step({"action_type": "CLICK", "x": box["cx"], "y": box["cy"]})
    env.step({"action_type": "TYPING", "text": "wrong@example.com"})
    _, reward, done, _, info = env.step("DONE")
    assert done and reward == -1.0 and info["outcome"]["check"] is False


@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.parametrize("task_id", ["todo-complete", "select-country"])
def test_scripted_solution_passes_and_nothing_fails(env, task_id):
    env.reset(options={"task": task_id})
    reward, info = play(env, env.oracle_actions(env.task, "gold"))
    assert reward == 1.0, info["outcome"]
    env.reset(options={"task": task_id})
    assert env.step("DONE")[1] == -1.0


@pytest.mark.docker
@pytest.mark.browser
def test_osworld_chrome_task_graded_over_cdp(env):
    """An "open the password manager" task (as OSWorld's 12086550): the active tab's URL is read
    over CDP and shown as the address bar shows it."""
    task_id = "password-manager"
    assert env.skip_reason(env._by_id[task_id]) is None
    env.reset(options={"task": task_id})
    assert env.step("DONE")[1] == -1.0  # doing nothing leaves the new-tab page
    env.reset(options={"task": task_id})
    env.step({"action_type": "HOTKEY", "keys": ["ctrl", "l"]})
    env.step({"action_type": "TYPING", "text": "chrome://password-manager/passwords\n"})
    _, reward, done, _, info = env.step({"action_type": "WAIT", "seconds": 1})
    _, reward, done, _, info = env.step("DONE")
    assert done and reward == 1.0, info["outcome"]
    assert info["outcome"]["metrics"][0]["result"].startswith("chrome://password-manager")


@pytest.mark.docker
@pytest.mark.browser
def test_osworld_config_steps_tabs_and_files(env, tmp_path):
    """chrome_open_tabs / chrome_close_tabs, execute, open_tabs_info and vm_file on a synthetic task."""
    page = "file:///home/user/Desktop/{}.html"
    spec = {"id": "synthetic-tabs", "instruction": "Reopen the closed tab.", "related_apps": ["chrome"],
            "config": [
                {"type": "execute", "parameters": {"command": "for n in a b c; do echo \"<title>$n</title>\" "
                                                   "> ~/Desktop/$n.html; done; echo hi > ~/Desktop/note.txt",
                                                   "shell": True}},
                {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
                {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]}},
                {"type": "chrome_open_tabs", "parameters": {"urls_to_open": [page.format(n) for n in "abc"]}},
                {"type": "chrome_close_tabs", "parameters": {"urls_to_close": [page.format("c")]}}],
            "evaluator": {"func": ["is_expected_tabs", "compare_text_file"], "conj": "and",
                          "result": [{"type": "open_tabs_info"},
                                     {"type": "vm_file", "path": "/home/user/Desktop/note.txt", "dest": "note.txt"}],
                          "expected": [{"type": "rule", "rules": {"type": "url", "urls":
                                        ["chrome://newtab/"] + [page.format(n) for n in "abc"]}},
                                       {"type": "vm_file", "path": "/home/user/Desktop/note.txt", "dest": "n2.txt"}]}}
    path = tmp_path / "synthetic-tabs.json"
    path.write_text(json.dumps(spec))
    task = load_tasks(path)[0]
    assert task.data["skip"] is None
    env.reset(options={"task": task})
    assert [t["url"] for t in env.desktop.client.tabs()][-1] == page.format("b")
    assert env.step("DONE")[1] == -1.0  # tab c is still closed
    env.reset(options={"task": task})
    env.step({"action_type": "HOTKEY", "keys": ["ctrl", "shift", "t"]})
    _, reward, done, _, info = env.step("DONE")
    assert done and reward == 1.0, info["outcome"]


@pytest.mark.docker
@pytest.mark.browser
def test_skipped_and_infeasible_osworld_tasks(env):
    with pytest.raises(TaskUnsupported, match="installs software"):
        env.reset(options={"task": "install-player"})
    env.reset(options={"task": "bluetooth-infeasible"})
    assert play(env, env.oracle_actions(env.task, "gold"))[0] == 1.0  # the oracle says FAIL
    env.reset(options={"task": "bluetooth-infeasible"})
    assert env.step("DONE")[1] == -1.0
    env.reset(options={"task": "do-not-track"})
    with pytest.raises(NoSolution):
        next(env.solve())


@pytest.mark.docker
@pytest.mark.browser
def test_default_font_size_is_not_the_largest(env):
    """The af630914 false positive: Chromium's default 16 must not pass min 16 < size."""
    env.reset(options={"task": "font-size-largest"})
    _, reward, done, _, info = env.step("DONE")
    assert done and reward == -1.0
    assert info["outcome"]["metrics"][0]["result"]["default_font_size"] == 16


@pytest.mark.docker
@pytest.mark.browser
def test_os_desktop_has_a_panel_and_a_terminal_on_ctrl_alt_t(env):
    obs, _ = env.reset(options={"task": "make-dir"})
    assert "tint2" in obs["accessibility_tree"]  # the panel (launchers, windows, clock) is on screen
    assert obs["screenshot"].getpixel((32, 700)) != obs["screenshot"].getpixel((640, 700))  # panel vs background
    env.step({"action_type": "HOTKEY", "keys": ["ctrl", "alt", "t"]})
    obs, *_ = env.step({"action_type": "WAIT", "seconds": 2})
    assert "\tTerminal\t" in obs["accessibility_tree"]
    env.step({"action_type": "TYPING", "text": "mkdir ~/reports\n"})
    _, reward, done, _, info = env.step("DONE")
    assert done and reward == 1.0, info["outcome"]


@pytest.mark.docker
@pytest.mark.browser
def test_pyautogui_shim_covers_osworld_calls(env):
    env.reset(options={"task": "counter"})
    inc = env.desktop.client.locate("#inc")
    code = (f"pyautogui.moveTo({inc['cx']}, {inc['cy']})\n"
            f"pyautogui.click({inc['cx']}, {inc['cy']}); pyautogui.click({inc['cx']}, {inc['cy']})\n"  # same spot twice
            "pyautogui.doubleClick(); pyautogui.scroll(-2); pyautogui.hscroll(1)\n"
            "pyautogui.keyDown('shift'); pyautogui.keyUp('shift'); pyautogui.press(['tab', 'tab'])\n"
            "pyautogui.hotkey('ctrl', 'a'); pyautogui.rightClick(5, 300); pyautogui.press('esc')\n"
            "pyautogui.dragTo(300, 400, duration=0.1); pyautogui.typewrite(['a', 'b'])\n"
            "print(tuple(pyautogui.size()), tuple(pyautogui.position()), pyautogui.onScreen(5, 5))\n")
    _, _, _, _, info = env.step({"name": "pyautogui", "arguments": {"code": code}})
    ns = info["next_state"]
    assert ns["exit_code"] == 0 and ns["elapsed"] < 20, ns["output"]
    assert "(1280, 720) (300, 400) True" in ns["output"]
    assert env.desktop.client.eval_js("document.querySelector('#count').textContent") == "7"  # 3 + 4 clicks


@pytest.mark.docker
@pytest.mark.browser
def test_evaluate_reports_osworld_domains_and_skips(docker_client, tmp_path):
    from nextstate.train.evaluate import evaluate
    ids = ["win-cmd", "bluetooth-infeasible", "dict-func"]
    report = evaluate("gui", f"osworld:{FIXTURES}", "gold", parallel=1, output=tmp_path, ids=ids)
    results = (tmp_path / "results.jsonl").read_text()
    assert (report["total"], report["succeeded"], report["skipped"]) == (1, 1, 2), results
    assert report["skipped_reasons"]["win-cmd"] == "unsupported: Windows task"
    assert report["by_category"]["os"]["success_rate"] == 1.0
    rows = [json.loads(line) for line in results.splitlines()]
    assert {r["task_id"]: r["status"] for r in rows} == {"win-cmd": "skipped", "bluetooth-infeasible": "finished",
                                                        "dict-func": "skipped"}


def test_a_gui_oracle_action_is_written_as_the_computer_tool_call_it_parses_back_to():
    """Warm starts write each oracle action as the model would (``train.sft --env gui --source oracle``):
    an OSWorld ``computer_13`` dict becomes the ``computer`` tool's call, not a KeyError on ``name``."""
    from nextstate.agents.chat import action_text
    from nextstate.envs.actions import parse_action
    from nextstate.envs.gui.env import COMPUTER_TOOL, computer_call

    for action in ({"action_type": "CLICK", "x": 10, "y": 20}, {"action_type": "TYPING", "text": "mira"},
                   {"action_type": "DONE"}):
        text = action_text(action)
        assert text.startswith("<tool_call>") and parse_action(text, [COMPUTER_TOOL]) == computer_call(action)
