"""``python -m viewer``: the run index, the JSON API, the export, and the page in Debian's Chromium.

The runs are written by the project's own code (:func:`bench.viewer.write_run`:
the agent loop and its recorder, ``build_batch``'s step log, ``MetricsLog``;
the policy and judge are seeded-RNG doubles) and by ``train.evaluate``.
The browser tests drive ``/usr/bin/chromium`` through Playwright; they are
skipped where either is missing, except in CI, where ``.ci/setup`` installs both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
import urllib.request
from urllib.parse import unquote
from pathlib import Path

import pytest

from bench.viewer import CHROMIUM, LogEnv, launch_chromium, record_gui_episode, write_run
from nextstate.agents.recorder import Recorder
from nextstate.agents.testing import ScriptedPolicy
from nextstate.envs.base import Task
from nextstate.train.batch import build_batch
from nextstate.train.config import AdvantageConfig
from nextstate.train.rollout import collect
from nextstate.train.evaluate import evaluate
from nextstate.viewer import RunIndex, export, image_ref, main, make_server, to_json


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("view") / "run"
    write_run(out, train_steps=2, tasks_per_step=3, samples=4, max_steps=5, gui=True, metrics_log=True)
    return out


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("view") / "eval"
    evaluate("toolcall", "builtin", "gold", parallel=2, output=out, ids=["nextstate-aime-1", "nextstate-aime-2"])
    return out


FIX = '<tool_call>{"name": "run", "arguments": {"command": "./fix.sh"}}</tool_call>'
QUIT = '<tool_call>{"name": "finish", "arguments": {}}</tool_call>'


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Path:
    """Two training steps with held-out evaluations before and after each (``train.rollout.heldout``),
    then a step of two scripted tasks that trains nothing: ``fixer`` runs ./fix.sh until max_steps
    truncates it (a success), ``quitter`` finishes at once (a failure); two samples each score
    alike, so build_batch drops every bucket and the learner skips the update, as it logs it."""
    out = tmp_path_factory.mktemp("view") / "graded"
    write_run(out, train_steps=2, tasks_per_step=1, samples=2, max_steps=3, gui=False, heldout_tasks=2)
    trajs = []
    with Recorder(out / "rollouts.jsonl") as rec:
        for name, script in (("fixer", [FIX]), ("quitter", [QUIT])):
            task = Task(name, "Find why the worker fails and fix it.")
            trajs += asyncio.run(collect(lambda: LogEnv([task], max_steps=2), ScriptedPolicy(script), [task],
                                         n_samples=2, recorder=rec, batch_tag="s3", progress=False))
    empty = build_batch(trajs, AdvantageConfig(), weight=1.0, role="agent").metrics
    assert empty["batch/samples"] == 0
    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, **empty, "train/skipped": 1.0}) + "\n")   # Learner.step of no sample
    return out


@contextlib.contextmanager
def serving(run: Path):
    httpd = make_server(RunIndex(run), port=0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server(run):
    with serving(run) as url:
        yield url


def get(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url, timeout=30).read())


# -- the index and the API ----------------------------------------------------------------
def test_index_matches_the_jsonl(run):
    index = RunIndex(run)
    assert index.refresh() and not index.refresh()          # nothing new the second time
    logged = read_jsonl(run / "rollouts.jsonl")
    trajs = [r for r in logged if r["kind"] == "trajectory"]
    over = index.overview()
    assert over["kind"] == "train" and len(over["episodes"]) == len(trajs) == 2 * 3 * 4 + 1
    assert [r["step"] for r in over["metrics"]] == [1, 2] and over["config"]["rollout"]["samples_per_task"] == 4
    advantages = {(a["group_id"], a["sample"], a["step"]): a for a in read_jsonl(run / "advantages.jsonl")}
    judges = {(j["group_id"], j["sample"], j["step"]): j for j in logged if j["kind"] == "judge"}
    checked = 0
    for summary in over["episodes"]:
        t = next(t for t in trajs if (t["group_id"], t["sample"]) == (summary["group_id"], summary["sample"]))
        assert (summary["status"], summary["outcome"], summary["steps"]) == (t["status"], t["outcome"], t["steps"])
        ep = index.episode(summary["id"])
        for s in ep["steps_detail"]:
            key = (ep["group_id"], ep["sample"], s["index"])
            assert s["judge"]["votes"] == judges[key]["votes"] and s["judge"]["prompt"] == judges[key]["prompt"]
            if key in advantages:
                assert (s["R_t"], s["advantage"], s["kept"]) == tuple(advantages[key][k] for k in ("reward", "advantage", "kept"))
                checked += 1
            assert s["messages"][0]["role"] == "system" and s["next_state"] is not None
    assert checked == len(advantages) > 40
    assert {e["train_step"] for e in over["episodes"]} == {1, 2}


def test_screenshots_from_files_and_inline_base64(run):
    index = RunIndex(run)
    index.refresh()
    gui = next(e for e in index.overview()["episodes"] if e["task_id"] == "desktop-save")
    steps = index.episode(gui["id"])["steps_detail"]
    assert steps[0]["after"] == ["files/screens/desktop-save_s2_1.png"]
    assert steps[0]["before"][0].startswith("data:image/png;base64,iVBOR")   # inline, as older runs wrote
    assert steps[1]["before"] == ["files/screens/desktop-save_s2_1.png"]
    assert steps[1]["after"] == ["files/screens/desktop-save_s2_2.png"]
    # a recorder that keeps screenshots only in the prompts: a step's "after" is the next prompt's image
    other = run.parent / "prompts-only"
    other.mkdir()
    shutil.copytree(run / "screens", other / "screens")
    with Recorder(other / "rollouts.jsonl") as rec:
        for i in range(2):
            rec.record("step", {"group_id": "g@s1", "task_id": "g", "sample": 0, "step": i, "role": "agent",
                                "messages": [{"role": "user", "content": [{"type": "image", "image": f"screens/desktop-save_s2_{i}.png"}]}],
                                "text": "x", "action": None, "next_state": {}})
    index = RunIndex(other)
    index.refresh()
    steps = index.episode(0)["steps_detail"]
    assert [(s["before"], s["after"]) for s in steps] == [
        (["files/screens/desktop-save_s2_0.png"], ["files/screens/desktop-save_s2_1.png"]),
        (["files/screens/desktop-save_s2_1.png"], [])]
    assert image_ref("../../etc/passwd.png", run) is None and image_ref("screens/missing.png", run) is None
    assert index.file("../rollouts.jsonl") is None and index.file("screens/desktop-save_s2_1.png") is not None


def test_api_serves_pages_json_and_images_only_from_the_run(server, run):
    assert b"nextstate run viewer" in urllib.request.urlopen(server, timeout=30).read()
    over = get(server + "api/run")
    assert get(server + "api/run?since=" + over["version"]) == {"unchanged": True, "version": over["version"]}
    assert get(server + "api/episode/0")["steps_detail"][0]["index"] == 0
    png = urllib.request.urlopen(server + "files/screens/desktop-save_s2_1.png", timeout=30)
    assert png.headers["Content-Type"] == "image/png" and png.read()[:4] == b"\x89PNG"
    for bad in ("files/../../../etc/passwd", "files/%2e%2e/%2e%2e/etc/passwd", "api/episode/99999", "nope"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server + bad, timeout=30)
        assert e.value.code == 404


def test_live_run_half_written_lines_and_a_resumed_episode(tmp_path):
    run = tmp_path / "live"
    run.mkdir()
    index = RunIndex(run)
    index.refresh()
    assert index.overview()["episodes"] == []
    where = {"group_id": "t@s1", "task_id": "t", "sample": 0}
    line = json.dumps({"kind": "step", "time": 0, **where, "step": 0, "role": "agent", "messages": [],
                       "text": "ls", "action": None, "next_state": {"stdout": "a"}})
    with (run / "rollouts.jsonl").open("w") as f:
        f.write(line + "\n" + line[:20])                   # the writer is in the middle of a line
    assert index.refresh()
    ep = index.overview()["episodes"][0]
    assert (ep["status"], ep["steps"], index.bad_lines) == ("running", 1, 0)
    with (run / "rollouts.jsonl").open("a") as f:
        f.write(line[20:] .replace('"step": 0', '"step": 1') + "\n")
        f.write(json.dumps({"kind": "trajectory", "time": 0, **where, "status": "finished", "outcome": 1.0,
                            "steps": 2}) + "\n")
        f.write("{not json\n")
        f.write(json.dumps({"kind": "judge", "time": 0, **where, "step": 1, "votes": [], "score": 0,
                            "mean": float("nan"), "prompt": "p", "raw": []}) + "\n")   # NaN, as json.dumps writes it
    assert index.refresh()
    ep = index.overview()["episodes"][0]
    assert (ep["status"], ep["steps"], ep["outcome"], index.bad_lines) == ("finished", 2, 1.0, 1)
    judged = json.loads(to_json(index.episode(0)), parse_constant=lambda c: pytest.fail(f"{c} sent"))
    assert judged["steps_detail"][1]["judge"]["mean"] is None
    with (run / "rollouts.jsonl").open("a") as f:           # `--resume` plays the step again
        f.write(line + "\n")
    index.refresh()
    eps = index.overview()["episodes"]
    assert len(eps) == 1 and eps[0]["status"] == "running" and eps[0]["id"] == 1


def test_rollouts_of_several_workers_are_read_together_in_time_order(tmp_path):
    """A veRL run with several agent-loop workers writes ``rollouts.<host>.<pid>.jsonl`` each; the
    index reads them all, episodes in the order they began, each step from its own file, and
    a worker that died mid-line loses only that line."""
    run = tmp_path / "verl"
    run.mkdir()

    def rec(kind, t, group, **fields):
        return json.dumps({"kind": kind, "time": t, "group_id": group, "task_id": group.split("@")[0],
                           "sample": 0, **fields}) + "\n"

    def step(t, group, i, text):
        return rec("step", t, group, step=i, role="agent", messages=[], text=text, action=None, next_state={})

    (run / "rollouts.node-a.101.jsonl").write_text(
        step(1.0, "a@s1", 0, "a0") + step(3.0, "a@s1", 1, "a1") + rec("trajectory", 4.0, "a@s1", status="finished",
                                                                        outcome=1.0, steps=2)
        + step(6.0, "c@s1", 0, "c0"))
    (run / "rollouts.node-b.202.jsonl").write_text(
        step(2.0, "b@s1", 0, "b0") + rec("trajectory", 5.0, "b@s1", status="aborted", outcome=None, steps=1,
                                         error="SandboxError: no Docker engine of the pool answers")
        + step(7.0, "d@s1", 0, "d0")[:30])            # the worker died while writing this line
    index = RunIndex(run)
    index.refresh()
    eps = index.overview()["episodes"]
    assert [(e["group_id"], e["status"], e["steps"]) for e in eps] == \
        [("a@s1", "finished", 2), ("b@s1", "aborted", 1), ("c@s1", "running", 1)]
    assert index.bad_lines == 0
    assert [s["text"] for s in index.episode(0)["steps_detail"]] == ["a0", "a1"]
    assert [s["text"] for s in index.episode(1)["steps_detail"]] == ["b0"]
    assert "no Docker engine" in eps[1]["error"]
    with (run / "rollouts.node-b.202.jsonl").open("a") as f:   # a third worker's file and more lines appear
        f.write("\n" + step(8.0, "e@s1", 0, "e0"))
    (run / "rollouts.node-c.303.jsonl").write_text(step(7.5, "f@s1", 0, "f0"))
    assert index.refresh()
    assert [e["group_id"] for e in index.overview()["episodes"]] == ["a@s1", "b@s1", "c@s1", "f@s1", "e@s1"]
    assert index.bad_lines == 1                                  # the cut line, closed by a newline
    assert main([str(run), "--export", str(tmp_path / "verl.html")]) == 0


async def test_an_episode_aborted_before_its_first_step_is_listed(tmp_path):
    """No env could be made: the loop logs the aborted episode, and the viewer counts it."""
    from nextstate.train.rollout import collect
    from bench.viewer import DicePolicy
    from nextstate.envs.base import Task

    def no_env():
        raise RuntimeError("no Docker engine answers")

    with Recorder(tmp_path / "rollouts.jsonl") as rec:
        trajs = await collect(no_env, DicePolicy(), [Task("t", "do it")], n_samples=2, recorder=rec,
                              batch_tag="s1", progress=False)
    assert [t.status for t in trajs] == ["aborted", "aborted"]
    index = RunIndex(tmp_path)
    index.refresh()
    eps = index.overview()["episodes"]
    assert [(e["status"], e["steps"], e["train_step"]) for e in eps] == [("aborted", 0, 1)] * 2
    assert "no Docker engine" in eps[0]["error"]


def test_evaluate_run_without_rollouts(eval_run):
    index = RunIndex(eval_run)
    index.refresh()
    over = index.overview()
    results = read_jsonl(eval_run / "results.jsonl")
    assert over["kind"] == "evaluate" and over["report"]["total"] == 2
    assert [(e["task_id"], e["success"], e["outcome"]) for e in over["episodes"]] == \
        [(r["task_id"], r["success"], r["reward"]) for r in results]
    assert index.episode(0)["has_steps"] is False
    assert index.episode(0)["grade"] == results[0]["outcome"]       # the grader's details, from results.jsonl


def test_export_is_one_self_contained_page(run, tmp_path, capsys):
    assert main([str(run), "--export", str(tmp_path / "run.html")]) == 0
    assert "wrote" in capsys.readouterr().out
    html = (tmp_path / "run.html").read_text()
    data = json.loads(html.split("const EMBED = ", 1)[1].split(";\nconst PAGE", 1)[0].replace("<\\/", "</"))
    assert len(data["episodes"]) == len(data["overview"]["episodes"]) == 25
    assert '"files/' not in html and html.count("data:image/png;base64,") >= 4
    assert main([str(tmp_path / "missing"), "--export", str(tmp_path / "x.html")]) == 2
    assert main([str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_trainer_step_log_matches_the_advantage_code(run):
    """advantages.jsonl carries what build_batch trained with: R_t = o + mean(votes), normalized per
    (group, step index), every trainable step once."""
    import numpy as np
    rows = read_jsonl(run / "advantages.jsonl")
    outcome = {(t["group_id"], t["sample"]): t["outcome"] for t in read_jsonl(run / "rollouts.jsonl")
               if t["kind"] == "trajectory"}
    means = {(j["group_id"], j["sample"], j["step"]): j["mean"] for j in read_jsonl(run / "rollouts.jsonl")
             if j["kind"] == "judge"}
    buckets: dict[tuple, list[dict]] = {}
    for r in rows:
        assert r["reward"] == pytest.approx(outcome[(r["group_id"], r["sample"])] + (means[(r["group_id"], r["sample"], r["step"])] or 0))
        buckets.setdefault((r["group_id"], r["step"]), []).append(r)
    for members in buckets.values():
        rewards = np.array([m["reward"] for m in members])
        if len(members) > 1 and rewards.std() > 0:
            want = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
            assert [m["advantage"] for m in members] == pytest.approx(want.tolist())


# -- the page in a real browser -------------------------------------------------------------
def _browser_or_skip():
    missing = [what for what, ok in (("chromium", Path(CHROMIUM).exists()),
                                     ("playwright", _has_playwright())) if not ok]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI=true but {', '.join(missing)} is missing: .ci/setup installs it")
        pytest.skip(f"{', '.join(missing)} not installed")


def _has_playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def browser(run, graded):
    """Chromium under Playwright's sync API, whose event loop runs in this thread from here
    on: ``run`` and ``graded`` (which need ``asyncio.run``) are written first."""
    _browser_or_skip()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = launch_chromium(pw)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    p = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    yield p
    p.close()
    assert not errors, errors


def test_page_episode_votes_advantage_group_and_screenshot(page, server, run, tmp_path):
    page.goto(server)
    page.wait_for_selector("body[data-ready] #episodes tr.episode-row")
    assert page.text_content("#n-episodes") == "25"
    assert page.locator(".chart[data-metric='outcome/mean'] polyline").count() == 1
    # filter, then sort by mean R_t: the list follows
    page.select_option("select[data-f=step]", "2")
    assert page.locator("tr.episode-row").count() == 13
    page.select_option("select[data-f=sort]", "mean_reward:desc")
    rows = [float(x) for x in page.locator("tr.episode-row td:nth-child(7)").all_text_contents() if x != "–"]
    assert rows == sorted(rows, reverse=True) and len(rows) == 12
    # open the best episode and compare one step with the JSONL
    page.locator("tr.episode-row").first.click()
    page.wait_for_selector("#steps .step")
    gid = unquote(page.get_attribute("a[href^='#/group/']", "href").split("/group/")[1])
    sample = int(page.text_content("#episode-title + .mute").split("sample ")[1].split(" ")[0])
    logged = read_jsonl(run / "rollouts.jsonl")
    adv = {(a["group_id"], a["sample"], a["step"]): a for a in read_jsonl(run / "advantages.jsonl")}
    for card in page.locator("#steps .step").all():
        i = int(card.get_attribute("data-step"))
        judge = next(r for r in logged if r["kind"] == "judge" and (r["group_id"], r["sample"], r["step"]) == (gid, sample, i))
        assert json.loads(card.locator(".votes").get_attribute("data-votes")) == judge["votes"]
        shown = [int(v) for v in card.locator(".votes .vote").all_text_contents()]
        assert shown == judge["votes"]
        a = adv[(judge["group_id"], sample, i)]
        assert float(card.locator(".adv").text_content()) == pytest.approx(a["advantage"], abs=5e-5)
        assert float(card.locator(".rt").text_content()) == pytest.approx(a["reward"], abs=5e-5)
    first = page.locator("#steps .step").first
    assert not first.locator("details.messages").evaluate("d => d.open")       # collapsed by default
    first.locator("details.messages summary").click()
    assert "You are an agent" in first.locator("details.messages .msg").first.text_content()
    page.screenshot(path=str(tmp_path / "episode.png"), full_page=True)
    assert (tmp_path / "episode.png").stat().st_size > 20_000
    # the group view: the samples side by side, aligned by step index
    page.click("a[href^='#/group/']")
    page.wait_for_selector("#group td.cell")
    assert page.locator("#group tr:first-child th").count() == 1 + 4
    assert page.locator("#group tr").count() - 1 == max(
        t["steps"] for t in logged if t["kind"] == "trajectory" and t["group_id"] == gid)
    page.screenshot(path=str(tmp_path / "group.png"))
    assert (tmp_path / "group.png").stat().st_size > 20_000


def test_page_gui_screenshots_load(page, server):
    page.goto(server)
    page.wait_for_selector("body[data-ready]")
    page.select_option("select[data-f=task]", "desktop-save")
    page.locator("tr.episode-row").first.click()
    page.wait_for_selector("#steps .step img.after")
    shots = "[...document.querySelectorAll('#steps .shots img')]"
    page.wait_for_function(f"() => {shots}.length === 4 && {shots}.every(i => i.complete)", timeout=15_000)
    sizes = page.eval_on_selector_all("#steps .shots img", "imgs => imgs.map(i => i.complete && i.naturalWidth)")
    assert sizes == [320] * 4                   # before and after of two steps, all decoded


def test_page_follows_a_live_run(page, tmp_path):
    run = tmp_path / "live"
    with ThreadPoolExecutor(1) as ex:   # Playwright's sync API holds this thread's event loop
        ex.submit(write_run, run, train_steps=1, tasks_per_step=1, samples=2, gui=False).result()
    httpd = make_server(RunIndex(run), port=0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        page.goto(f"http://127.0.0.1:{httpd.server_address[1]}/")
        page.wait_for_selector("body[data-ready] #episodes tr.episode-row")
        assert page.text_content("#n-episodes") == "2"
        with Recorder(run / "rollouts.jsonl") as rec:
            record_gui_episode(rec, run, "desktop-save@s2")
        page.wait_for_function("document.querySelector('#n-episodes').textContent === '3'", timeout=15_000)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_exported_page_works_from_a_file(page, run, tmp_path):
    dest = export(RunIndex(run), tmp_path / "run.html")
    page.goto(dest.as_uri())
    page.wait_for_selector("body[data-ready] #episodes tr.episode-row")
    page.select_option("select[data-f=task]", "desktop-save")
    page.locator("tr.episode-row").first.click()
    page.wait_for_selector("#steps .step img.after")
    assert page.eval_on_selector_all("#steps img", "imgs => imgs.every(i => i.src.startsWith('data:image/png'))")
    page.goto(dest.as_uri() + "#/group/logs-000%40s1")
    page.wait_for_selector("#group td.cell")


# -- held-out success, held-out episodes, the grader, axes and gaps, success apart from the ending --
def test_heldout_episodes_are_recorded_apart_with_the_graders_details(graded):
    logged = read_jsonl(graded / "rollouts.jsonl")
    held = [r for r in logged if r["kind"] == "trajectory" and r.get("heldout")]
    assert sorted((r["task_id"], r["train_step"]) for r in held) == [(f"held-00{i}", k) for i in (0, 1) for k in (0, 1, 2)]
    assert all(r.get("heldout") for r in logged if r["group_id"].split("@")[1].startswith("eval"))
    failed = [r for r in logged if r["kind"] == "trajectory" and r["outcome"] == 0]
    assert failed and all(r["grade"]["reason"] == "./fix.sh was never run" and "log_tail" in r["grade"] for r in failed)
    index = RunIndex(graded)
    index.refresh()
    eps = index.overview()["episodes"]
    assert sorted((e["task_id"], e["train_step"]) for e in eps if e["heldout"]) == sorted((r["task_id"], r["train_step"]) for r in held)
    quitter = next(e for e in eps if e["task_id"] == "quitter")
    assert quitter["reason"] == "./fix.sh was never run"
    assert index.episode(quitter["id"])["grade"]["tests"] == {"test_worker_ok": "failed"}


def test_page_heldout_success_first_and_heldout_episodes_listed(page, graded):
    metrics = read_jsonl(graded / "metrics.jsonl")
    last = [r for r in metrics if "eval/success" in r][-1]
    with serving(graded) as url:
        page.goto(url)
        page.wait_for_selector("body[data-ready] #episodes tr.episode-row")
        assert page.locator(".charts").first.locator(".chart").first.get_attribute("data-metric") == "eval/success"
        assert page.text_content("#counts .stat:first-child") .startswith(f"held-out success (step {last['step']})")
        assert page.text_content("#heldout-success") == f"{100 * last['eval/success']:.1f}%"
        page.select_option("select[data-f=split]", "held-out")
        rows = page.locator("tr.episode-row")
        assert rows.count() == 6 and rows.locator(".pill.heldout").count() == 6


def test_page_charts_have_y_ticks_and_a_step_that_trained_nothing_is_a_gap(page, graded):
    with serving(graded) as url:
        page.goto(url)
        page.wait_for_selector("body[data-ready] .chart")
        charts = page.locator(".chart")
        assert charts.count() >= 5
        for i in range(charts.count()):
            ticks = [float(t) for t in charts.nth(i).locator("text.ytick").all_text_contents()]
            assert len(ticks) >= 3 and ticks == sorted(ticks), ticks
        std = page.locator(".chart[data-metric='advantage/std']")
        assert [c.get_attribute("data-step") for c in std.locator("circle").all()] == ["1", "2"]
        assert std.locator("rect.gap[data-step='3']").count() == 1
        # measured at step 3 all the same: no gap there
        assert page.locator(".chart[data-metric='outcome/mean'] circle[data-step='3']").count() == 1
        page.screenshot(path=str(graded / "overview.png"), full_page=True)


def test_page_shows_success_by_outcome_and_the_ending_neutrally(page, graded):
    with serving(graded) as url:
        page.goto(url)
        page.wait_for_selector("body[data-ready] #episodes tr.episode-row")
        page.select_option("select[data-f=step]", "3")
        rows = {r.locator("td:nth-child(2)").text_content(): r for r in page.locator("tr.episode-row").all()}
        assert set(rows) == {"fixer", "quitter"}
        fixer, quitter = rows["fixer"], rows["quitter"]
        assert fixer.locator(".pill.result").text_content() == "success" and fixer.locator(".pill.end").text_content() == "truncated"
        assert quitter.locator(".pill.result").text_content() == "failure" and quitter.locator(".pill.end").text_content() == "finished"
        color = "el => getComputedStyle(el).backgroundColor"
        assert fixer.locator(".pill.end").evaluate(color) == quitter.locator(".pill.end").evaluate(color)
        assert fixer.locator(".pill.result").evaluate(color) != quitter.locator(".pill.result").evaluate(color)
        quitter.click()
        page.wait_for_selector("#steps .step")
        assert page.locator("#episode-title .pill.result").text_content() == "failure"
        assert "./fix.sh was never run" in page.text_content("#grade .reason")
        assert "AssertionError: worker 3 still fails" in page.text_content("#grade")
        page.screenshot(path=str(graded / "episode.png"), full_page=True)
