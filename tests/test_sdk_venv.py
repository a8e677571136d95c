"""nextstate installs beside the OpenAI Agents SDK (``openai-agents``, import name ``agents``) and smolagents.

nextstate used to install a top-level ``agents`` of its own; now it installs only ``nextstate``.
A fresh venv holds the nextstate wheel (conftest's ``wheel``, built from a copy of the source tree),
openai-agents 0.24.0 and smolagents 1.26.0, all installed by pip (from the package registry), not
editable (pip needs the registry); every command runs in it from a directory that holds nothing of
the project, without ``PYTHONPATH``. The terminal env runs on the local sandbox backend (no Docker).

**The venv.** Without the system site-packages, but its site-packages holds one ``.pth`` file whose
lines are the machine's site-packages folders: torch, transformers and veRL come from the machine
instead of gigabytes from the registry (a full fresh install takes many minutes; this one, seconds).
A path line in a ``.pth`` only appends the folder to ``sys.path``: the ``.pth`` files in it, the
editable install's finder for the checkout among them, are not run, so the checkout stays
invisible (checked below: every ``nextstate`` module comes from the venv's site-packages, and no
finder but Python's own is installed). The venv's site-packages comes first on ``sys.path``, so
what pip installs there wins over the machine's copy.

**The model (a test double).** The untaught tiny model cannot be relied on to call the tool, so the
proxy serves the tiny model overfit (:func:`agents.testing.taught_policy`) to write the weather
tool call after the agent's first request and a final answer after its second, saved to a folder
and served by ``python -m nextstate.train.proxy --model FOLDER --no-train``. The two requests it is taught on
are the ones the agent sends to a scripted server (:class:`agents.testing.ScriptedOpenAIServer`)
playing those two answers. Through the proxy, the tool must really run (the agent reports its
calls) and its output must reach the model: the proxy records it as the first turn's next state,
the messages of the next request.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from nextstate.agents.testing import Reply, ScriptedOpenAIServer, taught_policy

pytestmark = pytest.mark.slow

SDK = ["openai-agents==0.24.0", "smolagents==1.26.0"]
GENERIC = ["envs", "train", "judges", "containers", "configs", "bench"]
TOOL_OUTPUT, ANSWER = "sunny in Paris", "It is sunny in Paris."   # what AGENT's tool returns; the answer
CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
CALL_TEXT = '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'

# The agent: ``python agent.py URL MODE...`` prints one JSON line per run (MODE plain or streamed).
AGENT = '''
import asyncio, json, sys
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

calls = []


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return f"sunny in {city}"


async def main(url, modes):
    set_tracing_disabled(True)   # no trace export: nothing leaves the machine
    model = OpenAIChatCompletionsModel("tiny", AsyncOpenAI(base_url=url, api_key="none", max_retries=0))
    agent = Agent(name="forecaster", instructions="Answer with the weather tool.", tools=[weather], model=model,
                  model_settings=ModelSettings(temperature=0, max_tokens=64))
    for mode in modes:
        calls.clear()
        deltas = []
        if mode == "streamed":
            result = Runner.run_streamed(agent, "Weather in Paris?", max_turns=3)
            async for event in result.stream_events():
                if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                    deltas.append(event.data.delta)
        else:
            result = await Runner.run(agent, "Weather in Paris?", max_turns=3)
        print(json.dumps({"mode": mode, "final": result.final_output, "calls": list(calls), "deltas": deltas,
                          "items": [item.type for item in result.new_items]}), flush=True)


asyncio.run(main(sys.argv[1], sys.argv[2:]))
'''

# What the venv imports, before and after: the SDK, smolagents and every nextstate package side by side.
IMPORTS = f'''
import importlib.util, json, sys
finders = [getattr(f, "__module__", "") for f in sys.meta_path]
import agents, smolagents
import nextstate, nextstate.containers, nextstate.envs, nextstate.agents, nextstate.judges, nextstate.train
import nextstate.configs
from importlib.metadata import distribution
print(json.dumps({{
    "agents": agents.__file__, "runner": agents.Runner.__module__, "agent": agents.Agent.__module__,
    "smolagents": smolagents.__file__, "nextstate": list(nextstate.__path__),
    "files": sorted({{m.__file__ for n, m in sys.modules.items()
                    if n.split(".")[0] == "nextstate" and getattr(m, "__file__", None)}}),
    "generic": [n for n in {GENERIC!r} if importlib.util.find_spec(n)],
    "finders": finders, "path": sys.path, "dist": str(distribution("nextstate").locate_file("")),
}}))
'''

GYM = '''
import json
import gymnasium
import nextstate.envs
env = gymnasium.make("nextstate/Terminal-v0", backend="local")
obs, info = env.reset(options={"task": "greet-script"})
step = env.step('<tool_call>{"name": "bash", "arguments": {"command": "echo hi"}}</tool_call>')
print(json.dumps({"task": info["task_id"], "obs": step[0], "backend": env.unwrapped.sandbox.backend,
                  "env": type(env.unwrapped).__module__}))
env.close()
'''


@dataclass
class Venv:
    python: Path
    site: Path                # its own site-packages
    cwd: Path                 # a directory that holds nothing of the project
    env: dict[str, str]       # this process's, without PYTHONPATH

    def command(self, *args: str) -> list[str]:
        return [str(self.python), *args]

    def run(self, *args: str) -> subprocess.CompletedProcess:
        out = subprocess.run(self.command(*args), cwd=self.cwd, env=self.env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return out


def _machine_sites() -> list[str]:
    """This machine's site-packages folders (this process's ``sys.path``)."""
    return [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Venv:
    base = tmp_path_factory.mktemp("sdk")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    python = base / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "machine.pth").write_text("".join(f"{p}\n" for p in _machine_sites()))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel), *SDK], check=True, cwd=base, env=env)
    (base / "elsewhere").mkdir()
    (base / "elsewhere" / "agent.py").write_text(AGENT)
    return Venv(python, site, base / "elsewhere", env)


def test_the_sdk_and_nextstate_side_by_side(venv):
    got = json.loads(venv.run("-c", IMPORTS).stdout)
    assert Path(got["agents"]).is_relative_to(venv.site) and Path(got["smolagents"]).is_relative_to(venv.site)
    assert got["runner"].startswith("agents.") and got["agent"].startswith("agents.")   # the SDK's own classes
    assert got["nextstate"] == [str(venv.site / "nextstate")] and Path(got["dist"]) == venv.site
    assert got["files"] and all(Path(f).is_relative_to(venv.site / "nextstate") for f in got["files"])
    assert got["generic"] == []
    # the checkout stays invisible: only Python's own finders (no editable finder), no checkout on the path
    assert all(f.startswith("_frozen_importlib") for f in got["finders"]), got["finders"]
    checkout = Path(importlib.util.find_spec("nextstate.train").submodule_search_locations[0]).resolve().parent
    assert not [p for p in got["path"] if p and Path(p).resolve() == checkout]
    assert set(got["path"]) >= set(_machine_sites())   # the .pth line's work


def test_a_terminal_env_from_the_installed_package(venv):
    got = json.loads(venv.run("-c", GYM).stdout.splitlines()[-1])
    assert got == {"task": "greet-script", "obs": "hi\n[exit code 0]", "backend": "local",
                   "env": "nextstate.envs.terminal.env"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runs(venv: Venv, url: str, *modes: str) -> list[dict]:
    return [json.loads(line) for line in venv.run("agent.py", url, *modes).stdout.splitlines()]


def _taught_folder(venv: Venv, folder: Path) -> Path:
    """The tiny model taught the two requests the agent sends to a scripted server (tool call, then
    the answer), saved to ``folder``."""
    with ScriptedOpenAIServer([Reply(tool_calls=[CALL], finish_reason="tool_calls"), ANSWER]) as server:
        [run] = _runs(venv, server.url, "plain")
    assert run["calls"] == ["Paris"] and run["final"] == ANSWER
    first, second = server.requests
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": TOOL_OUTPUT}
    script = [(first["messages"], CALL_TEXT), (second["messages"], ANSWER)]
    policy = taught_policy(script, first["tools"], max_new_tokens=64)
    for messages, answer in script:
        assert asyncio.run(policy.generate(messages, first["tools"], temperature=0)).text == answer
    policy.model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    return folder


def test_an_sdk_agent_runs_through_the_proxy_plain_and_streamed(venv, tmp_path):
    model = _taught_folder(venv, tmp_path / "model")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    proxy = subprocess.Popen(venv.command("-m", "nextstate.train.proxy", "--model", str(model), "--output",
                                          str(tmp_path / "run"), "--port", str(port), "--no-train",
                                          "--max-tokens", "64"),
                             cwd=venv.cwd, env=venv.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not _up(url):
            assert proxy.poll() is None, "the proxy exited"
            assert time.monotonic() < deadline, "the proxy did not answer within 300 s"
            time.sleep(0.2)
        plain, streamed = _runs(venv, url, "plain", "streamed")
    finally:
        proxy.send_signal(signal.SIGINT)
        out, _ = proxy.communicate(timeout=120)
        print(out[-3000:])   # pytest shows it when the test fails
    assert proxy.returncode == 130 and "serving" in out, out[-3000:]
    for run in (plain, streamed):
        assert run["calls"] == ["Paris"] and run["final"] == ANSWER, run
        assert run["items"] == ["tool_call_item", "tool_call_output_item", "message_output_item"], run
    assert "".join(streamed["deltas"]) == ANSWER and len(streamed["deltas"]) >= 2   # token by token
    records = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    calls = [r for r in records if r["kind"] == "step" and r["step"] == 0]
    assert len(calls) == 2   # one session per run
    for r in calls:   # the tool's output is the next request's news: the first turn's next state
        assert r["action"]["tool_calls"][0]["function"] == CALL["function"] and not r["rewritten"]
        assert [(m["role"], m["content"]) for m in r["next_state"]["messages"]] == [("tool", TOOL_OUTPUT)]


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
