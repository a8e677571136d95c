"""The one action parser: model text (or a chat message) -> a validated tool call.

Every environment reads actions through :func:`parse_action`. It accepts

* Hermes/Qwen text: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
  text around it is ignored, the first call is used, a missing closing tag,
  a code fence inside the tag and trailing junk after the JSON are tolerated;
* a text that is only such a JSON object (optionally in a code fence);
* an OpenAI-style assistant message ``{"role": "assistant", "tool_calls": [...]}``
  (arguments as a JSON string or a dict), one entry of ``tool_calls``, a bare
  ``{"name", "arguments"}`` dict, or a list of those / of messages (the last
  message, the first call);

and checks the call against the environment's tools (OpenAI function schemas).
Whatever is wrong raises :class:`ActionError` with a message written for the
model, which the environment shows as the next observation.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

MAX_ACTION_BYTES = 256 * 1024
FORMAT_HINT = ('Call exactly one tool like this: <tool_call>{"name": "<tool name>", '
               '"arguments": {<arguments as JSON>}}</tool_call>')

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_FENCE = re.compile(r"^\s*```[\w-]*\s*\n?(.*?)\n?\s*```\s*$", re.S)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,), "null": (type(None),),
}


@dataclass
class ToolCall:
    """One parsed call of a tool."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "arguments"}``, as recorded in ``info["next_state"]["action"]``."""
        return {"name": self.name, "arguments": dict(self.arguments)}


class ActionError(ValueError):
    """The action could not be used; the message says why, for the model."""


class NoToolCall(ActionError):
    """The action holds no tool call at all (plain text)."""


def tool_schema(name: str, description: str, properties: dict[str, Any] | None = None,
                required: list[str] | None = None) -> dict[str, Any]:
    """An OpenAI function schema in one line.

    ``properties`` maps an argument name to a JSON schema, to a type name
    (``"string"``) or to ``(type, description)``. ``required`` defaults to
    every property.
    """
    props = {}
    for key, spec in (properties or {}).items():
        if isinstance(spec, str):
            spec = {"type": spec}
        elif isinstance(spec, tuple):
            spec = {"type": spec[0], "description": spec[1]}
        props[key] = spec
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props,
                       "required": list(props) if required is None else list(required),
                       "additionalProperties": False}}}


def parse_action(action: str | dict | list, tools: list[dict[str, Any]]) -> ToolCall:
    """The first tool call in ``action``, checked against ``tools``; raises :class:`ActionError`."""
    try:
        if not isinstance(action, str):   # a message or dict: its JSON text is what the limit bounds
            _check_size(json.dumps(action, ensure_ascii=False, default=str))
        call = _extract(action)
    except RecursionError:  # a chat message or list nested thousands deep
        raise ActionError("The action is nested too deeply. " + FORMAT_HINT) from None
    return _validate(call, tools)


def _loads(text: str, what: str, decode: Any = json.loads) -> Any:
    """``decode(text)``, with every way JSON text can fail as an :class:`ActionError`."""
    try:
        return decode(text)
    except json.JSONDecodeError as e:
        raise ActionError(f"{what} is not valid JSON ({e.msg} at line {e.lineno} "
                          f"column {e.colno}).") from None
    except RecursionError:
        raise ActionError(f"{what} is nested too deeply to read.") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise ActionError(f"{what} holds a number too large to read ({e}).") from None


# -- finding the call ------------------------------------------------------------------
def _extract(action: Any) -> ToolCall:
    if isinstance(action, str):
        return _from_text(action)
    if isinstance(action, list):
        if not action:
            raise ActionError("The action is an empty list. " + FORMAT_HINT)
        if all(isinstance(m, dict) and "role" in m for m in action):
            return _extract(action[-1])
        return _extract(action[0])
    if isinstance(action, dict):
        return _from_dict(action)
    raise ActionError(f"The action must be text or a chat message, not {type(action).__name__}. "
                      + FORMAT_HINT)


def _check_size(text: str) -> None:
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_ACTION_BYTES:
        raise ActionError(f"The action is {size} bytes long; the limit is {MAX_ACTION_BYTES} bytes. "
                          "Write large content in several smaller steps.")


def _from_text(text: str) -> ToolCall:
    _check_size(text)
    if not text.strip():
        raise ActionError("The action is empty. " + FORMAT_HINT)
    start = text.find(_OPEN)
    if start < 0:
        body = _unfence(text)
        if body.startswith("{"):  # a bare JSON call, as some models write it
            try:
                obj = json.loads(body)
            except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
                obj = None
            if isinstance(obj, dict) and "name" in obj:
                return _from_dict(obj)
        raise NoToolCall("No tool call found in the action. " + FORMAT_HINT)
    body = text[start + len(_OPEN):]
    end = body.find(_CLOSE)
    body = _unfence(body if end < 0 else body[:end])
    if not body:
        raise ActionError("The <tool_call> tag is empty. " + FORMAT_HINT)
    try:  # raw_decode ignores junk after the JSON value
        obj, _ = _loads(body, "The tool call", json.JSONDecoder().raw_decode)
    except ActionError as e:
        raise ActionError(f"{e} {FORMAT_HINT}") from None
    if not isinstance(obj, dict):
        raise ActionError("The tool call must be a JSON object with \"name\" and \"arguments\". "
                          + FORMAT_HINT)
    return _from_dict(obj)


def _unfence(text: str) -> str:
    text = text.strip()
    m = _FENCE.match(text)
    return m.group(1).strip() if m else text


def _from_dict(d: dict[str, Any]) -> ToolCall:
    if "tool_calls" in d or "role" in d:  # an assistant message
        calls = d.get("tool_calls") or []
        if not isinstance(calls, list):
            raise ActionError("\"tool_calls\" must be a list of calls.")
        if calls:
            return _extract(calls[0])
        content = d.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return _from_text(content or "")
    if isinstance(d.get("function"), dict):  # one entry of tool_calls
        call = _from_dict(d["function"])
        call.id = d.get("id")
        return call
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise ActionError("The tool call has no \"name\". " + FORMAT_HINT)
    args = d.get("arguments", d.get("parameters", {}))
    if isinstance(args, str):
        args = _loads(args, f"The arguments of {name!r}") if args.strip() else {}
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ActionError(f"The arguments of {name!r} must be a JSON object, "
                          f"not {type(args).__name__}.")
    return ToolCall(name, args, d.get("id"))


# -- checking it against the schemas -----------------------------------------------------
def _validate(call: ToolCall, tools: list[dict[str, Any]]) -> ToolCall:
    schemas = {t["function"]["name"]: t["function"] for t in tools}
    if call.name not in schemas:
        raise ActionError(f"Unknown tool {call.name!r}. Available tools: {', '.join(schemas) or 'none'}.")
    params = schemas[call.name].get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    missing = [k for k in params.get("required", []) if k not in call.arguments]
    if missing:
        raise ActionError(f"Tool {call.name!r} is missing required argument(s): {', '.join(missing)}.")
    extra = [k for k in call.arguments if k not in props]
    if extra and params.get("additionalProperties", True) is False:
        accepted = ", ".join(props) or "none"
        raise ActionError(f"Tool {call.name!r} got unexpected argument(s): {', '.join(extra)} "
                          f"(accepted: {accepted}).")
    for key, value in call.arguments.items():
        if key in props:
            _check_type(call.name, key, value, props[key])
        _check_values(call.name, key, value)
    return call


def _check_values(tool: str, key: str, value: Any) -> None:
    """Every string in ``value`` encodes as UTF-8; every number is finite and fits a float."""
    todo = [value]
    while todo:  # iterative: a value nested 100,000 deep cannot exhaust the stack
        v = todo.pop()
        if isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ActionError(f"Argument {key!r} of {tool!r} holds text that cannot be encoded as "
                                  f"UTF-8 ({v[e.start]!r} at index {e.start}, a lone surrogate).") from None
        elif isinstance(v, float) and not math.isfinite(v):
            raise ActionError(f"Argument {key!r} of {tool!r} must be a finite number, got {v!r}.")
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > sys.float_info.max:
            raise ActionError(f"Argument {key!r} of {tool!r} is too large a number "
                              f"({v.bit_length()} bits).")


def _check_type(tool: str, key: str, value: Any, schema: dict[str, Any]) -> None:
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        ok = any(isinstance(value, _JSON_TYPES.get(t, object))
                 and not (isinstance(value, bool) and t in ("integer", "number")) for t in names)
        if not ok:
            raise ActionError(f"Argument {key!r} of {tool!r} must be of type {' or '.join(names)}, "
                              f"got {_json_type(value)} ({value!r:.80}).")
    if "enum" in schema and value not in schema["enum"]:
        raise ActionError(f"Argument {key!r} of {tool!r} must be one of {schema['enum']}, got {value!r}.")


def _json_type(value: Any) -> str:
    for name, kinds in _JSON_TYPES.items():
        if isinstance(value, kinds) and not (isinstance(value, bool) and name != "boolean"):
            return name
    return type(value).__name__
