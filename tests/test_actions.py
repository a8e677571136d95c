"""The shared action parser: formats models write, and every way an action can be wrong."""

from __future__ import annotations

import json

import pytest

from nextstate.envs.actions import (FORMAT_HINT, MAX_ACTION_BYTES, ActionError, NoToolCall, ToolCall,
                          parse_action, tool_schema)

TOOLS = [
    tool_schema("bash", "Run a command.", {"command": ("string", "the command"), "timeout": "number"},
                required=["command"]),
    tool_schema("write_file", "Write a file.", {"path": "string", "content": "string"}),
    tool_schema("finish", "Done."),
    tool_schema("click", "Click.", {"x": "integer", "y": "integer", "double": "boolean",
                                    "keys": "array", "opts": "object",
                                    "button": {"type": "string", "enum": ["left", "right"]}},
                required=["x", "y"]),
]


def hermes(obj: object) -> str:
    return f"<tool_call>{json.dumps(obj)}</tool_call>"


# -- tool_schema ----------------------------------------------------------------------------
def test_tool_schema_builds_openai_function_schema() -> None:
    s = tool_schema("bash", "Run.", {"command": ("string", "cmd"), "timeout": "number",
                                     "mode": {"type": "string", "enum": ["a"]}}, required=["command"])
    assert s == {"type": "function", "function": {
        "name": "bash", "description": "Run.",
        "parameters": {"type": "object",
                       "properties": {"command": {"type": "string", "description": "cmd"},
                                      "timeout": {"type": "number"},
                                      "mode": {"type": "string", "enum": ["a"]}},
                       "required": ["command"], "additionalProperties": False}}}


def test_tool_schema_requires_every_property_by_default() -> None:
    assert tool_schema("w", "W.", {"a": "string", "b": "string"})["function"]["parameters"]["required"] \
        == ["a", "b"]
    assert tool_schema("f", "F.")["function"]["parameters"]["properties"] == {}


# -- accepted formats ------------------------------------------------------------------------
def test_hermes_text_with_surrounding_text() -> None:
    text = "I will list files.\n" + hermes({"name": "bash", "arguments": {"command": "ls"}}) + "\nok"
    assert parse_action(text, TOOLS) == ToolCall("bash", {"command": "ls"})


def test_first_of_several_calls_is_used() -> None:
    text = hermes({"name": "bash", "arguments": {"command": "a"}}) + \
        hermes({"name": "bash", "arguments": {"command": "b"}})
    assert parse_action(text, TOOLS).arguments == {"command": "a"}


def test_missing_closing_tag_is_tolerated() -> None:
    text = '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n'
    assert parse_action(text, TOOLS).arguments == {"command": "pwd"}


def test_code_fence_inside_the_tag_is_tolerated() -> None:
    text = '<tool_call>\n```json\n{"name": "bash", "arguments": {"command": "pwd"}}\n```\n</tool_call>'
    assert parse_action(text, TOOLS).name == "bash"


def test_trailing_junk_after_the_json_is_tolerated() -> None:
    text = '<tool_call>{"name": "bash", "arguments": {"command": "pwd"}}}</tool_call>'
    assert parse_action(text, TOOLS).arguments == {"command": "pwd"}


def test_arguments_as_json_string() -> None:
    text = hermes({"name": "bash", "arguments": json.dumps({"command": "ls -la"})})
    assert parse_action(text, TOOLS).arguments == {"command": "ls -la"}


def test_multiline_content_survives() -> None:
    content = 'line 1\n"quoted"\n\tindent </b> {x}'
    call = parse_action(hermes({"name": "write_file",
                                "arguments": {"path": "/app/a", "content": content}}), TOOLS)
    assert call.arguments["content"] == content


def test_bare_json_text_and_fenced_json_text() -> None:
    assert parse_action('{"name": "finish", "arguments": {}}', TOOLS).name == "finish"
    assert parse_action('```json\n{"name": "finish"}\n```', TOOLS) == ToolCall("finish", {})


def test_openai_message_with_tool_calls() -> None:
    msg = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "finish", "arguments": "{}"}}]}
    assert parse_action(msg, TOOLS) == ToolCall("bash", {"command": "ls"}, "call_1")


def test_openai_message_with_dict_arguments_and_empty_arguments() -> None:
    msg = {"role": "assistant", "tool_calls": [{"function": {"name": "finish", "arguments": ""}}]}
    assert parse_action(msg, TOOLS) == ToolCall("finish", {})
    msg = {"role": "assistant", "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "x"}}}]}
    assert parse_action(msg, TOOLS).arguments == {"command": "x"}


def test_message_without_tool_calls_falls_back_to_its_content() -> None:
    msg = {"role": "assistant", "content": "sure " + hermes({"name": "finish", "arguments": {}}),
           "tool_calls": []}
    assert parse_action(msg, TOOLS).name == "finish"


def test_bare_dict_and_lists() -> None:
    assert parse_action({"name": "finish", "arguments": {}}, TOOLS).name == "finish"
    assert parse_action({"name": "bash", "parameters": {"command": "ls"}}, TOOLS).arguments == {"command": "ls"}
    calls = [{"name": "finish"}, {"name": "bash", "arguments": {"command": "ls"}}]
    assert parse_action(calls, TOOLS).name == "finish"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": hermes({"name": "finish"})}]
    assert parse_action(chat, TOOLS).name == "finish"


def test_to_dict_is_json_ready() -> None:
    call = parse_action(hermes({"name": "bash", "arguments": {"command": "ls"}}), TOOLS)
    assert json.loads(json.dumps(call.to_dict())) == {"name": "bash", "arguments": {"command": "ls"}}


def test_valid_types() -> None:
    args = {"x": 1, "y": 2, "double": True, "keys": ["a"], "opts": {"k": 1}, "button": "left"}
    assert parse_action({"name": "click", "arguments": args}, TOOLS).arguments == args
    assert parse_action({"name": "bash", "arguments": {"command": "s", "timeout": 2}}, TOOLS)
    assert parse_action({"name": "bash", "arguments": {"command": "s", "timeout": 2.5}}, TOOLS)


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("action, words", [
    ("", ["empty"]),
    ("   \n ", ["empty"]),
    ("I think I am done.", ["No tool call", "<tool_call>"]),
    ("<tool_call></tool_call>", ["empty"]),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>', ["not valid JSON", "line 1"]),
    ("<tool_call>[1, 2]</tool_call>", ["JSON object"]),
    ('<tool_call>{"arguments": {}}</tool_call>', ['no "name"']),
    (hermes({"name": "rm_rf", "arguments": {}}), ["Unknown tool 'rm_rf'", "bash, write_file, finish, click"]),
    (hermes({"name": "bash", "arguments": {}}), ["missing required", "command"]),
    (hermes({"name": "write_file", "arguments": {"path": "a"}}), ["missing", "content"]),
    (hermes({"name": "bash", "arguments": {"command": "ls", "cwd": "/"}}), ["unexpected", "cwd", "accepted: command, timeout"]),
    (hermes({"name": "bash", "arguments": {"command": 5}}), ["'command'", "string", "got integer"]),
    (hermes({"name": "bash", "arguments": {"command": "s", "timeout": "10"}}), ["number", "got string"]),
    (hermes({"name": "click", "arguments": {"x": 1.5, "y": 1}}), ["integer", "got number"]),
    (hermes({"name": "click", "arguments": {"x": True, "y": 1}}), ["integer", "got boolean"]),
    (hermes({"name": "click", "arguments": {"x": 1, "y": 1, "double": "yes"}}), ["boolean"]),
    (hermes({"name": "click", "arguments": {"x": 1, "y": 1, "keys": "a"}}), ["array"]),
    (hermes({"name": "click", "arguments": {"x": 1, "y": 1, "opts": []}}), ["object", "got array"]),
    (hermes({"name": "click", "arguments": {"x": 1, "y": 1, "button": "middle"}}), ["one of"]),
    (hermes({"name": "bash", "arguments": "not json"}), ["arguments of 'bash'", "not valid JSON"]),
    (hermes({"name": "bash", "arguments": [1]}), ["must be a JSON object"]),
])
def test_errors_say_what_is_wrong(action: str, words: list[str]) -> None:
    with pytest.raises(ActionError) as err:
        parse_action(action, TOOLS)
    for word in words:
        assert word in str(err.value)


def test_plain_text_is_a_no_tool_call_error_with_the_format() -> None:
    with pytest.raises(NoToolCall) as err:
        parse_action("The answer is 42.", TOOLS)
    assert FORMAT_HINT in str(err.value)


def test_oversized_action_reports_its_size() -> None:
    big = hermes({"name": "write_file", "arguments": {"path": "a", "content": "x" * MAX_ACTION_BYTES}})
    with pytest.raises(ActionError) as err:
        parse_action(big, TOOLS)
    assert str(len(big)) in str(err.value) and str(MAX_ACTION_BYTES) in str(err.value)


def test_the_size_limit_holds_for_dicts_and_chat_messages_too() -> None:
    call = {"name": "write_file", "arguments": {"path": "a", "content": "x" * MAX_ACTION_BYTES}}
    message = {"role": "assistant", "tool_calls": [{"type": "function", "function": call}]}
    for action in (call, message, [message]):
        with pytest.raises(ActionError, match=f"the limit is {MAX_ACTION_BYTES} bytes"):
            parse_action(action, TOOLS)
    small = {"name": "write_file", "arguments": {"path": "a", "content": "x" * 1000}}
    assert parse_action(small, TOOLS).arguments["content"] == "x" * 1000


@pytest.mark.parametrize("action", [None, 42, [], {"role": "assistant", "tool_calls": "x"},
                                    {"role": "assistant", "content": None}])
def test_odd_inputs_raise_action_error(action: object) -> None:
    with pytest.raises(ActionError):
        parse_action(action, TOOLS)  # type: ignore[arg-type]
