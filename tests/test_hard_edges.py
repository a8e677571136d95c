"""Hostile actions through a real env on Docker: each is a recorded invalid step, none aborts."""

from __future__ import annotations

import json

import pytest

from nextstate.envs.actions import tool_schema
from nextstate.envs.base import NextStateEnv, Outcome, Task, ToolResult
from nextstate.envs.pool import SandboxPool


class ShellEnv(NextStateEnv):
    """One task, a bash tool with an optional timeout, and a finish tool."""

    family = "terminal"
    tools = [tool_schema("bash", "Run a command.", {"command": "string", "timeout": "number"},
                         required=["command"]),
             tool_schema("finish", "Done.")]

    def load_tasks(self, source):
        return [Task("t", "Do anything.")]

    def call_tool(self, call):
        if call.name == "finish":
            return ToolResult("bye", done=True)
        return self.command_result(self.run(call.arguments["command"], call.arguments.get("timeout")))

    def compute_outcome(self):
        return Outcome(0.0)


def bash(command: str, timeout: str = "") -> str:
    extra = f', "timeout": {timeout}' if timeout else ""
    return f'<tool_call>{{"name": "bash", "arguments": {{"command": {json.dumps(command)}{extra}}}}}</tool_call>'


HOSTILE = {
    "nan timeout": bash("echo x", "NaN"),
    "inf timeout": bash("echo x", "Infinity"),
    "-inf timeout": bash("echo x", "-Infinity"),
    "overflowing float": bash("echo x", "1e999"),
    "huge integer": bash("echo x", "1" + "0" * 400),
    "too many digits": bash("echo x", "1" + "0" * 5000),
    "lone surrogate": '<tool_call>{"name": "bash", "arguments": {"command": "echo \\ud800"}}</tool_call>',
    "raw lone surrogate": bash("echo x").replace("echo x", "echo \ud800"),
    "NUL byte": bash("echo a\x00b"),
    "deep JSON": "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
    "deep arguments": '<tool_call>{"name": "bash", "arguments": ' + '{"a": ' * 60_000 + "1"
                      + "}" * 60_000 + "}</tool_call>",
}


@pytest.fixture(scope="module", params=["auto", "exec"])
def env(request, terminal_image):
    """The hostile episode's env, on each shell transport: the default (FIFOs, on this host) and
    the exec stream (what an engine elsewhere gets)."""
    with SandboxPool(terminal_image, size=1, backend="docker", transport=request.param) as pool:
        e = ShellEnv(pool=pool, max_steps=2 * len(HOSTILE) + 5)
        yield e
        e.close()


@pytest.mark.docker
def test_every_malformed_action_is_a_recorded_invalid_step(env):
    env.reset()
    for what, action in HOSTILE.items():
        obs, reward, terminated, truncated, info = env.step(action)
        ns = info["next_state"]
        assert "aborted" not in info, what
        assert ns["valid"] is False and obs.startswith("Invalid action: "), (what, obs[:200])
        assert len(ns["error"]) < 400 and "Traceback" not in ns["error"], what
        assert not terminated and not truncated
        # nothing was sent: the next command's output is its own, no leaked marker
        obs, *_ = env.step(bash("echo ok"))
        assert obs == "ok\n[exit code 0]", (what, obs[:200])
    assert env.step('<tool_call>{"name": "finish", "arguments": {}}</tool_call>')[2]  # lease given back


@pytest.mark.docker
def test_malformed_actions_do_not_abort_an_agent_loop_episode(env):
    """Through train.rollout, as training runs it: every step is recorded, the episode ends normally."""
    import asyncio

    from nextstate.train.rollout import collect
    from nextstate.agents.testing import ScriptedPolicy

    hostile = [a for what, a in HOSTILE.items() if what != "raw lone surrogate"]  # not tokenizable
    script = hostile + ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>']
    answers = iter(script)   # in order, whatever the chat budget leaves of the history
    policy = ScriptedPolicy(lambda messages: next(answers))
    [traj] = asyncio.run(collect(lambda: ShellEnv(pool=env.pool, max_steps=len(script)),
                                 policy, env.tasks, parallel=1))
    assert traj.status == "finished", (traj.status, traj.error)
    assert len(traj.steps) == len(script)
    assert sum(not s.next_state["valid"] for s in traj.steps) == len(hostile)


# -- judge, metrics, checkpoints ---------------------------------------------------------------
async def test_judge_timeout_is_logged_with_text(caplog):
    from nextstate.agents.testing import ScriptedPolicy
    from nextstate.judges.prm import JudgeRequest, StepJudge

    judge = StepJudge(ScriptedPolicy(["\\boxed{1}"], delay=2.0), timeout=0.1)
    req = JudgeRequest("terminal", "do it", [], {"name": "bash", "arguments": {}}, {"output": "x"})
    result = await judge.judge(req)
    assert result.error == "TimeoutError: no answer within 0.1s"
    assert "no answer within 0.1s" in caplog.text


def test_vote_mean_is_missing_when_no_vote_was_valid():
    from nextstate.agents.trajectory import Step, Trajectory
    from nextstate.train.batch import rollout_metrics

    def traj(vote_mean):
        step = Step("agent", 0, [1], [2], [-0.1], "x", None, {"valid": True}, "o",
                    votes=[0, 0], vote_mean=vote_mean)
        t = Trajectory(task_id="t", group_id="g", sample=0, family="terminal", steps=[step])
        t.status = "finished"
        return t
    assert "judge/vote_mean" not in rollout_metrics([traj(None), traj(None)])
    assert rollout_metrics([traj(None), traj(-1.0)])["judge/vote_mean"] == -1.0


def test_a_half_deleted_checkpoint_is_cleaned_up(tmp_path):
    import torch

    from nextstate.agents.tiny import load_tiny
    from nextstate.train import checkpoint

    model, tok = load_tiny(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint.save(tmp_path, 1, parts={"": (model, tok, opt.state_dict())}, meta={}, keep=1)
    # a deletion interrupted after meta.json went: weights stranded, no longer a checkpoint
    stranded = tmp_path / "checkpoints" / "step_000000"
    (stranded / "model").mkdir(parents=True)
    (stranded / "model" / "model.safetensors").write_bytes(b"\0" * 4096)
    assert checkpoint.latest(tmp_path).name == "step_000001"
    checkpoint.save(tmp_path, 2, parts={"": (model, tok, opt.state_dict())}, meta={}, keep=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]


# -- evaluate's and train's start-up checks ------------------------------------------------------
def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("flags, message", [
    (["--policy", "gold", "--parallel", "0"], "--parallel must be at least 1, got 0"),
    (["--policy", "gold", "--max-steps", "-1"], "--max-steps must be at least 1, got -1"),
    (["--policy", "http://127.0.0.1:1", "--model", "http://127.0.0.1:1"], "--model is the model's name"),
    (["--policy", "http://127.0.0.1:{port}"], "policy URL http://127.0.0.1:{port} does not answer"),
])
def test_evaluate_refuses_bad_flags_up_front(flags, message, tmp_path, capsys):
    from nextstate.train.evaluate import main

    port = _free_port()
    flags = [f.format(port=port) for f in flags]
    assert main(["--env", "terminal", "--output", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message.format(port=port) in err and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("models, message", [
    (500, "GET /models failed (HTTP 500"),
    ([], "lists no model"),
])
def test_unknown_model_names_the_setting_to_fill_in(models, message, tmp_path, capsys):
    from nextstate.agents.testing import ScriptedOpenAIServer
    from nextstate.train.__main__ import main as train_main
    from nextstate.train.evaluate import main as evaluate_main

    with ScriptedOpenAIServer("\\boxed{1}", models=models) as server:
        assert train_main(["--env", "terminal", "--judge", server.url, "--model", "tiny",
                           "--output", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and err.endswith("set judge.model=<the served model's name>")
        assert "\n" not in err
        assert evaluate_main(["--env", "terminal", "--policy", server.url,
                              "--output", str(tmp_path / "eval")]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and err.endswith("set --model=<the served model's name>")


def test_a_model_the_server_does_not_list_is_refused(tmp_path, capsys):
    from nextstate.agents.testing import ScriptedOpenAIServer
    from nextstate.train.evaluate import main

    with ScriptedOpenAIServer("x", models=["served"]) as server:
        assert main(["--env", "terminal", "--policy", server.url, "--model", "typo",
                     "--output", str(tmp_path)]) == 2
    assert "does not serve model 'typo' (it serves: served); set --model" in capsys.readouterr().err


NGINX_502 = """<html>
<head><title>502 Bad Gateway</title></head>
<body>
<center><h1>502 Bad Gateway</h1></center>
<hr><center>nginx/1.18.0</center>
</body>
</html>
"""


@pytest.fixture
def html_server():
    """A real HTTP server that is not an OpenAI server: a proxy's 502 page on every path."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _page(self):
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(NGINX_502)))
            self.end_headers()
            self.wfile.write(NGINX_502.encode())

        do_GET = do_POST = _page

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_html_error_page_is_cut_to_one_line(html_server, tmp_path, capsys):
    from nextstate.train.__main__ import main as train_main
    from nextstate.train.evaluate import main as evaluate_main

    assert train_main(["--env", "terminal", "--judge", html_server, "--model", "tiny",
                       "--output", str(tmp_path / "run")]) == 2
    assert evaluate_main(["--env", "terminal", "--policy", html_server, "--output", str(tmp_path / "eval")]) == 2
    for line in capsys.readouterr().err.strip().split("\n"):   # one line each
        assert line.startswith("error: ") and "HTTP 502: HTML page: 502 Bad Gateway" in line, line


def test_a_judge_that_fails_a_chat_request_stops_the_run_at_start(tmp_path, capsys):
    """A wrong judge.model on a server whose /models cannot say (transformers serve): one real
    request at start finds it."""
    from nextstate.agents.testing import Reply, ScriptedOpenAIServer
    from nextstate.train.__main__ import build_config, main, parse_args
    from nextstate.train.config import ConfigError

    argv = ["--env", "terminal", "--judge", "URL", "--model", "tiny", "--output", str(tmp_path), "judge.model=typo"]
    with ScriptedOpenAIServer(Reply(status=404, error="The model `typo` does not exist."), models=500) as server:
        argv[3] = server.url
        with pytest.raises(ConfigError, match="fails a chat request"):
            build_config(parse_args(argv))
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "The model `typo` does not exist." in err and err.endswith("check judge.url and judge.model")


@pytest.mark.docker
def test_a_run_whose_judge_failed_on_every_step_of_its_first_step_stops(tmp_path, terminal_image, capsys):
    from nextstate.agents.testing import Reply, ScriptedOpenAIServer
    from nextstate.train.__main__ import main

    replies = ["\\boxed{1}", Reply(status=400, error="this judge broke after the probe")]   # probe, then every call
    with ScriptedOpenAIServer(replies) as server:
        assert main(["--env", "terminal", "--model", "tiny", "--judge", server.url, "--steps", "2", "--parallel", "2",
                     "--output", str(tmp_path), "rollout.tasks_per_step=1", "rollout.samples_per_task=2",
                     "sft.steps=0", "eval.tasks=null"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: the judge failed on all ") and "this judge broke after the probe" in last
    assert not list((tmp_path / "checkpoints").glob("step_*"))   # nothing trained, nothing saved


def test_importing_the_trainer_prints_no_verl_engine_warnings():
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", "import train.loss"], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "engine is not available" not in done.stderr, done.stderr[-2000:]


def test_train_says_the_trained_model_must_be_local(tmp_path, capsys):
    from nextstate.train.__main__ import main

    assert main(["--env", "terminal", "--model", "http://127.0.0.1:1/v1", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "must be local" in err and "--judge http://127.0.0.1:1/v1" in err and "\n" not in err


# -- Ctrl-C during start-up --------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.parametrize("command, when", [("train", "importing"), ("train", "sandboxes started"),
                                           ("train.evaluate", "sandboxes started")])
def test_sigint_during_start_up_is_one_line_exit_130_and_leaves_nothing(tmp_path, terminal_image, docker_client,
                                                                        command, when):
    """SIGINT while the run imports, and once its first sandbox exists (pool filling, model
    loading, first rollout; for the evaluator, episodes under way): exit 130, one closing line,
    no traceback, no labeled container or disk left behind."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from nextstate import containers
    from nextstate.containers import disks

    cmd = [sys.executable, "-m", "train", "--env", "terminal", "--model", "tiny", "--parallel", "2", "--steps", "1",
           "--output", str(tmp_path / "run"), "rollout.tasks_per_step=1", "rollout.samples_per_task=2",
           "sft.steps=0", "eval.tasks=null"]
    if command == "train.evaluate":
        cmd = [sys.executable, "-m", command, "--env", "terminal", "--policy", "gold", "--parallel", "2",
               "--backend", "docker", "--output", str(tmp_path / "eval")]
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)

    def mine() -> list[str]:
        return [c["Id"] for c in containers.project_containers(docker_client)
                if (c.get("Labels") or {}).get(containers.PID_LABEL) == str(proc.pid)]

    def my_disks() -> list[Path]:
        return [f for f in disks.DISK_ROOT.glob("*/owner.json")
                if f'"{containers.PID_LABEL}": "{proc.pid}"' in f.read_text()]

    try:
        if when == "importing":
            time.sleep(1.0)
        else:
            deadline = time.monotonic() + 180
            while not mine() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert mine(), "no sandbox started"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert err.rstrip().splitlines()[-1].endswith("interrupted") and err.count("interrupted") == 1, err[-2000:]
    assert mine() == [] and my_disks() == []
