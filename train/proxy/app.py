"""The proxy over HTTP: the FastAPI app of a :class:`~train.proxy.service.TrainingProxy` (one
small handler an endpoint, the bearer key, streamed answers), and uvicorn serving it."""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from nextstate.agents.policy import Generation
from nextstate.train.proxy.service import TrainingProxy
from nextstate.train.proxy.wire import (DONE, BadRequest, ChatRequest, assistant_message, chunk, completion,
                                        finish_reason, parse_request, usage_chunk)
from nextstate.train.sessions import Session

ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}


def make_app(proxy: TrainingProxy) -> FastAPI:
    """The FastAPI app of ``proxy`` (its handlers find it as ``app.state.proxy``); shutting it
    down (Ctrl-C included) closes the proxy: judges awaited, sessions ended, a checkpoint saved."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await proxy.close()

    app = FastAPI(title="nextstate training proxy", lifespan=lifespan)
    app.state.proxy = proxy
    if proxy.api_key:
        app.add_middleware(_BearerKey, key=proxy.api_key,
                           refuse=error("missing or wrong bearer key (Authorization: Bearer <key>)", 401))
    app.get("/v1/models")(models)
    app.get("/health")(health)
    app.post("/v1/sessions/{sid}/outcome")(outcome)
    app.post("/v1/chat/completions")(completions)
    return app


def error(message: str, status: int = 400) -> JSONResponse:
    """An OpenAI-style error: ``{"error": {"message", "type", "code"}}`` with HTTP ``status``."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _one_line(e: Exception) -> str:
    """The reason a request could not be served: the exception's first line, else its type."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _headers(session: Session | None, version: int) -> dict[str, str]:
    """The headers of every answer: its session (when it has one) and the weights' version."""
    return {**({"X-Session-Id": session.id} if session is not None else {}), "X-Policy-Version": str(version)}


async def body_of(request: Request, limit: int) -> bytes:
    """The request's body; one over ``limit`` bytes is a 413 :class:`BadRequest`."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise BadRequest(f"the body is {size} bytes; the limit is {limit}", 413)
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > limit:
            raise BadRequest(f"the body is over the limit of {limit} bytes", 413)
    return bytes(data)


# -- the endpoints ----------------------------------------------------------------------------
async def models(request: Request) -> Any:
    """``GET /v1/models``: the one model served."""
    return {"object": "list", "data": [{"id": request.app.state.proxy.model_name, "object": "model", "created": 0,
                                        "owned_by": "nextstate"}]}


async def health(request: Request) -> Any:
    """``GET /health``: :meth:`TrainingProxy.status`."""
    return request.app.state.proxy.status()


async def outcome(sid: str, request: Request) -> Any:
    """``POST /v1/sessions/{sid}/outcome`` with ``{"outcome": <number>}``: :meth:`TrainingProxy.report`."""
    proxy: TrainingProxy = request.app.state.proxy
    try:
        body = json.loads(await body_of(request, proxy.max_body_bytes))
        value = float(body["outcome"] if "outcome" in body else body["reward"])
    except BadRequest as e:
        return error(str(e), e.status)
    except (ValueError, KeyError, TypeError):
        return error('the body must be {"outcome": <number>}')
    if not math.isfinite(value):
        return error("the outcome must be a finite number")
    try:
        session = proxy.report(sid, value)
    except BadRequest as e:
        return error(str(e), e.status)
    return {"session_id": session.id, "outcome": value, "turns": session.turns}


async def completions(request: Request) -> Any:
    """``POST /v1/chat/completions``: a checked request (:func:`parse_request`) finds its session,
    then gets its answer, whole or streamed."""
    proxy: TrainingProxy = request.app.state.proxy
    try:
        req = parse_request(await body_of(request, proxy.max_body_bytes),
                            {k.lower(): v for k, v in request.headers.items()}, proxy.max_tokens)
    except BadRequest as e:
        return error(str(e), e.status)
    cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    session = await proxy.claim(req)
    if req.stream:
        return await _streamed(proxy, req, session, cid, created)
    return await _whole(proxy, req, session, cid, created)


async def _whole(proxy: TrainingProxy, req: ChatRequest, session: Session | None, cid: str,
                 created: int) -> JSONResponse:
    """The answer in one body; a generation that fails is the session's aborted turn."""
    try:
        gen = await proxy.answer(req, session)
    except ValueError as e:   # bad sampling values, a template that cannot render the messages
        proxy.abort_turn(req, session, "the request could not be served")
        return error(_one_line(e))
    except BaseException:
        proxy.abort_turn(req, session, "the generation failed")
        raise
    reply = assistant_message(gen.text, req.tools)
    await proxy.record_turn(req, gen, reply, session)
    body = completion(cid, created, proxy.model_name, gen, reply)
    if session is not None:
        body["session_id"] = session.id
    return JSONResponse(body, headers=_headers(session, gen.policy_version))


async def _streamed(proxy: TrainingProxy, req: ChatRequest, session: Session | None, cid: str,
                    created: int) -> Any:
    """The answer as server-sent events (:func:`_events`), once its first piece is sampled (a
    group-sampled answer: once it is chosen, in one piece)."""
    pieces = (_in_one_piece(proxy.answer(req, session)) if proxy.grouped(req, session)
              else proxy.policy.stream(req.messages, req.tools, **req.sampling))
    try:
        first = await anext(pieces)
    except ValueError as e:
        proxy.abort_turn(req, session, "the request could not be served")
        return error(_one_line(e))
    except BaseException:   # the client left before the first token (the request is cancelled)
        await pieces.aclose()
        proxy.abort_turn(req, session, "the client disconnected")
        raise
    version = first[1] if isinstance(first, tuple) else first.policy_version
    return _Stream(_events(proxy, req, session, pieces, first, cid, created, version),
                   media_type="text/event-stream", headers={**_headers(session, version), "Cache-Control": "no-cache"})


async def _in_one_piece(answer: Awaitable[Generation]) -> AsyncIterator[tuple[str, int] | Generation]:
    """A whole answer in the shape of :meth:`HFPolicy.stream`: its text as one piece, then itself."""
    gen = await answer
    yield gen.text, gen.policy_version
    yield gen


# -- the bearer key and streamed answers ------------------------------------------------------
class _BearerKey:
    """ASGI middleware that answers ``refuse`` to a request without ``Authorization: Bearer <key>``
    (plain ASGI: Starlette's ``BaseHTTPMiddleware`` costs every request a task group and streams)."""

    def __init__(self, app: Any, key: str, refuse: JSONResponse):
        self.app, self.expected, self.refuse = app, f"Bearer {key}".encode(), refuse

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != self.expected:
            await self.refuse(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _Stream(StreamingResponse):
    """A streaming response that closes its event generator whatever happens: when the client
    disconnects, Starlette cancels the send and leaves the generator suspended; closing it
    cancels the generation and records the turn as aborted (:func:`_events`)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def _events(proxy: TrainingProxy, req: ChatRequest, session: Session | None, pieces: AsyncIterator,
                  first: Any, cid: str, created: int, version: int) -> AsyncIterator[str]:
    """Server-sent events of one streamed answer: the role, text pieces as they are sampled
    (held back from a ``<tool_call>`` tag on when the request has tools), the tool calls, the end."""
    model = proxy.model_name
    sent, text, item = 0, "", first
    done = False
    try:
        yield chunk(cid, created, model, version, {"role": "assistant", "content": ""})
        while True:
            if isinstance(item, tuple):
                text += item[0]
                upto = text.find("<tool_call>") if req.tools else -1
                upto = len(text) if upto < 0 else upto
                if upto > sent:
                    yield chunk(cid, created, model, version, {"content": text[sent:upto]})
                    sent = upto
            else:
                gen: Generation = item
                break
            item = await anext(pieces)
        # the answer is complete: it is the session's turn even if the client leaves now
        reply = assistant_message(gen.text, req.tools)
        await proxy.record_turn(req, gen, reply, session)
        done = True
        for i, call in enumerate(reply.get("tool_calls") or []):
            yield chunk(cid, created, model, version, {"tool_calls": [{"index": i, **call}]})
        yield chunk(cid, created, model, version, {}, finish_reason(gen, reply))
        if req.include_usage:
            yield usage_chunk(cid, created, model, gen)
        yield DONE
    finally:
        if not done:   # the client went away mid-answer: stop sampling, record the turn as aborted
            await pieces.aclose()
            proxy.abort_turn(req, session, "the client disconnected mid-stream", text)


# -- serving ----------------------------------------------------------------------------------
def server_config(app: Any, host: str, port: int) -> "uvicorn.Config":
    """uvicorn's settings for the proxy's app (or another ASGI app). Idle keep-alive connections
    are kept for 75 s, longer than clients keep them (httpx, and so the ``openai`` SDK: 5 s):
    with uvicorn's own 5 s both ends close at the same moment, and a request sent on a connection
    the server is closing fails with "Server disconnected" (a client with ``max_retries=0`` sees a
    connection error)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_keep_alive=75)


@contextlib.contextmanager
def serving(proxy: TrainingProxy | Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The proxy (or another ASGI app: ``bench.proxy``'s plain server) served by uvicorn in a
    background thread (``port`` 0: a free one); yields the base URL (``http://host:port/v1``).
    Leaving the block shuts the server down, which closes the proxy."""
    import uvicorn

    app = make_app(proxy) if isinstance(proxy, TrainingProxy) else proxy
    server = uvicorn.Server(server_config(app, host, port))
    thread = threading.Thread(target=server.run, daemon=True, name="proxy-server")
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the proxy could not start on {host}:{port}")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        thread.join()


def serve(proxy: TrainingProxy, host: str, port: int) -> int:
    """Run the server until Ctrl-C (returns 130) or shutdown (0); the app saves on the way out."""
    import uvicorn

    server = uvicorn.Server(server_config(make_app(proxy), host, port))
    try:
        server.run()   # on a signal: graceful shutdown (the app's lifespan saves), then the signal again
    except KeyboardInterrupt:
        return 130
    return 0

