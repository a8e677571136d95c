"""The agent loop on an in-process env (no sandbox): steps, judging, faults, roles."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from nextstate.train.rollout import Router, collect, planner_executor, run_episode
from nextstate.agents.openai_policy import OpenAIPolicy
from nextstate.agents.policy import Generation, Policy, PolicyError
from nextstate.agents.recorder import Recorder
from nextstate.agents.testing import Reply, ScriptedOpenAIServer, ScriptedPolicy
from nextstate.agents.trajectory import Trajectory
from nextstate.envs.actions import ToolCall, tool_schema
from nextstate.envs.base import NextStateEnv, Outcome, Task, ToolResult
from nextstate.containers.protocol import SandboxError
from nextstate.judges.prm import StepJudge


class EchoEnv(NextStateEnv):
    """A real NextStateEnv whose tools need no sandbox: ``echo`` prints, ``finish`` ends
    (reward 1 when ``echo`` ran first), ``crash`` fails like a dead sandbox."""

    family = "terminal"
    default_max_steps = 4
    lease_at_reset = False
    tools = [tool_schema("echo", "Print text.", {"text": "string"}),
             tool_schema("finish", "End the episode."),
             tool_schema("crash", "Fail like a dead sandbox.")]

    def call_tool(self, call: ToolCall) -> ToolResult:
        if call.name == "crash":
            raise SandboxError("the sandbox stopped answering")
        if call.name == "finish":
            return ToolResult("finished", done=True)
        self.echoed = True
        return ToolResult(call.arguments["text"], exit_code=0)

    def start_episode(self, task: Task) -> None:
        self.echoed = False

    def compute_outcome(self) -> Outcome:
        return Outcome(1.0 if self.echoed else -1.0, {"echoed": self.echoed})


def call(name: str, **args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


ECHO, FINISH, CRASH = call("echo", text="hi"), call("finish"), call("crash")
TASKS = [Task(f"t{i}", f"Task number {i}: echo, then finish.") for i in range(3)]


def make_env() -> EchoEnv:
    return EchoEnv(TASKS)


@pytest.fixture
def judge_server():
    with ScriptedOpenAIServer(lambda req: ["ok \\boxed{1}"] * req.get("n", 1)) as server:
        yield server


async def test_collect_steps_ids_votes_and_order(tmp_path, judge_server):
    policy = ScriptedPolicy([ECHO, "no tool call here", FINISH])
    judge = StepJudge(OpenAIPolicy(judge_server.url, model="j"), m=3)
    rec = Recorder(tmp_path / "log.jsonl")
    trajs = await collect(make_env, policy, TASKS, n_samples=4, parallel=5, judge=judge,
                          recorder=rec, batch_tag="b1", progress=False)
    rec.close()
    assert [(t.task_id, t.sample) for t in trajs] == [(f"t{i}", s) for i in range(3) for s in range(4)]
    for t in trajs:
        assert t.group_id == f"{t.task_id}@b1" and t.status == "finished" and t.outcome == 1.0
        assert [s.index for s in t.steps] == [0, 1, 2] and {s.role for s in t.steps} == {"agent"}
        assert [s.action and s.action["name"] for s in t.steps] == ["echo", None, "finish"]
        assert t.steps[1].next_state["valid"] is False
        for s in t.steps:
            assert s.prompt_ids and s.response_ids and len(s.logprobs) == len(s.response_ids)
            assert s.votes == [1, 1, 1] and s.score == 1.0 and s.vote_mean == 1.0
            assert s.timing["judge"] > 0
    assert len(judge_server.requests) == 12 * 3
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert kinds.count("step") == 36 and kinds.count("judge") == 36 and kinds.count("trajectory") == 12
    step_row = next(r for r in rows if r["kind"] == "step")
    assert step_row["messages"][0]["role"] == "system" and "next_state" in step_row
    assert all("votes" in r and "prompt" in r for r in rows if r["kind"] == "judge")
    assert Trajectory.from_dict(json.loads(json.dumps(trajs[0].to_dict()))) == trajs[0]


async def test_truncated_at_max_steps():
    trajs = await collect(make_env, ScriptedPolicy([ECHO]), TASKS[:1], progress=False)
    t = trajs[0]
    assert t.status == "truncated" and len(t.steps) == 4 and t.outcome == 1.0
    assert t.info["outcome"] == {"reward": 1.0, "echoed": True}


class FlakyPolicy(Policy):
    """Stands in for a model whose server fails for tasks that say so."""

    def __init__(self):
        self.inner = ScriptedPolicy([ECHO, FINISH])

    async def generate(self, messages, tools=None, **sampling) -> Generation:
        if "policy fails" in messages[1]["content"]:
            raise PolicyError("POST /chat/completions failed after 5 attempts: HTTP 503")
        if "sandbox dies" in messages[1]["content"]:
            return await ScriptedPolicy([ECHO, CRASH]).generate(messages, tools, **sampling)
        return await self.inner.generate(messages, tools, **sampling)


async def test_infrastructure_faults_abort_only_their_episode(judge_server):
    tasks = [Task("bad-policy", "policy fails"), Task("bad-sandbox", "sandbox dies"),
             Task("good", "all is well")]
    judge = StepJudge(OpenAIPolicy(judge_server.url, model="j"))
    trajs = await collect(lambda: EchoEnv(tasks), FlakyPolicy(), tasks, n_samples=2, parallel=3,
                          judge=judge, progress=False)
    by_task = {t.task_id: t for t in trajs}
    bad = by_task["bad-policy"]
    assert bad.status == "aborted" and "HTTP 503" in bad.error and bad.outcome is None
    assert bad.steps == []
    dead = by_task["bad-sandbox"]
    assert dead.status == "aborted" and "SandboxError" in dead.error and dead.outcome is None
    assert len(dead.steps) == 2 and dead.steps[0].votes == [1] and dead.steps[1].votes == []
    good = by_task["good"]
    assert good.status == "finished" and good.outcome == 1.0


class RunnerlessEnv(EchoEnv):
    """Grades like a task whose test runner could not start (the machinery's fault, not the agent's)."""

    def compute_outcome(self) -> Outcome:
        return Outcome(-1.0, {"reason": "no pytest results found: the test runner could not start "
                                        "(exit 127: pytest: command not found)"})


async def test_a_grade_that_is_the_infrastructure_s_fault_is_not_trained_on():
    trajs = await collect(lambda: RunnerlessEnv(TASKS), ScriptedPolicy([ECHO, FINISH]), TASKS[:1],
                          progress=False)
    (traj,) = trajs
    assert traj.status == "aborted" and traj.outcome is None and len(traj.steps) == 2
    assert traj.error.startswith("infrastructure (test runner did not start): no pytest results found")
    (good,) = await collect(make_env, ScriptedPolicy([ECHO, FINISH]), TASKS[:1], progress=False)
    assert good.status == "finished" and good.outcome == 1.0


async def test_env_factory_failure_aborts():
    def broken():
        raise SandboxError("no Docker engine")
    trajs = await collect(broken, ScriptedPolicy([FINISH]), TASKS[:2], progress=False)
    assert [t.status for t in trajs] == ["aborted", "aborted"]
    assert all("no Docker engine" in t.error for t in trajs)


async def test_judge_timeouts_leave_steps_unvoted_and_the_run_goes_on():
    with ScriptedOpenAIServer(Reply("\\boxed{1}", delay=5.0)) as server:
        judge = StepJudge(OpenAIPolicy(server.url, model="j", max_retries=0), timeout=0.3)
        trajs = await collect(make_env, ScriptedPolicy([ECHO, FINISH]), TASKS, judge=judge,
                              parallel=3, progress=False)
    for t in trajs:
        assert t.status == "finished" and t.outcome == 1.0
        assert all(s.votes == [] and s.vote_mean is None and "Timeout" in s.judge_error
                   for s in t.steps)


async def test_judge_is_not_awaited_between_steps():
    """Each step's judge call waits until the policy has drawn the last step: a loop that awaited the judge could not get there."""
    last_step_drawn = threading.Event()
    seen: list[bool] = []

    def judge_waiting_for_the_last_step(req):
        seen.append(last_step_drawn.wait(timeout=20))
        return "\\boxed{1}"

    class Noting(ScriptedPolicy):
        """Stands in for a model and notes when it draws the last (third) step."""

        async def generate(self, messages, tools=None, **sampling):
            if self.calls == 2:
                last_step_drawn.set()
            return await super().generate(messages, tools, **sampling)

    with ScriptedOpenAIServer(judge_waiting_for_the_last_step) as server:
        judge = StepJudge(OpenAIPolicy(server.url, model="j"))
        trajs = await collect(make_env, Noting([ECHO, ECHO, FINISH]), TASKS[:1], judge=judge, progress=False)
    assert [s.votes for s in trajs[0].steps] == [[1], [1], [1]]
    assert seen == [True, True, True]


async def test_two_roles_each_step_attributed_to_its_policy():
    planner = ScriptedPolicy([ECHO], name="planner")
    executor = ScriptedPolicy([ECHO, ECHO, ECHO, FINISH], name="executor")
    seen: dict[str, list[str]] = {"planner": [], "executor": []}
    for name, p in (("planner", planner), ("executor", executor)):
        script = p.script

        def scripted(messages, name=name, script=script):
            seen[name].append(messages[0]["content"])
            return script[min(sum(m["role"] == "assistant" for m in messages), len(script) - 1)]
        p.script = scripted
    trajs = await collect(make_env, {"planner": planner, "executor": executor}, TASKS[:2],
                          router=planner_executor(k=2), progress=False)
    for t in trajs:
        assert [s.role for s in t.steps] == ["planner", "executor", "planner", "executor"]
        assert [s.index for s in t.steps_of("planner")] == [0, 2]
        assert t.status == "finished"
    assert planner.calls == 4 and executor.calls == 4
    assert all("You are the planner" in s for s in seen["planner"])
    assert all("You are the executor" in s for s in seen["executor"])


async def test_router_naming_an_unknown_role_aborts():
    router = Router(lambda i, t: "nobody")
    with ThreadPoolExecutor(1) as pool:
        env = make_env()
        traj = await run_episode(env, {"agent": ScriptedPolicy([FINISH])}, task=TASKS[0],
                                 group_id="g", sample=0, router=router, executor=pool)
        env.close()
    assert traj.status == "aborted" and "nobody" in traj.error


async def test_tiny_model_in_the_loop():
    from nextstate.agents.chat import ChatConfig
    from nextstate.agents.hf_policy import HFPolicy
    policy = HFPolicy("tiny")
    trajs = await collect(lambda: EchoEnv(TASKS, max_steps=2), policy, TASKS[:1], n_samples=2,
                          parallel=2, chat=ChatConfig(max_response_tokens=16),
                          sampling={"temperature": 1.0}, progress=False)
    for t in trajs:
        assert t.status in ("truncated", "finished") and 1 <= len(t.steps) <= 2
        for s in t.steps:
            assert s.ids_from_server and 0 < len(s.response_ids) <= 16
            assert len(s.logprobs) == len(s.response_ids) and all(lp <= 0 for lp in s.logprobs)
            assert "Task number 0" in policy.tokenizer.decode(s.prompt_ids)


async def test_several_policies_without_a_router_is_a_configuration_error():
    policies = {"a": ScriptedPolicy([FINISH]), "b": ScriptedPolicy([FINISH])}
    with pytest.raises(ValueError, match="need a router"):
        await collect(make_env, policies, TASKS[:1], progress=False)
