"""The OpenAI client, the judge and the start-up probes against a real `transformers serve`.

`transformers serve` (the `transformers[serving]` extra; nobody here wrote it) serves the tiny
model, saved to a folder, on 127.0.0.1. It behaves as the issue found it: it refuses the
token-id fields with HTTP 422 "Unexpected fields", ignores ``n`` (one choice per request) and
answers ``GET /v1/models`` with HTTP 500.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "hi"}]


@contextlib.contextmanager
def serving(folder: Path):
    """`transformers serve` on the checkpoint in ``folder`` (offline, a free port), until exit."""
    cli = shutil.which("transformers")
    if cli is None:
        pytest.skip("the transformers CLI is not installed")
    try:
        import fastapi  # noqa: F401
        import openai  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"`transformers serve` needs transformers[serving] ({e})")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = Path(tempfile.mkstemp(prefix="serve-", suffix=".log")[1])
    log = log_path.open("wb")
    proc = subprocess.Popen([cli, "serve", "--host", "127.0.0.1", "--port", str(port), str(folder)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("transformers serve did not start:\n" + log_path.read_text()[-3000:])
            time.sleep(0.5)
        yield {"url": url, "model": str(folder)}
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        log_path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from nextstate.agents.tiny import load_tiny

    folder = tmp_path_factory.mktemp("tiny-served")
    model, tok = load_tiny(0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    with serving(folder) as served:
        yield served


def test_the_server_behaves_as_the_issue_found_it(server):
    """Guards the premise of the tests below: if a newer server changes, they say so."""
    assert httpx.get(server["url"] + "/v1/models", timeout=30).status_code == 500
    r = httpx.post(server["url"] + "/v1/chat/completions", timeout=120, json={
        "model": server["model"], "messages": MESSAGES, "max_tokens": 2, "return_token_ids": True})
    assert r.status_code == 422 and "Unexpected fields" in r.text


async def test_policy_retries_without_token_id_fields_and_logs_once(server, caplog):
    import asyncio

    from nextstate.agents.openai_policy import OpenAIPolicy

    policy = OpenAIPolicy(server["url"], model=server["model"], timeout=120)
    with caplog.at_level(logging.WARNING, logger="nextstate.agents.openai_policy"):
        gens = await asyncio.gather(*(policy.generate(MESSAGES, max_tokens=4) for _ in range(3)))
        gens.append(await policy.generate(MESSAGES, max_tokens=4))
    assert all(g.finish_reason in ("length", "stop") and not g.ids_from_server for g in gens)
    assert all(g.response_ids == [] and g.prompt_ids == [] for g in gens)
    refusals = [r for r in caplog.records if "refuses the token-id fields" in r.getMessage()]
    assert len(refusals) == 1
    await policy.aclose()


async def test_judge_gets_all_its_votes(server, caplog):
    from nextstate.agents.openai_policy import OpenAIPolicy
    from nextstate.judges.prm import JudgeRequest, StepJudge

    judge = StepJudge(OpenAIPolicy(server["url"], model=server["model"], timeout=120), m=3,
                      max_tokens=4, timeout=300)
    req = JudgeRequest("terminal", "print hi", [], {"name": "bash", "arguments": {"command": "echo hi"}},
                       {"valid": True, "output": "hi", "exit_code": 0})
    with caplog.at_level(logging.WARNING, logger="nextstate.agents.openai_policy"):
        result = await judge.judge(req)
    assert result.error is None and len(result.raw) == 3 and len(result.votes) == 3
    assert sum("topping up" in r.getMessage() for r in caplog.records) == 1


def test_train_and_evaluate_need_the_model_name_here(server, tmp_path, capsys):
    from nextstate.train.__main__ import main as train_main
    from nextstate.train.evaluate import main as evaluate_main

    assert train_main(["--env", "terminal", "--judge", server["url"], "--model", "tiny",
                       "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "GET /models failed (HTTP 500" in err and err.endswith("set judge.model=<the served model's name>")
    assert evaluate_main(["--env", "terminal", "--policy", server["url"], "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "GET /models failed (HTTP 500" in err and err.endswith("set --model=<the served model's name>")
    from nextstate.train.wiring import probe_server
    assert probe_server(server["url"], server["model"], "judge.model") == server["model"]


def test_the_converted_smollm2_checkpoint_served_is_a_judge_url():
    """``judge.url`` on `transformers serve` of the smollm2 preset's cached checkpoint: every vote
    comes back (valid or not: what the model says is not checked)."""
    import asyncio

    from nextstate.agents import smollm2
    from nextstate.agents.openai_policy import OpenAIPolicy
    from nextstate.judges.prm import JudgeRequest, StepJudge

    try:
        smollm2.check()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with serving(smollm2.checkpoint()) as served:
        judge = StepJudge(OpenAIPolicy(served["url"], model=served["model"], timeout=300), m=2,
                          max_tokens=16, timeout=600)
        req = JudgeRequest("terminal", "print hi", [], {"name": "bash", "arguments": {"command": "echo hi"}},
                           {"valid": True, "output": "hi", "exit_code": 0})
        result = asyncio.run(judge.judge(req))
    assert result.error is None and len(result.raw) == 2 and all(isinstance(r, str) and r for r in result.raw)
