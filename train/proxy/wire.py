"""The OpenAI wire format of the proxy: a ``/v1/chat/completions`` body parsed and checked
(:func:`parse_request`, :class:`BadRequest` with a one-line reason), an answer as an assistant
message (``<tool_call>`` blocks split into OpenAI tool calls), its finish reason and usage, and
the bodies of a plain answer and of a streamed one's server-sent events."""

from __future__ import annotations

import functools
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from nextstate.agents.policy import Generation
from nextstate.train.sessions import message_keys

ROLES = {"system", "developer", "user", "assistant", "tool"}
TRUE = {"1", "true", "yes", "on"}
DONE = "data: [DONE]\n\n"   # a stream's last event
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class BadRequest(ValueError):
    """A request the proxy refuses (the message is the one-line reason; ``status`` the HTTP code)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# -- requests ---------------------------------------------------------------------------------
@dataclass
class ChatRequest:
    """A validated ``/v1/chat/completions`` body, with the session keys taken out."""

    messages: list[dict]
    tools: list[dict] | None
    sampling: dict[str, Any]
    stream: bool
    include_usage: bool
    session_id: str | None
    turn_type: str
    session_done: bool

    @functools.cached_property
    def keys(self) -> tuple[tuple, ...]:
        """The messages' session-matching keys (:func:`train.sessions.message_keys`), computed once."""
        return message_keys(self.messages)


def _check_message(i: int, m: Any) -> dict:
    if not isinstance(m, dict):
        raise BadRequest(f"messages[{i}] must be an object")
    role = m.get("role")
    if role not in ROLES:
        raise BadRequest(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}, got {role!r}")
    content = m.get("content")
    if content is None and not (role == "assistant" and m.get("tool_calls")):
        raise BadRequest(f"messages[{i}].content is missing")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") in ("text", "image_url") for p in content):
            raise BadRequest(f"messages[{i}].content parts must be text or image_url objects")
    elif content is not None and not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise BadRequest(f"messages[{i}].tool_calls must be a list on an assistant message")
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"messages[{i}].tool_calls entries need function.name")
    out = {k: v for k, v in m.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")}
    if role == "developer":   # chat templates know "system"
        out["role"] = "system"
    return out


def parse_request(raw: bytes, headers: dict[str, str], max_tokens_limit: int) -> ChatRequest:
    """Validate a chat completion body; raises :class:`BadRequest` with a one-line reason."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"the body is not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    messages = [_check_message(i, m) for i, m in enumerate(messages)]
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
                isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str) for t in tools):
            raise BadRequest("tools must be a list of {type: function, function: {name, parameters}}")
        tools = tools or None
    n = body.get("n", 1)
    if n not in (1, None):
        raise BadRequest("n must be 1 (one answer per request)")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = max_tokens_limit
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= max_tokens_limit:
        raise BadRequest(f"max_tokens must be an integer from 1 to {max_tokens_limit}, got {max_tokens!r}")
    temperature = body.get("temperature", 1.0)
    top_p = body.get("top_p", 1.0)
    for name, value, lo, hi in (("temperature", temperature, 0.0, 2.0), ("top_p", top_p, 1e-9, 1.0)):
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not lo <= value <= hi):
            raise BadRequest(f"{name} must be a number from {lo:g} to {hi:g}, got {value!r}")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (
            isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s for s in stop))):
        raise BadRequest("stop must be a string or a list of up to 4 strings")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest("seed must be an integer")
    sampling = {"max_tokens": max_tokens, "temperature": 1.0 if temperature is None else float(temperature),
                "top_p": 1.0 if top_p is None else float(top_p), "stop": stop, "seed": seed}
    turn_type = str(headers.get("x-turn-type") or body.get("turn_type") or "main").strip().lower()
    if turn_type not in ("main", "side"):
        raise BadRequest(f"turn type must be main or side, got {turn_type!r}")
    sid = headers.get("x-session-id") or body.get("session_id")
    if sid is not None and (not isinstance(sid, str) or not 0 < len(sid) <= 200):
        raise BadRequest("the session id must be a string of 1 to 200 characters")
    done = str(headers.get("x-session-done") or body.get("session_done") or "").strip().lower() in TRUE
    options = body.get("stream_options") or {}
    return ChatRequest(messages, tools, sampling, bool(body.get("stream")),
                       bool(isinstance(options, dict) and options.get("include_usage")), sid, turn_type, done)


# -- answers ----------------------------------------------------------------------------------
def split_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """``(content, tool_calls)`` of an answer written with ``<tool_call>{...}</tool_call>``
    blocks, in the OpenAI format; a block that is not a JSON ``{"name", "arguments"}`` object stays text."""
    calls, kept, pos = [], [], 0
    for m in _TOOL_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1).strip())
        except ValueError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
        kept.append(text[pos:m.start()])
        pos = m.end()
    if not calls:
        return text, []
    content = ("".join(kept) + text[pos:]).strip()
    return content or None, calls


def assistant_message(text: str, tools: list[dict] | None) -> dict:
    """The assistant message of an answer (tool calls parsed out when the request had tools)."""
    content, calls = split_tool_calls(text) if tools else (text, [])
    return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


def finish_reason(gen: Generation, reply: dict) -> str:
    """OpenAI's ``finish_reason`` of an answer: ``tool_calls``, ``length`` (cut at max_tokens) or ``stop``."""
    return "tool_calls" if reply.get("tool_calls") else ("length" if gen.finish_reason == "length" else "stop")


def usage(gen: Generation) -> dict[str, int]:
    """The token counts of an answer, as OpenAI's ``usage``."""
    p, c = len(gen.prompt_ids), len(gen.response_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


# -- response bodies --------------------------------------------------------------------------
def completion(cid: str, created: int, model: str, gen: Generation, reply: dict) -> dict[str, Any]:
    """The body of a plain (not streamed) answer; ``system_fingerprint`` names the weights' version."""
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": f"v{gen.policy_version}",
            "choices": [{"index": 0, "message": reply, "finish_reason": finish_reason(gen, reply), "logprobs": None}],
            "usage": usage(gen)}


def chunk(cid: str, created: int, model: str, version: int, delta: dict, finish: str | None = None) -> str:
    """One server-sent event of a streamed answer: a ``delta`` of the message (and the finish reason)."""
    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": f"v{version}", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def usage_chunk(cid: str, created: int, model: str, gen: Generation) -> str:
    """The event a stream ends with when the client asked ``stream_options: {include_usage: true}``."""
    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": usage(gen)}
    return f"data: {json.dumps(body)}\n\n"
