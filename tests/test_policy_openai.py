"""OpenAIPolicy against a real local HTTP server that stands in for vLLM/SGLang."""

from __future__ import annotations

import asyncio

import pytest

from nextstate.agents.openai_policy import OpenAIPolicy, parse_choice
from nextstate.agents import make_policy
from nextstate.agents.policy import PolicyError
from nextstate.agents.testing import Reply, ScriptedOpenAIServer
from nextstate.envs.actions import parse_action

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def policy(server: ScriptedOpenAIServer, **kw) -> OpenAIPolicy:
    kw.setdefault("backoff", 0.01)
    return OpenAIPolicy(server.url, model="m", **kw)


async def test_retries_5xx_then_succeeds():
    with ScriptedOpenAIServer([Reply(status=500), Reply(status=503), Reply(status=429), "fine"]) as s:
        gen = await policy(s).generate(MESSAGES)
    assert gen.text == "fine"
    assert len(s.requests) == 4


async def test_gives_up_after_last_retry_with_clear_error():
    with ScriptedOpenAIServer(Reply(status=502)) as s:
        with pytest.raises(PolicyError, match=r"after 3 attempts: HTTP 502"):
            await policy(s, max_retries=2).generate(MESSAGES)
    assert len(s.requests) == 3


async def test_client_error_is_not_retried():
    with ScriptedOpenAIServer(Reply(status=400)) as s:
        with pytest.raises(PolicyError, match="HTTP 400"):
            await policy(s).generate(MESSAGES)
    assert len(s.requests) == 1


async def test_timeout_is_retried_then_raises():
    with ScriptedOpenAIServer(Reply("late", delay=3.0)) as s:
        with pytest.raises(PolicyError, match="ReadTimeout"):  # the 3 s answer was not waited for
            await policy(s, timeout=0.2, max_retries=1).generate(MESSAGES)
    assert len(s.requests) == 2


async def test_connection_refused_is_retried():
    with ScriptedOpenAIServer("x") as s:
        url = s.url
    p = OpenAIPolicy(url, model="m", backoff=0.01, max_retries=2)
    with pytest.raises(PolicyError, match="ConnectError"):
        await p.generate(MESSAGES)


async def test_vllm_ids_and_logprobs():
    with ScriptedOpenAIServer(Reply("héllo", ids="vllm")) as s:
        gen = await policy(s).generate(MESSAGES, tools=TOOLS, temperature=0.5, max_tokens=7)
    body = s.requests[0]
    assert body["logprobs"] is True and body["return_token_ids"] is True
    assert body["return_tokens_as_token_ids"] is True and body["return_prompt_token_ids"] is True
    assert body["tools"] == TOOLS and body["temperature"] == 0.5 and body["max_tokens"] == 7
    assert gen.ids_from_server
    assert gen.response_ids == list("héllo".encode())
    assert len(gen.logprobs) == len(gen.response_ids) and all(lp <= 0 for lp in gen.logprobs)
    assert gen.prompt_ids and all(isinstance(t, int) for t in gen.prompt_ids)


def test_vllm_ids_from_token_id_strings_only():
    choice = {"message": {"content": "ab"}, "logprobs": {"content": [
        {"token": "token_id:97", "logprob": -0.1}, {"token": "token_id:98", "logprob": -0.2}]}}
    gen = parse_choice({"prompt_token_ids": [1, 2, 3]}, choice, None)
    assert gen.ids_from_server and gen.response_ids == [97, 98] and gen.logprobs == [-0.1, -0.2]


async def test_sglang_ids_and_logprobs():
    with ScriptedOpenAIServer(Reply("abc", ids="sglang")) as s:
        gen = await policy(s).generate(MESSAGES)
    assert gen.ids_from_server and gen.response_ids == [97, 98, 99]
    assert len(gen.logprobs) == 3 and gen.prompt_ids


async def test_no_ids_means_empty_ids_never_retokenized():
    with ScriptedOpenAIServer("just text") as s:
        gen = await policy(s).generate(MESSAGES)
    assert gen.text == "just text"
    assert not gen.ids_from_server
    assert gen.prompt_ids == [] and gen.response_ids == []


async def test_tool_calls_rendered_back_into_text():
    calls = [{"id": "c1", "type": "function",
              "function": {"name": "bash", "arguments": '{"command": "ls -la"}'}}]
    with ScriptedOpenAIServer(Reply("Let me look.", tool_calls=calls)) as s:
        gen = await policy(s).generate(MESSAGES, tools=TOOLS)
    assert gen.text.startswith("Let me look.<tool_call>")
    assert gen.message["tool_calls"] == calls
    call = parse_action(gen.text, TOOLS)
    assert call.name == "bash" and call.arguments == {"command": "ls -la"}


def test_trimmed_stop_string_is_restored():
    choice = {"message": {"content": '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}'},
              "stop_reason": "</tool_call>", "finish_reason": "stop"}
    gen = parse_choice({}, choice, ["</tool_call>"])
    assert gen.text.endswith("</tool_call>")
    assert parse_action(gen.text, TOOLS).arguments == {"command": "ls"}


async def test_complete_asks_n_in_one_request():
    with ScriptedOpenAIServer(lambda req: [f"answer {i}" for i in range(req.get("n", 1))]) as s:
        texts = await policy(s).complete(MESSAGES, n=5, temperature=0.6, max_tokens=32)
    assert texts == [f"answer {i}" for i in range(5)]
    assert len(s.requests) == 1 and s.requests[0]["n"] == 5


async def test_model_name_discovered_and_make_policy():
    with ScriptedOpenAIServer("ok", model="served-name") as s:
        p = make_policy(s.url.removesuffix("/v1"))
        assert isinstance(p, OpenAIPolicy) and p.base_url == s.url
        assert (await p.generate(MESSAGES)).text == "ok"
    assert p.model == "served-name" and s.requests[0]["model"] == "served-name"


async def test_many_concurrent_requests():
    with ScriptedOpenAIServer(Reply("x", delay=1.0)) as s:
        p = policy(s)
        gens = await asyncio.gather(*(p.generate(MESSAGES) for _ in range(32)))
    assert [g.text for g in gens] == ["x"] * 32
    assert s.max_in_flight >= 16, s.max_in_flight  # concurrent (one at a time would be 1)


def test_generate_sync_works_across_event_loops():
    with ScriptedOpenAIServer("ok") as s:
        p = policy(s)
        assert p.generate_sync(MESSAGES).text == "ok"
        assert p.generate_sync(MESSAGES).text == "ok"


async def test_request_ids_off_and_extra_body():
    with ScriptedOpenAIServer("ok") as s:
        p = policy(s, request_ids=False, extra_body={"top_k": 20})
        await p.generate(MESSAGES)
        await p.complete(MESSAGES, n=2)
        p2 = policy(s)
        await p2.complete(MESSAGES, n=2)
    assert "return_token_ids" not in s.requests[0] and s.requests[0]["top_k"] == 20
    assert "logprobs" not in s.requests[1] and "logprobs" not in s.requests[2]


async def test_a_request_given_up_on_has_its_connection_closed_before_the_retry():
    """How a server (vLLM, SGLang) learns to abort the generation nobody waits for: an attempt
    that timed out, and one cancelled by the caller (the judge's own timeout), close their
    connections. A raw socket server records, per connection, whether the client closed it."""
    import socket
    import threading
    import time

    events: list[tuple[str, float]] = []
    server = socket.create_server(("127.0.0.1", 0))

    def hold(conn: socket.socket) -> None:   # read one request, answer nothing, see how it ends
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        while len(body) < length:
            body += conn.recv(65536)
        events.append(("request", time.monotonic()))
        conn.settimeout(30)
        events.append(("closed" if conn.recv(1) == b"" else "data", time.monotonic()))

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=hold, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        policy = OpenAIPolicy(url, model="m", timeout=0.3, max_retries=1, backoff=0.01)
        with pytest.raises(PolicyError, match="after 2 attempts: ReadTimeout"):
            await policy.complete([{"role": "user", "content": "x"}])
        waiting = OpenAIPolicy(url, model="m", timeout=60, max_retries=0)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(waiting.complete([{"role": "user", "content": "x"}]), 0.3)
        deadline = time.monotonic() + 30
        while len(events) < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        server.close()
    kinds = [k for k, _ in sorted(events, key=lambda e: e[1])]
    assert kinds == ["request", "closed"] * 3   # each closed before the next request was sent
