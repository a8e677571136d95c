"""OpenEnv both ways (envs/openenv.py), driven by openenv-core's own client and server classes.

Serve: a family behind ``python -m envs serve`` / :class:`FamilyServer`, talked to with
``openenv.core.GenericEnvClient`` (not ours): reset, step, whole episodes on terminal, toolcall and
relay, 32 sessions at once, a client killed mid-episode, malformed requests, the session bound.
Consume: :class:`OpenEnvFamily` over a counter env built on openenv-core's own ``Environment``
and ``create_fastapi_app``, run by the trainer's rollout loop with the rule judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import gymnasium
import httpx
import pytest

pytest.importorskip("openenv.core")

import uvicorn  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402
from websockets.sync.client import connect as ws_connect  # noqa: E402
from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from nextstate.envs import registry  # noqa: E402
from nextstate.envs.openenv import FamilyServer, OpenEnvFamily, wait_healthy  # noqa: E402
from nextstate.envs.relay import RelayEnv  # noqa: E402
from nextstate.envs.terminal import TerminalEnv  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` under uvicorn in a thread; yields its base URL once ``/health`` answers."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    assert wait_healthy(url), "the server did not come up"
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def client(url: str) -> Any:
    return GenericEnvClient(url, message_timeout_s=120).sync()


@contextlib.contextmanager
def family_server(family: str, **kwargs: Any) -> Iterator[tuple[FamilyServer, str]]:
    fs = FamilyServer(family, **kwargs)
    try:
        with serving(fs.app()) as url:
            yield fs, url
    finally:
        fs.close()


def wait_for(predicate: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


# -- serve -----------------------------------------------------------------------------------------
@pytest.mark.docker
def test_terminal_episode_over_openenv_client(terminal_image: str) -> None:
    with family_server("terminal", tasks="procedural:0:4", max_sessions=2, backend="docker") as (fs, url):
        schema = httpx.get(url + "/schema").json()
        assert {t["function"]["name"] for t in schema["action"]["tools"]} >= {"bash", "finish"}
        assert httpx.get(url + "/metadata").json()["name"] == "nextstate/terminal"
        gold = TerminalEnv(tasks="procedural:0:4").oracle_actions(fs.tasks[1], "gold")
        with client(url) as env:
            first = env.reset(task="proc-1")
            assert "/app" in first.observation["text"] and first.done is False
            assert first.observation["info"]["task_id"] == "proc-1" and fs.leased() == 1
            text = '<tool_call>{"name": "bash", "arguments": {"command": "echo hi; exit 3"}}</tool_call>'
            r = env.step({"text": text})
            assert r.observation["next_state"]["exit_code"] == 3 and "hi" in r.observation["text"]
            assert r.reward == 0.0 and not r.done
            for action in gold:
                r = env.step(action)
            assert r.done and r.reward == 1.0 and r.observation["outcome"]["reward"] == 1.0
            assert r.observation["truncated"] is False
            state = env.state()
            assert state["task_id"] == "proc-1" and state["step_count"] == 1 + len(gold) and not state["running"]
            again = env.reset(seed=3)   # a second episode in the same session
            assert again.observation["info"]["task_id"] in {t.id for t in fs.tasks}
        assert wait_for(lambda: fs.leased() == 0), "the closed session kept its sandbox"


@pytest.mark.docker
def test_toolcall_episode_over_openenv_client(terminal_image: str) -> None:
    with family_server("toolcall", max_sessions=1, backend="docker") as (fs, url):
        with client(url) as env:
            env.reset(task="nextstate-aime-1")
            r = env.step({"name": "python", "arguments": {"code": "print(6 * 7)"}})
            assert "42" in r.observation["text"] and r.observation["next_state"]["valid"]
            r = env.step({"name": "answer", "arguments": {"answer": "0"}})
            assert r.done and r.reward in (-1.0, 0.0)
            assert r.observation["outcome"] is not None
            env.reset(task="nextstate-aime-1")
            r = env.step({"name": "answer", "arguments": {"answer": "40"}})
            assert r.done and r.reward == 1.0


@pytest.mark.docker
def test_relay_episode_names_who_acts_next(terminal_image: str) -> None:
    with family_server("relay", max_sessions=1, backend="docker") as (fs, url):
        task = fs.tasks[0]
        local = RelayEnv(tasks=fs.tasks)
        with client(url) as env:
            r = env.reset(task=task.id)
            assert r.observation["agent"] == RelayEnv.possible_agents[0]
            local.reset(options={"task": task})
            for action in local.oracle_actions(task, "gold"):
                r = env.step(action if isinstance(action, dict) else {"text": action})
                if r.done:
                    break
            assert r.done and r.reward == 1.0
        local.close()


@pytest.mark.docker
def test_malformed_requests_get_one_line_errors(terminal_image: str) -> None:
    with family_server("terminal", tasks="procedural:0:2", max_sessions=1, backend="docker") as (fs, url):
        with client(url) as env:
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                env.step({"bogus": 1})                       # neither text nor name
            with pytest.raises(RuntimeError, match="unknown task 'nope'"):
                env.reset(task="nope")
            with pytest.raises(RuntimeError, match="unknown reset options: colour"):
                env.reset(colour="red")
            r = env.step({"text": "ls"})                     # no episode yet: told to reset
            assert r.done and "reset first" in r.observation["text"]
            env.reset(task="proc-0")
            r = env.step({"text": "no tool call at all"})    # a bad action is a recorded failed step
            assert r.observation["next_state"]["valid"] is False and "Invalid action" in r.observation["text"]
            r = env.step({"name": "bash", "arguments": {}})
            assert "missing required argument" in r.observation["text"]
        assert httpx.post(url + "/step", json={"action": {"text": 1}}).status_code == 422
        assert httpx.post(url + "/reset", content=b"{not json", headers={"content-type": "application/json"}
                          ).status_code == 422
        stateless = httpx.post(url + "/step", json={"action": {"text": "ls"}}).json()
        assert stateless["done"] is True and "WebSocket" in stateless["observation"]["text"]


@pytest.mark.docker
def test_a_full_server_refuses_in_one_line(terminal_image: str) -> None:
    with family_server("terminal", tasks="procedural:0:2", max_sessions=1, backend="docker") as (fs, url):
        with client(url) as first:
            first.reset()
            with ws_connect(url.replace("http", "ws", 1) + "/ws") as raw:   # what the server says, first
                said = json.loads(raw.recv(timeout=60))
            assert said["type"] == "error" and said["data"]["code"] == "CAPACITY_REACHED"
            assert "\n" not in said["data"]["message"]
            # openenv-core's client reads that message or, when the close came first, raises
            # ConnectionClosedOK on its send (a race in its client); our consumer says both in one line
            env = OpenEnvFamily(url).env_class(tasks="seeds:0:1")
            with pytest.raises(ValueError) as refused:
                env.reset(options={"task": "seed-0"})
            env.close()
            assert "CAPACITY_REACHED" in str(refused.value) and "\n" not in str(refused.value)
        with client(url) as third:       # the slot came back with the first session
            assert wait_for(lambda: fs.leased() == 0)
            assert not third.reset().done


KILLED_CLIENT = """
import sys, time
from openenv.core import GenericEnvClient
env = GenericEnvClient(sys.argv[1]).sync()
env.connect()
env.reset(task="proc-0")
print("leased", flush=True)
time.sleep(600)
"""


@pytest.mark.docker
def test_a_killed_client_gives_its_sandbox_back(terminal_image: str) -> None:
    with family_server("terminal", tasks="procedural:0:2", max_sessions=1, backend="docker") as (fs, url):
        proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, url], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "leased"
            assert fs.leased() == 1
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert wait_for(lambda: fs.leased() == 0), "the killed client's sandbox was not given back"
        with client(url) as env:          # and its session slot is free again
            assert not env.reset(task="proc-1").done


@pytest.mark.docker
@pytest.mark.slow
def test_32_sessions_at_once(terminal_image: str) -> None:
    n = 32
    with family_server("terminal", tasks="procedural:0:8", max_sessions=n, backend="docker") as (fs, url):
        fs.pool.wait_ready(timeout=300)

        def episode(i: int) -> tuple[float, str]:
            with client(url) as env:
                env.reset(seed=i)
                cmd = f"echo session-{i} > /tmp/me; cat /tmp/me"
                r = env.step({"name": "bash", "arguments": {"command": cmd}})
                seen = r.observation["text"]
                r = env.step({"name": "finish", "arguments": {}})
                return float(r.reward), seen

        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(episode, range(n)))
        assert [f"session-{i}" in seen for i, (_, seen) in enumerate(results)] == [True] * n
        assert all(reward in (-1.0, 0.0, 1.0) for reward, _ in results)
        assert wait_for(lambda: fs.leased() == 0)


@pytest.mark.docker
@pytest.mark.slow
def test_python_m_envs_serve(terminal_image: str) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "nextstate.envs", "serve", "terminal", "--port", str(port),
                             "--tasks", "procedural:0:2", "--max-sessions", "2", "--backend", "docker"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert f"serving terminal (2 tasks) over OpenEnv at http://127.0.0.1:{port}" in line, line
        url = f"http://127.0.0.1:{port}"
        assert wait_healthy(url, alive=lambda: proc.poll() is None)
        with client(url) as c:
            c.reset(task="proc-0")
            r = c.step({"name": "finish", "arguments": {}})
            assert r.done and r.reward in (-1.0, 0.0)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def test_serve_refuses_bad_input_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from nextstate.envs.__main__ import main
    assert main(["serve", "no-such-family"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    with pytest.raises(ValueError, match="max_sessions"):
        FamilyServer("terminal", max_sessions=0)


# -- consume ---------------------------------------------------------------------------------------
class CountAction(Action):
    add: int


class CountObservation(Observation):
    count: int = 0
    message: str = ""


class CounterEnvironment(Environment):
    """Made with openenv-core's own classes: count to 3; reward 1 at exactly 3, -1 past it."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.count, self.steps = 0, 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CountObservation:
        self.count, self.steps = seed or 0, 0
        return CountObservation(count=self.count, message="Reach 3 by adding numbers.")

    def step(self, action: CountAction, timeout_s: float | None = None, **kwargs: Any) -> CountObservation:
        self.count += action.add
        self.steps += 1
        done = self.count >= 3
        return CountObservation(count=self.count, message="done" if done else "go on", done=done,
                                reward=(1.0 if self.count == 3 else -1.0) if done else 0.0)

    @property
    def state(self) -> State:
        return State(step_count=self.steps, count=self.count)


@pytest.fixture(scope="module")
def counter_url() -> Iterator[str]:
    app = create_fastapi_app(CounterEnvironment, CountAction, CountObservation, max_concurrent_envs=4)
    with serving(app) as url:
        yield url


def step_text(add: int) -> str:
    return f'<tool_call>{{"name": "step", "arguments": {{"add": {add}}}}}</tool_call>'


def test_openenv_family_is_a_gymnasium_env(counter_url: str) -> None:
    family = OpenEnvFamily(counter_url)
    assert family.name == f"openenv:{counter_url}" and registry.spec(family.name).id == family.id
    [tool] = family.env_class.tools
    assert tool["function"]["name"] == "step" and tool["function"]["parameters"]["required"] == ["add"]
    env = gymnasium.make(family.id, tasks="seeds:0:2")
    obs, info = env.reset(options={"task": "seed-0"})
    assert '"count": 0' in obs and info["instruction"] == obs
    obs, reward, terminated, truncated, info = env.step(step_text(2))
    assert '"count": 2' in obs and not terminated and info["next_state"]["observation"]["count"] == 2
    _, _, _, _, info = env.step(step_text("x"))      # checked against the action schema here
    assert info["next_state"]["valid"] is False
    obs, reward, terminated, truncated, info = env.step(step_text(1))
    assert terminated and reward == 1.0 and info["outcome"]["openenv_reward"] == 1.0
    env.reset(options={"task": "seed-1"})            # a task is a reset seed
    _, reward, terminated, _, _ = env.step(step_text(5))
    assert terminated and reward == -1.0
    env.close()


def test_openenv_url_as_env_resolves_and_refuses_a_dead_server(counter_url: str) -> None:
    name = registry.resolve(f"openenv:{counter_url}/")   # what --env openenv:URL does
    assert name == f"openenv:{counter_url}/" and registry.spec(name).env_class().url == counter_url
    from nextstate.train.__main__ import build_config, parse_args
    cfg, _ = build_config(parse_args(["--env", f"openenv:{counter_url}", "--dry-run", "--output", "runs/x"]))
    assert cfg.env.family == f"openenv:{counter_url}"      # python -m train --env openenv:URL composes
    with pytest.raises(ValueError, match="does not answer"):
        registry.resolve(f"openenv:http://127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match="http"):
        OpenEnvFamily("localhost:1")


def test_the_trainers_rollout_runs_on_an_openenv_family(counter_url: str, tmp_path: Path) -> None:
    from nextstate.agents.recorder import Recorder
    from nextstate.agents.testing import ScriptedPolicy
    from nextstate.judges.rules import RuleJudge
    from nextstate.train.rollout import collect

    family = OpenEnvFamily(counter_url)
    tasks = family.env_class(tasks=2).tasks
    with Recorder(tmp_path / "rollouts.jsonl") as rec:
        trajs = asyncio.run(collect(lambda: family.env_class(tasks=tasks), ScriptedPolicy([step_text(1)]),
                                    tasks, judge=RuleJudge(m=1), recorder=rec, progress=False))
    assert [t.outcome for t in trajs] == [1.0, 1.0]      # seed 0: 3 steps, seed 1: 2 steps, to exactly 3
    assert [len(t.steps) for t in trajs] == [3, 2]
    assert (tmp_path / "rollouts.jsonl").stat().st_size > 0


@pytest.mark.docker
def test_a_served_family_round_trips_through_openenv_family(terminal_image: str) -> None:
    with family_server("terminal", tasks="procedural:0:2", max_sessions=1, backend="docker") as (fs, url):
        family = OpenEnvFamily(url)
        assert {t["function"]["name"] for t in family.env_class.tools} >= {"bash", "finish"}
        env = family.env_class(tasks=1)
        obs, _ = env.reset(options={"task": env.tasks[0]})
        assert "/app" in obs
        _, _, _, _, info = env.step('<tool_call>{"name": "bash", "arguments": {"command": "exit 4"}}</tool_call>')
        assert info["next_state"]["exit_code"] == 4 and info["next_state"]["valid"]
        _, reward, terminated, _, info = env.step({"name": "finish", "arguments": {}})
        assert terminated and info["outcome"]["reward"] == reward
        env.close()
