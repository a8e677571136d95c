"""Test doubles that stand in for models, for tests and benchmarks on machines without a GPU.

* :class:`ScriptedOpenAIServer` -- a real HTTP server on 127.0.0.1 that speaks
  the OpenAI chat-completions API and answers from a script. It stands in for
  an LLM server (vLLM, SGLang), which cannot run on a CPU-only machine, so the
  client, retry, judge and loop code is exercised over a real socket.
* :class:`ScriptedPolicy` -- a :class:`~agents.policy.Policy` that stands in
  for a model: it answers from a script after a fixed delay.
* :func:`taught_policy` -- the tiny model overfit on a script: a real model
  (served by path, trained, saved) that writes the scripted answers.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Callable

from nextstate.agents.policy import Generation, Policy

if TYPE_CHECKING:
    from nextstate.agents.hf_policy import HFPolicy


@dataclass
class Reply:
    """One scripted answer.

    ``content``: the text of every choice (a list: one per choice; a string is
    repeated for ``n`` choices). ``status >= 400`` sends an error body instead,
    with ``error`` as its message.
    ``ids``: ``"vllm"`` or ``"sglang"`` adds token ids and log-probs in that
    server's shape (ids are the UTF-8 bytes, as in the tiny tokenizer).
    """

    content: str | list[str] = ""
    status: int = 200
    delay: float = 0.0
    tool_calls: list[dict] | None = None
    ids: str | None = None
    finish_reason: str = "stop"
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""


Script = Callable[[dict], "Reply | str | list[str]"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # many clients connect at once (the default backlog is 5)


def _fake_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _choice(i: int, text: str, reply: Reply, request: dict) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": reply.finish_reason}
    ids = _fake_ids(text)
    lps = [-0.5 - (t % 7) / 10 for t in ids]
    if reply.ids == "vllm":
        choice["token_ids"] = ids
        if request.get("logprobs"):
            as_ids = request.get("return_tokens_as_token_ids")
            choice["logprobs"] = {"content": [
                {"token": f"token_id:{t}" if as_ids else chr(t), "logprob": lp}
                for t, lp in zip(ids, lps)]}
    elif reply.ids == "sglang":
        choice["prompt_token_ids"] = _fake_ids(json.dumps(request.get("messages")))
        choice["meta_info"] = {"output_token_logprobs": [[lp, t, chr(t)] for t, lp in zip(ids, lps)]}
    return choice


class ScriptedOpenAIServer:
    """A test double standing in for an LLM server (which cannot run on this CPU machine).

    A stdlib ``ThreadingHTTPServer`` on 127.0.0.1, port chosen by the OS,
    serving ``POST /v1/chat/completions`` and ``GET /v1/models`` from a thread.
    ``script(request_body)`` returns a :class:`Reply`, a string (every choice's
    text) or a list of strings (one per choice); a list of those instead of a
    callable is played in order, one per request, the last one repeating.
    ``requests`` keeps every request body received; ``max_in_flight`` is the most
    completion requests it was answering at once. ``models``: the names
    ``GET /v1/models`` lists, or an HTTP status it fails with.

    ``with ScriptedOpenAIServer(lambda req: "\\\\boxed{1}") as server: server.url``
    """

    def __init__(self, script: Script | list[Any] | str | Reply, model: str = "scripted-model",
                 delay: float = 0.0, models: list[str] | int | None = None):
        self.model, self.delay = model, delay
        self.models = [model] if models is None else models
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        if callable(script):
            self._script: Script = script
        else:
            queue = list(script) if isinstance(script, list) else [script]

            def play(_req: dict) -> Any:
                with self._lock:
                    return queue.pop(0) if len(queue) > 1 else queue[0]
            self._script = play
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def _answer(self, request: dict) -> tuple[int, dict, dict[str, str], float]:
        reply = self._script(request)
        if not isinstance(reply, Reply):
            reply = Reply(content=reply)
        delay = self.delay + reply.delay
        if reply.status >= 400:
            return reply.status, {"error": {"message": reply.error or f"scripted error {reply.status}"}}, \
                reply.headers, delay
        n = int(request.get("n") or 1)
        texts = reply.content if isinstance(reply.content, list) else [reply.content] * n
        body: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
            "created": int(time.time()), "model": self.model,
            "choices": [_choice(i, t, reply, request) for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
        if reply.ids == "vllm":
            body["prompt_token_ids"] = _fake_ids(json.dumps(request.get("messages")))
        return 200, body, reply.headers, delay

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, status: int, body: dict, headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    if isinstance(server.models, int):
                        self._send(server.models, {"detail": "scripted failure"}, {})
                    else:
                        self._send(200, {"object": "list", "data": [{"id": m} for m in server.models]}, {})
                else:
                    self._send(404, {"error": {"message": "not found"}}, {})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}}, {})
                    return
                with server._lock:
                    server.requests.append(request)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, body, headers, delay = server._answer(request)
                    if delay:
                        time.sleep(delay)
                    self._send(status, body, headers)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)
                finally:
                    with server._lock:
                        server.in_flight -= 1

        return Handler

    def start(self) -> "ScriptedOpenAIServer":
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="scripted-openai-server")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> "ScriptedOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ScriptedPolicy(Policy):
    """Stands in for a model in tests and benchmarks: it does not think, it replays a script.

    ``script`` is a list of answers (answer ``k`` is given when the prompt
    already holds ``k`` assistant turns; the last one repeats) or a callable
    ``(messages) -> text``. Each answer arrives after ``delay`` seconds (a
    stand-in for generation time) with token ids from the tiny tokenizer and
    uniform log-probs over its vocabulary.
    """

    def __init__(self, script: list[str] | Callable[[list[dict]], str], delay: float = 0.0,
                 name: str = "scripted"):
        from nextstate.agents.tiny import load_tokenizer
        self.script, self.delay, self.name = script, delay, name
        self.tokenizer = load_tokenizer()
        self.calls = 0

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The tiny tokenizer's chat template applied to ``messages``, ready for the answer."""
        return list(self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                                       add_generation_prompt=True, return_dict=False))

    async def generate(self, messages: list[dict], tools: list[dict] | None = None,
                       **sampling: Any) -> Generation:
        self.calls += 1
        if callable(self.script):
            text = self.script(messages)
        else:
            turn = sum(m["role"] == "assistant" for m in messages)
            text = self.script[min(turn, len(self.script) - 1)]
        if self.delay:
            await asyncio.sleep(self.delay)
        prompt = self.prompt_ids(messages, tools)
        response = self.tokenizer.encode(text, add_special_tokens=False)
        uniform = -math.log(len(self.tokenizer))
        return Generation(text=text, prompt_ids=prompt, response_ids=response,
                          logprobs=[uniform] * len(response), ids_from_server=True)


def taught_policy(script: list[tuple[list[dict], str]], tools: list[dict] | None = None, *,
                  max_new_tokens: int = 48, steps: int = 120) -> "HFPolicy":
    """The tiny model overfit on ``script`` (pairs of messages and the answer to write after them,
    with ``tools``), so that it writes each answer, greedily: a stand-in for a model that follows
    a task (the untaught tiny model writes no tool call). ``steps`` Adam steps (lr 1e-2) on the
    pairs in turn, each answer followed by ``<|im_end|>``."""
    import torch

    from nextstate.agents.hf_policy import HFPolicy

    policy = HFPolicy("tiny", max_new_tokens=max_new_tokens)
    tok, model = policy.tokenizer, policy.model
    rows = []
    for messages, text in script:
        prompt = policy.prompt_ids(messages, tools)
        answer = tok.encode(f"{text}<|im_end|>", add_special_tokens=False)
        labels = [-100] * len(prompt) + answer
        rows.append((torch.tensor([prompt + answer]), torch.tensor([labels])))
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        ids, labels = rows[step % len(rows)]
        opt.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
    model.eval()
    return policy
