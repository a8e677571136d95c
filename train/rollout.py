"""Rollouts: the agent loop, episodes as asyncio tasks judged step by step in the background.
(The envs, pool and judge a :class:`~train.config.Config` asks for are made in :mod:`train.wiring`.)

:func:`run_episode` plays one episode in a few named steps: reset, then
:func:`_act` (the routed policy generates) -> :func:`_step_env` (the env takes
the text, in the caller's thread pool; the step is recorded) -> :func:`_judge`
(the step judge is fired without waiting), until the env ends the episode;
:func:`_join` awaits the judge and attaches the votes to the steps. An infrastructure
fault (a sandbox that died, an env abort, a policy that failed after its
retries) ends the episode as ``status="aborted"`` with the error: it neither
crashes the batch nor gets a score. So does a grade whose reason is the machinery's
(:func:`envs.validate.infrastructure`: a test runner that could not start, a sandbox that died):
its outcome says nothing of the agent's actions, so it is not trained on.

:func:`collect` runs ``len(tasks) * n_samples`` episodes, at most ``parallel``
at a time, each on its own env (made by ``env_factory``, reused between
episodes; the envs should share one SandboxPool that the caller made).

Several agents can share one episode: ``policies`` maps roles to policies and
a router picks the role for each step (:func:`single_role`,
:func:`planner_executor`); the roles share the episode's history. On a
:class:`~envs.multiagent.MultiAgentEnv` the env picks the role instead
(``agent_selection``) and each role sees only its own view: its briefing, its own turns and
what reached it (:class:`_View`). Every step records its role.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping, Sequence

from tqdm.auto import tqdm

from nextstate.agents.chat import ChatConfig, Turn, build_messages, prompt_head
from nextstate.agents.policy import Generation, Policy, PolicyError
from nextstate.agents.recorder import Recorder
from nextstate.agents.trajectory import Step, Trajectory
from nextstate.envs.base import INFRA_ERRORS, Observation
from nextstate.envs.multiagent import MultiAgentEnv
from nextstate.envs.pool import EnvCache
from nextstate.envs.validate import infrastructure
from nextstate.judges.hints import teacher_messages
from nextstate.judges.prm import JudgeRequest, JudgeResult, StepJudge

log = logging.getLogger(__name__)


@dataclass
class Router:
    """Picks who acts: ``pick(step_index, trajectory) -> role``; ``notes[role]`` is added
    to that role's system prompt."""

    pick: Callable[[int, Trajectory], str]
    notes: dict[str, str] = field(default_factory=dict)

    def __call__(self, step_index: int, trajectory: Trajectory) -> str:
        return self.pick(step_index, trajectory)


def single_role(role: str = "agent") -> Router:
    """One policy takes every step."""
    return Router(lambda i, t: role)


PLANNER_NOTE = ("You are the planner. Review the progress so far, write a short numbered plan for "
                "the next steps, and take the first action of that plan.")
EXECUTOR_NOTE = ("You are the executor. Follow the latest plan in the conversation and take its "
                 "next action.")


def planner_executor(k: int = 3, planner: str = "planner", executor: str = "executor",
                     notes: dict[str, str] | None = None) -> Router:
    """The planner acts at step 0 and every ``k`` steps; the executor acts otherwise."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return Router(lambda i, t: planner if i % k == 0 else executor,
                  {planner: PLANNER_NOTE, executor: EXECUTOR_NOTE, **(notes or {})})


_NO_ENV = object()   # _roles' env when none could be made: the plain checks only


def _roles(policies: Policy | Mapping[str, Policy], router: Callable[[int, Trajectory], str] | None,
           env: Any) -> tuple[dict[str, Policy], Callable[[int, Trajectory], str]]:
    """The roles and who picks among them: a MultiAgentEnv picks, else ``router`` (or the one role)."""
    roles = dict(policies) if isinstance(policies, Mapping) else {"agent": policies}
    if isinstance(env, MultiAgentEnv):
        if router is not None:
            raise ValueError(f"{env.family}: the env decides who acts; pass no router")
        missing = sorted(set(env.possible_agents) - set(roles))
        if missing:
            raise ValueError(f"{env.family}: no policy for the agents {', '.join(missing)} "
                             f"(policies: {', '.join(sorted(roles))})")
        return roles, Router(lambda i, t: env.agent_selection)
    if router is None and len(roles) != 1:
        raise ValueError(f"several policies ({sorted(roles)}) need a router to choose between them")
    return roles, router or single_role(next(iter(roles)))


@dataclass
class _View:
    """What one agent of a :class:`~envs.multiagent.MultiAgentEnv` has seen: its first
    observation, its own turns, and its last action until its next observation arrives."""

    first: Observation | None = None
    turns: list[Turn] = field(default_factory=list)
    waiting: tuple[str, bool] | None = None

    def receive(self, obs: Observation) -> None:
        """``obs`` is what this agent sees at its next turn."""
        if self.waiting is not None:
            self.turns.append(Turn(self.waiting[0], obs, valid=self.waiting[1]))
            self.waiting = None
        elif self.first is None:
            self.first = obs


@dataclass
class Histories:
    """What each role of an episode is shown: one history shared by every role (a single-agent
    env, roles picked by a router), or on a :class:`~envs.multiagent.MultiAgentEnv` one
    :class:`_View` per agent. The agent loop and warm starts (:mod:`train.sft`) keep them alike."""

    first: Observation | None = None
    turns: list[Turn] = field(default_factory=list)
    views: dict[str, _View] | None = None

    @classmethod
    def start(cls, env: Any, first: Observation) -> "Histories":
        """The histories after ``env.reset`` returned ``first`` (as ``env.present`` shows it)."""
        if not isinstance(env, MultiAgentEnv):
            return cls(first)
        views = {agent: _View() for agent in env.possible_agents}
        views[env.agent_selection].receive(first)
        return cls(first, views=views)

    def of(self, role: str) -> tuple[Observation | None, list[Turn]]:
        """What ``role`` is shown: the first observation and the turns since."""
        if self.views is None:
            return self.first, self.turns
        view = self.views[role]
        return view.first, view.turns

    def record(self, role: str, text: str, obs: Observation, valid: bool, next_role: str) -> None:
        """``role`` wrote ``text``; ``obs`` is what ``next_role`` (who acts next) sees."""
        if self.views is None:
            self.turns.append(Turn(text, obs, valid=valid))
            return
        self.views[role].waiting = (text, valid)
        self.views[next_role].receive(obs)


def role_prompt(env: Any, role: str, histories: Histories, policy: Policy, chat: ChatConfig,
                note: str | None = None) -> tuple[list[dict], list[dict] | None]:
    """``(messages, tools)`` of ``role``'s next step: its own tools on a MultiAgentEnv, the
    system prompt (with ``note``), and its history. The one way a step's prompt is built."""
    env_tools = env.tools_for(role) if histories.views is not None else env.tools
    system, tools = prompt_head(env.family, env_tools, policy, chat, note)
    first, turns = histories.of(role)
    return build_messages(system, first, turns, policy=policy, tools=tools, config=chat), tools


@dataclass
class _Episode:
    """What one episode's steps share: the env, the policies, the settings and the record so far."""

    env: Any
    task: Any
    roles: dict[str, Policy]
    router: Callable[[int, Trajectory], str]
    chat: ChatConfig
    gen_kw: dict[str, Any]
    executor: ThreadPoolExecutor
    recorder: Recorder | None
    traj: Trajectory
    where: dict[str, Any]
    histories: Histories = field(default_factory=Histories)
    pending: list[tuple[Step, asyncio.Task]] = field(default_factory=list)
    hinter: Any = None                      # a hint source (judges.hints), or None
    hinting: list[tuple[Step, asyncio.Task]] = field(default_factory=list)
    prompts: dict[int, tuple[list[dict], list[dict] | None, Policy]] = field(default_factory=dict)

    def after_step(self, step: Step, info: dict[str, Any]) -> None:
        """Record the step in the history (or histories) the next prompts are built from."""
        self.histories.record(step.role, step.text, step.observation, bool(step.next_state.get("valid", True)),
                              info.get("next_agent", step.role))

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking env call, run in the episode's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


async def _act(ep: _Episode) -> tuple[str, list[dict], Generation, float]:
    """The routed role's policy answers the episode so far: ``(role, messages, generation, seconds)``."""
    role = ep.router(len(ep.traj.steps), ep.traj)
    if role not in ep.roles:
        raise KeyError(f"router chose role {role!r}, but the policies are {sorted(ep.roles)}")
    policy = ep.roles[role]
    messages, tools = role_prompt(ep.env, role, ep.histories, policy, ep.chat, getattr(ep.router, "notes", {}).get(role))
    t0 = time.monotonic()
    gen = await policy.generate(messages, tools, **ep.gen_kw)
    if ep.hinter is not None:   # kept to build the teacher context once a hint comes
        ep.prompts[len(ep.traj.steps)] = (messages, tools, policy)
    return role, messages, gen, time.monotonic() - t0


async def _step_env(ep: _Episode, role: str, messages: list[dict], gen: Generation, generate_s: float
                    ) -> tuple[Step, bool, bool, dict[str, Any]]:
    """The env takes the generated text; the step is recorded: ``(step, terminated, truncated, info)``."""
    t1 = time.monotonic()
    raw_obs, reward, terminated, truncated, info = await ep.in_thread(ep.env.step, gen.text)
    obs = ep.env.present(raw_obs)
    state = info.get("next_state", {})
    index = len(ep.traj.steps)
    step = Step(role=role, index=index, prompt_ids=gen.prompt_ids,
                response_ids=gen.response_ids, logprobs=gen.logprobs, text=gen.text,
                action=state.get("action"), next_state=state, observation=obs,
                timing={"generate": generate_s, "env": time.monotonic() - t1},
                ids_from_server=gen.ids_from_server, finish_reason=gen.finish_reason)
    ep.traj.steps.append(step)
    if ep.recorder:
        ep.recorder.record("step", {**ep.where, "step": index, "role": role, "messages": messages,
                                    "text": gen.text, "action": step.action, "next_state": state,
                                    "observation": obs, "reward": reward,
                                    "ids_from_server": gen.ids_from_server})
    return step, terminated, truncated, info


async def _timed_judge(judge: StepJudge, req: JudgeRequest) -> tuple[JudgeResult, float]:
    start = time.monotonic()
    result = await judge.judge(req)
    return result, time.monotonic() - start


def _request(ep: _Episode, step: Step, before: Observation | None) -> JudgeRequest:
    """What a judge or hint source reads of ``step``: the task, the history, the action, the next state."""
    history = [{"action": s.action or s.text, "next_state": s.next_state} for s in ep.traj.steps[:-1]]
    return JudgeRequest(ep.env.family, ep.task.instruction, history, step.action or step.text,
                        step.next_state, before=before, after=step.observation)


def _judge(ep: _Episode, judge: StepJudge, step: Step, before: Observation | None) -> None:
    """Fire the judge on ``step`` without waiting; :func:`_join` collects its votes."""
    ep.pending.append((step, asyncio.create_task(_timed_judge(judge, _request(ep, step, before)))))


def _hint(ep: _Episode, step: Step, before: Observation | None) -> None:
    """Ask the hint source about ``step`` without waiting; :func:`_join` builds the teacher context."""
    ep.hinting.append((step, asyncio.create_task(ep.hinter.judge(_request(ep, step, before)))))


async def _join(ep: _Episode) -> None:
    """Await the pending judge requests and attach their votes to the steps."""
    for step, t in ep.pending:
        result, elapsed = await t
        step.votes, step.score, step.vote_mean = result.votes, float(result.score), result.mean
        step.hint, step.judge_error = result.hint, result.error
        step.timing["judge"] = elapsed
        if ep.recorder:
            ep.recorder.record("judge", {**ep.where, "step": step.index, **result.to_dict()})
    for step, t in ep.hinting:
        result = await t
        step.hint = result.hint
        if result.hint and step.index in ep.prompts:
            messages, tools, policy = ep.prompts[step.index]   # a policy without token ids has no teacher context
            step.teacher_prompt_ids = policy.prompt_ids(teacher_messages(messages, result.hint), tools) \
                if hasattr(policy, "prompt_ids") else None
        if ep.recorder:
            ep.recorder.record("hint", {**ep.where, "step": step.index, **result.to_dict()})


async def run_episode(env: Any, policies: Policy | Mapping[str, Policy], *, task: Any,
                      group_id: str, sample: int, judge: StepJudge | None = None,
                      router: Callable[[int, Trajectory], str] | None = None,
                      recorder: Recorder | None = None, executor: ThreadPoolExecutor,
                      chat: ChatConfig | None = None,
                      sampling: Mapping[str, Any] | None = None,
                      fields: Mapping[str, Any] | None = None, hinter: Any = None) -> Trajectory:
    """Play one episode of ``task`` on ``env``: act, step the env, judge (in the background),
    until the env ends it; then join the votes (and the hints of ``hinter``, a hint source of
    :mod:`judges.hints`, with each hinted step's teacher context). Never raises for
    infrastructure faults. ``fields`` are added to every record of the episode."""
    roles, router = _roles(policies, router, env)
    chat = chat or ChatConfig()
    started = time.monotonic()
    traj = Trajectory(task_id=task.id, group_id=group_id, sample=sample, family=env.family,
                      info={"instruction": task.instruction})
    for j in (judge, hinter):
        if j is not None:
            j.template(env.family)  # a missing template is a configuration error: fail now
    ep = _Episode(env, task, roles, router, chat, {**chat.sampling(), **(sampling or {})}, executor,
                  recorder, traj, {"group_id": group_id, "task_id": task.id, "sample": sample, **(fields or {})},
                  hinter=hinter)
    try:
        raw_first, _ = await ep.in_thread(partial(env.reset, options={"task": task}))
        prev_obs = env.present(raw_first)  # the one view of an observation
        ep.histories = Histories.start(env, prev_obs)
        while True:
            step, terminated, truncated, info = await _step_env(ep, *await _act(ep))
            if "aborted" in info:
                traj.status, traj.error = "aborted", str(info["aborted"])
                break
            if judge is not None:
                _judge(ep, judge, step, prev_obs)
            if hinter is not None:
                _hint(ep, step, prev_obs)
            ep.after_step(step, info)
            prev_obs = step.observation
            if terminated or truncated:
                traj.status = "finished" if terminated else "truncated"
                traj.info["outcome"] = info.get("outcome")
                traj.outcome = (info.get("outcome") or {}).get("reward")
                reason = str((info.get("outcome") or {}).get("reason") or "")
                if infrastructure(reason):
                    traj.status, traj.error = "aborted", f"infrastructure ({infrastructure(reason)}): {reason}"
                    traj.outcome = None
                break
    except asyncio.CancelledError:
        for _, t in ep.pending + ep.hinting:
            t.cancel()
        raise
    except Exception as e:  # infrastructure (sandbox, pool, policy server) or an env bug
        expected = isinstance(e, (*INFRA_ERRORS, PolicyError))
        log.warning("episode %s/%s aborted: %s: %s", group_id, sample, type(e).__name__, e,
                    exc_info=not expected)
        traj.status, traj.error = "aborted", f"{type(e).__name__}: {e}"
        traj.outcome = None
    acted = time.monotonic()
    await _join(ep)
    traj.info["timing"] = {"episode": time.monotonic() - started,
                           "judge_wait": time.monotonic() - acted}  # judging left after the last step
    if recorder:
        recorder.record("trajectory", {**ep.where, "status": traj.status, "error": traj.error,
                                       "outcome": traj.outcome, "steps": len(traj.steps),
                                       "step_scores": [s.score for s in traj.steps],
                                       "grade": traj.info.get("outcome")})   # the grader's details
    return traj


async def collect(env_factory: Callable[[], Any], policies: Policy | Mapping[str, Policy],
                  tasks: Sequence[Any], n_samples: int = 1, parallel: int = 8,
                  judge: StepJudge | None = None, *,
                  router: Callable[[int, Trajectory], str] | None = None,
                  recorder: Recorder | None = None, chat: ChatConfig | None = None,
                  sampling: Mapping[str, Any] | None = None, batch_tag: str | None = None,
                  fields: Mapping[str, Any] | None = None, progress: bool = True,
                  hinter: Any = None) -> list[Trajectory]:
    """Run every task ``n_samples`` times, ``parallel`` episodes at once.

    Returns trajectories ordered by task, then sample. ``group_id`` is
    ``"<task id>@<batch tag>"``, so the samples of one task form one group.
    ``fields`` are added to every record of these episodes.
    """
    batch_tag = batch_tag or uuid.uuid4().hex[:8]
    jobs = [(task, s) for task in tasks for s in range(n_samples)]
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="env")
    envs = EnvCache(env_factory)
    try:  # a configuration error fails here, before any episode starts
        first = await envs.atake(executor)
    except Exception:  # noqa: BLE001 -- no env can be made: every episode says why below
        first = None
    if first is not None:
        envs.give_back(first)
    try:
        _roles(policies, router, first if first is not None else _NO_ENV)
    except ValueError:
        await loop.run_in_executor(executor, envs.close)
        executor.shutdown(wait=False)
        raise
    slots = asyncio.Semaphore(max(1, parallel))
    bar = tqdm(total=len(jobs), desc="episodes", disable=not progress)

    async def one(task: Any, sample: int) -> Trajectory:
        group_id = f"{task.id}@{batch_tag}"
        async with slots:
            try:
                env = await envs.atake(executor)
            except Exception as e:  # e.g. no Docker engine, image missing
                log.warning("episode %s/%s aborted: could not make an env: %s", group_id, sample, e)
                bar.update(1)
                traj = Trajectory(task.id, group_id, sample, family="", status="aborted",
                                  error=f"{type(e).__name__}: {e}")
                if recorder:  # logged like any episode, so the log's aborted count is complete
                    recorder.record("trajectory", {"group_id": group_id, "task_id": task.id, "sample": sample,
                                                   **(fields or {}), "status": "aborted", "error": traj.error,
                                                   "outcome": None, "steps": 0, "step_scores": []})
                return traj
            try:
                traj = await run_episode(env, policies, task=task, group_id=group_id, sample=sample,
                                         judge=judge, router=router, recorder=recorder,
                                         executor=executor, chat=chat, sampling=sampling, fields=fields,
                                         hinter=hinter)
            finally:
                envs.give_back(env)
        bar.update(1)
        return traj

    try:
        return list(await asyncio.gather(*(one(t, s) for t, s in jobs)))
    finally:
        bar.close()
        await loop.run_in_executor(executor, envs.close)
        executor.shutdown(wait=False)


def agent_measures(env_cls: type, tasks: Sequence[Any], trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Each agent's own measures (:meth:`~envs.multiagent.MultiAgentEnv.agent_measures`, e.g.
    ``reader/word_told``), averaged over the episodes not aborted that say something about
    them; ``{}`` for a single-agent family."""
    if not issubclass(env_cls, MultiAgentEnv):
        return {}
    by_id = {t.id: t for t in tasks}
    values: dict[str, list[float]] = {}
    for traj in trajectories:
        if traj.status != "aborted" and traj.task_id in by_id:
            measured = env_cls.agent_measures(by_id[traj.task_id], [(s.role, s.action) for s in traj.steps])
            for name, value in measured.items():
                values.setdefault(name, []).append(value)
    return {name: sum(v) / len(v) for name, v in values.items()}


async def heldout(env_factory: Callable[[], Any], policies: Policy | Mapping[str, Policy],
                  tasks: Sequence[Any], *, step: int, n_samples: int = 1, parallel: int = 8,
                  router: Callable[[int, Trajectory], str] | None = None,
                  recorder: Recorder | None = None, chat: ChatConfig | None = None,
                  sampling: Mapping[str, Any] | None = None, env_cls: type | None = None) -> dict[str, float]:
    """Held-out success after ``step`` updates: ``tasks`` played without a judge, not trained on;
    with ``env_cls`` (a multi-agent family), each agent's own measures too (``eval/<agent>/…``).

    The episodes are recorded with ``heldout: true`` and ``train_step: step`` (group ids
    ``<task id>@eval<step>``), so ``python -m viewer`` shows them apart from training's.
    """
    trajs = await collect(env_factory, policies, tasks, n_samples=n_samples, parallel=parallel,
                          router=router, recorder=recorder, chat=chat, sampling=sampling,
                          batch_tag=f"eval{step}", fields={"heldout": True, "train_step": step},
                          progress=False)
    done = [t for t in trajs if t.status != "aborted"]
    measures = agent_measures(env_cls, tasks, done) if env_cls is not None else {}
    return {"eval/success": sum((t.outcome or 0.0) > 0 for t in done) / len(done) if done else 0.0,
            "eval/outcome": sum(t.outcome or 0.0 for t in done) / len(done) if done else 0.0,
            "eval/episodes": len(done), **{f"eval/{k}": v for k, v in measures.items()}}
