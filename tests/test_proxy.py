"""train.proxy with the real ``openai`` SDK against the tiny model, served over a real socket."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
import torch

from nextstate.agents.hf_policy import HFPolicy
from nextstate.agents.testing import taught_policy
from nextstate.judges.rules import RuleJudge, rule_vote, text_state
from nextstate.train.config import Config
from nextstate.train.proxy import ProxyTrainer, TrainingProxy, serving, split_tool_calls
from nextstate.train.sessions import Session, SessionTable, Turn

ROOT = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))   # the caller's path kept
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "rollouts.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def wait_for(check, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


# -- pure parts ----------------------------------------------------------------------------------
def test_rule_judge_reads_text_next_states():
    assert rule_vote(text_state("<returncode>2</returncode>\nls: x"))[0] == -1
    assert rule_vote(text_state("Traceback (most recent call last):\n  ..."))[0] == -1
    assert rule_vote(text_state("exit code: 0\nhello"))[0] == 1
    assert rule_vote(text_state("All 3 tests passed"))[0] == 1
    assert rule_vote(text_state("Sure, what next?"))[0] == 0
    assert rule_vote({"valid": True, "exit_code": 0})[0] == 1   # structured env states: as before


def test_split_tool_calls():
    content, calls = split_tool_calls('ok <tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>')
    assert content == "ok" and calls[0]["function"] == {"name": "bash", "arguments": '{"cmd": "ls"}'}
    assert split_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_sessions_prefix_match_and_rewrites():
    from nextstate.agents.policy import Generation
    from nextstate.train.sessions import Turn
    table = SessionTable()
    task = [{"role": "user", "content": "task"}]
    a, _ = table.claim(task, None)
    b, _ = table.claim(task, None)
    assert a is not b   # same first request: two sessions
    table.add(a, Turn(0, task, Generation("A"), {"role": "assistant", "content": "A"}, 1.0))
    table.add(b, Turn(0, task, Generation("B"), {"role": "assistant", "content": "B"}, 1.0))
    s, prev = table.claim(task + [{"role": "assistant", "content": "B"}, {"role": "user", "content": "ok"}], None)
    assert s is b and prev.next_messages == [{"role": "user", "content": "ok"}] and not prev.rewritten
    s, prev = table.claim(task + [{"role": "assistant", "content": "A, edited"}, {"role": "user", "content": "x"}], None)
    assert s is a and prev.rewritten   # only a's turn was still waiting: continued, but changed
    table.add(a, Turn(1, task, Generation("C"), {"role": "assistant", "content": "C"}, 1.0))
    s, prev = table.claim(task + [{"role": "user", "content": "no tool call found"}], None)
    assert s is a and prev.dropped and not prev.rewritten and prev.next_messages[0]["content"] == "no tool call found"



def test_an_ended_or_taken_turn_is_not_continued():
    """Unnamed sessions are found through an index of waiting turns: ending a session or taking
    its turn (an outcome reported) takes it out, and a request then starts a new session."""
    from nextstate.agents.policy import Generation
    from nextstate.train.sessions import Turn
    table = SessionTable()
    task = [{"role": "user", "content": "task"}]
    answer = {"role": "assistant", "content": "A"}
    a, b, c = (table.claim(task, None)[0] for _ in range(3))
    for s in (a, b, c):
        table.add(s, Turn(0, task, Generation("A"), answer, 1.0))
    table.end(a)
    assert table.pop_last(b).reply == answer and b.last is None
    later = task + [answer, {"role": "user", "content": "ok"}]
    s, prev = table.claim(later, None)
    assert s is c and prev.next_messages == [{"role": "user", "content": "ok"}]
    s, prev = table.claim(later, None)
    assert s not in (a, b, c) and prev is None and a.last is not None   # an ended session keeps its last turn

# -- served --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Iterator[tuple[str, TrainingProxy]]:
    """A proxy that serves, records and judges by rule, without training."""
    out = tmp_path_factory.mktemp("plain")
    proxy = TrainingProxy(HFPolicy("tiny", max_new_tokens=64), out, judge=RuleJudge(), model_name="tiny",
                          max_tokens=64)
    with serving(proxy) as url:
        yield url, proxy


def test_plain_and_streamed_answers(plain):
    url, _ = plain
    c = client(url)
    msgs = [{"role": "user", "content": "list the files"}]
    raw = c.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=24, seed=7)
    whole = raw.parse()
    assert raw.headers["x-policy-version"] == "0" and whole.system_fingerprint == "v0"
    stream = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, seed=7, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    pieces = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert "".join(pieces) == whole.choices[0].message.content   # same seed, same weights: same tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    if whole.usage.completion_tokens >= 4:
        assert len(pieces) >= 2   # sent as sampled, not in one piece at the end
    assert [m.id for m in c.models.list().data] == ["tiny"]


def test_bad_requests_get_one_line_400s(plain):
    url, _ = plain
    base = url.rsplit("/v1", 1)[0]
    bad = {"not json": b"{nope", "empty": json.dumps({"messages": []}).encode(),
           "role": json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(),
           "max_tokens": json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}).encode(),
           "n": json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(),
           "content": json.dumps({"messages": [{"role": "user", "content": 5}]}).encode()}
    for name, body in bad.items():
        r = httpx.post(f"{url}/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, name
        message = r.json()["error"]["message"]
        assert message and "\n" not in message, name
    r = httpx.post(f"{url}/chat/completions", content=b"x" * (5 << 20))
    assert r.status_code == 413
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client(url).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=0)
    assert httpx.post(f"{url}/sessions/nobody/outcome", json={"outcome": 1}).status_code == 404
    assert httpx.get(f"{base}/health").json()["turns"]["main"] >= 0   # still serving


def test_sessions_interleaved_with_and_without_headers(plain):
    """Six sessions at once, three named by header, three not, all with the same first request."""
    url, proxy = plain
    c = client(url)
    first = [{"role": "user", "content": "fix the bug"}]

    def play(k: int) -> list[str]:
        headers = {"X-Session-Id": f"named-{k}"} if k % 2 == 0 else {}
        msgs, seen = list(first), []
        for turn in range(3):
            raw = c.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=8,
                                                              extra_headers=headers)
            seen.append(raw.headers["x-session-id"])
            msgs += [raw.parse().choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool" if turn else "user", "content": f"exit code: {k % 3}", "tool_call_id": "c"}
                     if turn else {"role": "user", "content": f"error in session {k}"}]
        return seen

    with ThreadPoolExecutor(6) as pool:
        ids = list(pool.map(play, range(6)))
    for k, seen in enumerate(ids):
        assert len(set(seen)) == 1, seen   # every turn found its own session
        if k % 2 == 0:
            assert seen[0] == f"named-{k}"
    assert len({s[0] for s in ids}) == 6
    for k, seen in enumerate(ids):
        s = proxy.sessions.get(seen[0])
        assert s.turns == 3 and s.history[0]["next_state"]["output"] == f"error in session {k}"


def test_concurrent_requests_on_one_named_session_branch(plain):
    """Two requests with the same X-Session-Id at once (generation held until both are in
    flight): the second cannot hold the first's answer, so it starts a branch; each client then
    continues its own branch, and no turn overwrites another."""
    url, proxy = plain
    c = client(url)
    first = [{"role": "user", "content": "two workers, one session"}]
    both_sent = ThreadPoolExecutor(2)

    def turn(msgs: list[dict], seed: int) -> tuple[dict, str]:
        raw = c.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=8, seed=seed,
                                                          extra_headers={"X-Session-Id": "twin"})
        return raw.parse().choices[0].message.model_dump(exclude_none=True), raw.headers["x-session-id"]

    with proxy.policy.lock:   # no generation runs until both requests have been claimed
        futures = [both_sent.submit(turn, first, seed) for seed in (1, 2)]
        wait_for(lambda: sum(s.inflight for s in proxy.sessions.named.get("twin", [])) == 2, "two requests in flight")
    answers = [f.result() for f in futures]
    assert [sid for _, sid in answers] == ["twin", "twin"]

    def go_on(k: int) -> None:
        msgs = first + [answers[k][0], {"role": "user", "content": f"feedback for worker {k}"}]
        for t in range(2):
            reply, _ = turn(msgs, 10 * k + t)
            msgs += [reply, {"role": "user", "content": f"more for worker {k}"}]

    list(both_sent.map(go_on, (0, 1)))
    branches = proxy.sessions.named["twin"]
    assert sorted(b.group_id for b in branches) == ["twin", "twin#2"]
    assert [b.turns for b in branches] == [3, 3] and all(b.inflight == 0 for b in branches)
    assert sorted(b.history[0]["next_state"]["output"] for b in branches) == \
        ["feedback for worker 0", "feedback for worker 1"]


def test_a_client_that_disconnects_mid_stream(tmp_path):
    """A real socket closed after the first chunks: the generation is cancelled (its row leaves
    the batch), the turn is recorded as aborted and not trained on, and the server keeps serving."""
    import socket
    policy = HFPolicy("tiny", max_new_tokens=1500)
    msgs = [{"role": "user", "content": "write a long story"}]
    # a seed whose first 300 sampled tokens hold no end of sequence (seeded: the same when streamed)
    seed = next(s for s in range(40)
                if asyncio.run(policy.generate(msgs, max_tokens=300, seed=s)).finish_reason == "length")
    proxy = TrainingProxy(policy, tmp_path, judge=RuleJudge(), model_name="tiny", max_tokens=1500)
    with serving(proxy) as url:
        host, port = url.split("//")[1].split("/")[0].split(":")
        body = json.dumps({"model": "tiny", "messages": msgs, "max_tokens": 1500, "seed": seed, "stream": True})
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nX-Session-Id: gone\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
            got = b""
            while got.count(b"data: ") < 3:   # the role, then two pieces of text
                got += sock.recv(4096)
        assert b"200 OK" in got.split(b"\r\n")[0]
        wait_for(lambda: proxy.turns.get("aborted") == 1, "the aborted turn")
        wait_for(lambda: policy.cancelled == 1, "the cancelled row")
        session = proxy.sessions.get("gone")
        assert session.turns == 0 and session.inflight == 0 and session.last is None
        after = client(url).chat.completions.create(model="tiny", messages=msgs, max_tokens=4,
                                                    extra_headers={"X-Session-Id": "gone"})
        assert after.choices[0].message.role == "assistant"   # still serving, the same session goes on
        assert proxy.sessions.get("gone").turns == 1
    aborted = [s for s in records(tmp_path, "step") if s.get("aborted")]
    assert len(aborted) == 1 and aborted[0]["group_id"] == "gone" and aborted[0]["aborted"].startswith("the client")
    assert aborted[0]["text"]   # what was streamed before it left


# -- tool calls: a tiny model taught one tool call ---------------------------------------------------
def _taught_policy(arguments: dict | None = None, contexts: list[list[dict]] | None = None,
                   tools: list[dict] = TOOLS) -> HFPolicy:
    """The tiny model overfit on one bash tool call after each of ``contexts`` (with ``tools``),
    so that it writes one."""
    call = json.dumps({"name": "bash", "arguments": arguments or {"cmd": "ls"}})
    contexts = contexts or [[{"role": "user", "content": "list the files"}]]
    return taught_policy([(messages, f"<tool_call>{call}</tool_call>") for messages in contexts], tools)


def test_tool_calls_plain_streamed_and_sent_back(tmp_path):
    policy = _taught_policy()
    proxy = TrainingProxy(policy, tmp_path, judge=RuleJudge(), model_name="tiny", max_tokens=48)
    msgs = [{"role": "user", "content": "list the files"}]
    direct = asyncio.run(policy.generate(msgs, TOOLS, temperature=0))
    _, expected = split_tool_calls(direct.text)
    assert expected, f"the taught model wrote no tool call: {direct.text!r}"
    with serving(proxy) as url:
        c = client(url)
        raw = c.chat.completions.with_raw_response.create(model="tiny", messages=msgs, tools=TOOLS, temperature=0)
        answer = raw.parse().choices[0]
        assert answer.finish_reason == "tool_calls"
        assert [(t.function.name, json.loads(t.function.arguments)) for t in answer.message.tool_calls] == \
            [(e["function"]["name"], json.loads(e["function"]["arguments"])) for e in expected]
        calls: dict[int, dict] = {}
        for ch in c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, temperature=0, stream=True):
            for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                calls.setdefault(d.index, {"name": "", "arguments": ""})
                calls[d.index]["name"] += d.function.name or ""
                calls[d.index]["arguments"] += d.function.arguments or ""
        assert [c_["name"] for c_ in calls.values()] == [t.function.name for t in answer.message.tool_calls]
        # the history goes back with the tool call and its result: the same session continues
        call = answer.message.tool_calls[0]
        history = msgs + [answer.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nexit code: 0"}]
        raw2 = c.chat.completions.with_raw_response.create(model="tiny", messages=history, tools=TOOLS, temperature=0)
        assert raw2.headers["x-session-id"] == raw.headers["x-session-id"]
    steps = records(tmp_path, "step")
    first = next(s for s in steps if s["group_id"] == raw.headers["x-session-id"] and s["step"] == 0)
    assert first["next_state"]["exit_code"] == 0 and first["rewritten"] is False
    judged = [j for j in records(tmp_path, "judge") if j["group_id"] == raw.headers["x-session-id"]]
    assert [j["votes"] for j in judged] == [[1]]


# -- training ---------------------------------------------------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities are Linux's")
def test_the_learner_thread_runs_below_serving(tmp_path):
    """Serving first: the learner's thread (where PPO steps run) has a lower CPU priority."""
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    if own + 3 > 19:
        pytest.skip("this process already runs at the lowest priorities")
    trainer = ProxyTrainer(HFPolicy("tiny", max_new_tokens=4), Config(), tmp_path, batch=1, save_every=1, nice=3)
    try:
        learner = trainer.executor.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert learner.result() == own + 3
    finally:
        trainer.close()


def test_turns_offered_during_a_step_train_right_after_it(tmp_path):
    """A turn judged while a PPO step runs starts the next step when that one ends, without
    waiting for another offer (the last turns of a run would otherwise never train)."""
    policy = HFPolicy("tiny", max_new_tokens=4)
    trainer = ProxyTrainer(policy, Config(), tmp_path, batch=1, save_every=100)
    msgs = [{"role": "user", "content": "run the tests"}]
    gen = asyncio.run(policy.generate(msgs, None, max_tokens=4))
    session = Session("s", "s", keyed=True)
    gate = threading.Event()
    trainer.executor.submit(gate.wait)   # the learner thread is busy until the gate opens
    try:
        for i, vote in enumerate((1.0, -1.0)):
            trainer.offer(session, Turn(i, msgs, gen, {"role": "assistant", "content": gen.text}, 1.0), vote, None)
        assert trainer.busy.is_set() and len(trainer.ready) == 1   # the first step waits; the second turn too
        gate.set()
        wait_for(lambda: trainer.steps >= 1 and not trainer.busy.is_set(), "the training steps")
        assert trainer.steps == 2 and trainer.ready == []
    finally:
        gate.set()
        trainer.close()


def test_training_swaps_weights_and_the_version_header_shows_it(tmp_path):
    cfg = Config()
    cfg.train.kl_coef, cfg.train.lr = 0.0, 1e-3
    policy = HFPolicy("tiny", max_new_tokens=16)
    trainer = ProxyTrainer(policy, cfg, tmp_path, batch=2, save_every=1)
    proxy = TrainingProxy(policy, tmp_path, judge=RuleJudge(), trainer=trainer, model_name="tiny", max_tokens=16)
    before = [p.detach().clone() for p in policy.model.parameters()]
    with serving(proxy) as url:
        c = client(url)
        msgs = [{"role": "user", "content": "run the tests"}]
        versions = []
        for feedback in ("error: no such file", "exit code: 0"):
            raw = c.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=16,
                                                              extra_headers={"X-Session-Id": "t"})
            versions.append(int(raw.headers["x-policy-version"]))
            msgs += [raw.parse().choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": feedback}]
        raw = c.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=16,
                                                          extra_headers={"X-Session-Id": "t"})
        assert httpx.post(f"{url}/sessions/t/outcome", json={"outcome": 1.0}).status_code == 200
        wait_for(lambda: trainer.steps >= 1 and not trainer.busy.is_set(), "a training step")
        # requests during and after the swap are served (none refused), by the new weights
        later = c.chat.completions.with_raw_response.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                            max_tokens=4)
        assert versions == [0, 0] and int(later.headers["x-policy-version"]) == trainer.steps >= 1
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["batch/samples"] == 2 and "train/pg_loss" in rows[0]
    assert (tmp_path / "curves.png").exists() and (tmp_path / "checkpoints" / "step_000001" / "meta.json").exists()
    from nextstate.viewer import RunIndex
    index = RunIndex(tmp_path)
    index.refresh()
    named = [e for e in index.episodes if e.group_id == "t"]
    assert [(e.outcome, e.length) for e in named] == [(1.0, 3)]


def _opd_session(url: str) -> None:
    """Session "o": an error after turn 0 (a rule hint), success after turn 1, outcome +1 after turn 2."""
    c = client(url)
    msgs = [{"role": "user", "content": "run the tests"}]
    for feedback in ("cat: /app/x: No such file or directory", "exit code: 0\nok"):
        answer = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, extra_headers={"X-Session-Id": "o"})
        msgs += [answer.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": feedback}]
    c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, extra_headers={"X-Session-Id": "o"})
    assert httpx.post(f"{url}/sessions/o/outcome", json={"outcome": 1.0}).status_code == 200


# hand-checked: RuleHints' hint is the error's last line; teacher_messages appends it to the turn's user message
HINTED_PROMPT = [{"role": "user", "content": "run the tests\n\n[hint from the next state]\n"
                                             "cat: /app/x: No such file or directory"}]


@pytest.mark.parametrize("mode", ["opd", "combine"])
def test_opd_and_combine_through_the_proxy(tmp_path, mode):
    """The next state of turn 0 reports an error: the rule hint source hints it, and its teacher
    context is its prompt with the hint. ``opd`` trains that turn alone (advantage 0 + the
    teacher's token advantages: one step with --batch 1); ``combine`` adds the vote's advantage
    (turn 0: -1 and the teacher, turn 1: +1, turn 2: the outcome +1)."""
    from nextstate.judges.rules import RuleHints
    cfg = Config()
    cfg.train.kl_coef, cfg.train.lr, cfg.opd.mode = 0.0, 1e-3, mode
    policy = HFPolicy("tiny", max_new_tokens=8)
    trainer = ProxyTrainer(policy, cfg, tmp_path, batch=1 if mode == "opd" else 100, save_every=100)
    proxy = TrainingProxy(policy, tmp_path, judge=RuleJudge(), hinter=RuleHints(), trainer=trainer,
                          model_name="tiny", max_tokens=8)
    before = [p.detach().clone() for p in policy.model.parameters()]
    with serving(proxy) as url:
        _opd_session(url)
        wait_for(lambda: not proxy.pending and not trainer.busy.is_set(), "the judges and the learner")
    hints = {h["step"]: h["hint"] for h in records(tmp_path, "hint")}
    assert hints == {0: "cat: /app/x: No such file or directory", 1: None}
    teacher = policy.prompt_ids(HINTED_PROMPT)
    if mode == "opd":
        assert trainer.steps == 1 and trainer.counts == {"judged": 3, "zero": 2, "untrainable": 0, "hinted": 1, "grouped": 0}
        row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
        assert row["opd/scored_samples"] == 1 and row["opd/hinted_samples"] == 1 and row["batch/samples"] == 1
        assert math.isfinite(row["opd/teacher_gap_mean"])
        adv = [json.loads(x) for x in (tmp_path / "advantages.jsonl").read_text().splitlines()]
        assert [(a["step"], a["advantage"], a["hint"]) for a in adv] == [(0, 0.0, hints[0])]
        assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    else:
        ready = [(t.index, a, h == teacher if h else None) for _, t, a, _, h in trainer.ready]
        assert sorted(ready) == [(0, -1.0, True), (1, 1.0, None), (2, 1.0, None)]


# -- the command line ---------------------------------------------------------------------------------
def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "train.proxy", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": PYTHONPATH},
                            **kw)


def test_cli_refuses_a_bad_hint_source(tmp_path):
    proc = _cli("--model", "tiny", "--output", str(tmp_path), "--mode", "opd", "--hint-source", "oracle")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "--hint-source must be" in out


@pytest.mark.slow
def test_cli_key_and_ctrl_c_saves_and_exits_130(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _cli("--model", "tiny", "--output", str(tmp_path), "--port", str(port), "--api-key", "sekrit",
                "--batch", "1", "--max-tokens", "8", "--set", "train.lr=1e-3")
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_for(lambda: _up(url), "the server")
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").models.list()
        c = client(url, "sekrit")
        msgs = [{"role": "user", "content": "go"}]
        first = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8)
        msgs += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "error"}]
        c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8)
        wait_for(lambda: httpx.get(url.rsplit("/v1", 1)[0] + "/health",
                                   headers={"Authorization": "Bearer sekrit"}).json()["trained_steps"] >= 1, "a step")
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert (tmp_path / "checkpoints" / "step_000001" / "meta.json").exists()
    assert records(tmp_path, "trajectory")[0]["status"] == "truncated"


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/models").status_code in (200, 401)
    except httpx.HTTPError:
        return False


# -- mini-swe-agent, unmodified ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.docker
def test_mini_swe_agent_trains_through_the_proxy(tmp_path, monkeypatch):
    """mini-swe-agent 2.4.6, unmodified (litellm to an OpenAI-compatible base URL; mini.yaml's
    observation and format-error messages; a short task prompt from its config), runs a task in
    a Docker container against the proxy, without session headers. The tiny model is first
    taught to write a bash tool call (untaught it writes none, and every turn is a format error),
    and answers greedily (sampled, the barely taught model breaks the call most of the time)."""
    pytest.importorskip("minisweagent")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")   # no download of litellm's price list
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.environments.docker import DockerEnvironment
    from minisweagent.models.litellm_model import LitellmModel
    from minisweagent.models.utils.actions_toolcall import BASH_TOOL

    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    config["agent"].update(system_template="You can run bash commands.", mode=None, step_limit=5, cost_limit=0,
                           instance_template="{{task}} Answer with one bash tool call.")
    task = "List the files in the root directory."
    start = [{"role": "system", "content": "You can run bash commands."},
             {"role": "user", "content": f"{task} Answer with one bash tool call."}]
    ran = start + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls /"}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": '{"returncode": 0, "output": "bin"}'}]
    policy = _taught_policy({"command": "ls /"}, [start, ran], [BASH_TOOL])
    cfg = Config()
    cfg.train.kl_coef, cfg.train.lr = 0.0, 1e-3
    trainer = ProxyTrainer(policy, cfg, tmp_path, batch=1, save_every=100)
    proxy = TrainingProxy(policy, tmp_path, judge=RuleJudge(), trainer=trainer, model_name="tiny", max_tokens=48)
    before = [p.detach().clone() for p in policy.model.parameters()]
    with serving(proxy) as url:
        model = LitellmModel(model_name="openai/tiny", cost_tracking="ignore_errors",
                             model_kwargs={"api_base": url, "api_key": "none", "max_tokens": 48, "temperature": 0},
                             observation_template=config["model"]["observation_template"],
                             format_error_template=config["model"]["format_error_template"])
        env = DockerEnvironment(image="nextstate/terminal:latest", timeout=20)
        agent = DefaultAgent(model, env, **config["agent"])
        try:
            result = agent.run(task)
        finally:
            env.cleanup()
        wait_for(lambda: not proxy.pending and not trainer.busy.is_set(), "the judges and the learner")
        status = proxy.status()
    assert status["sessions"] == 1, status   # one session, found by prefix at every turn
    steps = sorted(records(tmp_path, "step"), key=lambda r: r["step"])
    assert [s["step"] for s in steps] == list(range(status["turns"]["main"]))
    observed = [s for s in steps if s["next_state"].get("messages")]
    assert observed and all(s["next_state"]["messages"][0]["role"] in ("tool", "user") for s in observed)
    executed = [s for s in observed if s["next_state"]["messages"][0]["role"] == "tool"]
    assert executed and all('"returncode"' in s["observation"] for s in executed)   # mini's observations
    votes = [j["votes"][0] for j in records(tmp_path, "judge")]
    assert len(votes) == len(observed) and 1 in votes   # the executed call's "returncode": 0
    assert result["exit_status"] in ("LimitsExceeded", "Submitted", "RepeatedFormatError")
    assert trainer.steps == sum(v != 0 for v in votes) >= 1   # --batch 1: a step per non-zero vote
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))


# -- the CPU demo's agent, briefly ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.docker
def test_proxy_agent_plays_reports_outcomes_and_trains(tmp_path):
    """bench.proxy_agent end to end, briefly: the stand-alone agent (the ``openai`` SDK and a
    sandbox) plays 4 training and 2 x 2 held-out episodes against ``python -m train.proxy``
    (the untrained tiny model: no learning is expected, only the plumbing)."""
    from transformers import AutoModelForCausalLM

    from nextstate.agents.tiny import load_tiny
    proc = subprocess.run([sys.executable, "-m", "bench.proxy_agent", "--output", str(tmp_path), "--model", "tiny",
                           "--episodes", "4", "--eval-every", "4", "--heldout", "2", "--parallel", "2", "--batch", "2",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [e["train_episodes"] for e in result["evals"]] == [0, 4] and result["proxy_turns"]["side"] >= 4
    run = tmp_path / "proxy"
    trajectories = records(run, "trajectory")
    assert len(trajectories) == 4 and all(t["outcome"] in (-1.0, 1.0) for t in trajectories)
    assert all(t["group_id"].startswith("train-") for t in trajectories)   # held-out turns are never sessions
    assert result["trained_steps"] >= 1
    saved = sorted((run / "checkpoints").glob("step_*"))[-1] / "model"
    trained = AutoModelForCausalLM.from_pretrained(saved)
    initial, _ = load_tiny(0)
    assert any(not torch.equal(a, b) for a, b in zip(initial.state_dict().values(), trained.state_dict().values()))
