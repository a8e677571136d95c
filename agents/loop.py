"""The agent loop: episodes as asyncio tasks, judged step by step in the background.

:func:`run_episode` plays one episode: reset, then generate -> step (blocking
env calls run in the caller's thread pool) -> fire the step judge without
waiting for it, until the env ends the episode; the pending judge requests are
awaited at the end and their votes attached to the steps. An infrastructure
fault (a sandbox that died, an env abort, a policy that failed after its
retries) ends the episode as ``status="aborted"`` with the error: it neither
crashes the batch nor gets a score.

:func:`collect` runs ``len(tasks) * n_samples`` episodes, at most ``parallel``
at a time, each on its own env (made by ``env_factory``, reused between
episodes; the envs should share one SandboxPool that the caller made).

Several agents can share one episode: ``policies`` maps roles to policies and
a router picks the role for each step (:func:`single_role`,
:func:`planner_executor`); every step records its role.
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

from agents.chat import ChatConfig, Turn, build_messages, system_prompt
from agents.policy import Policy, PolicyError
from agents.recorder import Recorder
from agents.trajectory import Step, Trajectory
from envs.base import INFRA_ERRORS
from judges.prm import JudgeRequest, JudgeResult, StepJudge

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


async def _timed_judge(judge: StepJudge, req: JudgeRequest) -> tuple[JudgeResult, float]:
    start = time.monotonic()
    result = await judge.judge(req)
    return result, time.monotonic() - start


def _roles(policies: Policy | Mapping[str, Policy], router: Callable[[int, Trajectory], str] | None
           ) -> tuple[dict[str, Policy], Callable[[int, Trajectory], str]]:
    roles = dict(policies) if isinstance(policies, Mapping) else {"agent": policies}
    if router is None and len(roles) != 1:
        raise ValueError(f"several policies ({sorted(roles)}) need a router to choose between them")
    return roles, router or single_role(next(iter(roles)))


async def run_episode(env: Any, policies: Policy | Mapping[str, Policy], *, task: Any,
                      group_id: str, sample: int, judge: StepJudge | None = None,
                      router: Callable[[int, Trajectory], str] | None = None,
                      recorder: Recorder | None = None, executor: ThreadPoolExecutor,
                      chat: ChatConfig | None = None,
                      sampling: Mapping[str, Any] | None = None) -> Trajectory:
    """Play one episode of ``task`` on ``env``; never raises for infrastructure faults."""
    roles, router = _roles(policies, router)
    notes: dict[str, str] = getattr(router, "notes", {})
    chat = chat or ChatConfig()
    gen_kw = {**chat.sampling(), **(sampling or {})}
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    traj = Trajectory(task_id=task.id, group_id=group_id, sample=sample, family=env.family,
                      info={"instruction": task.instruction})
    if judge is not None:
        judge.template(env.family)  # a missing template is a configuration error: fail now
    pending: list[tuple[Step, asyncio.Task]] = []
    where = {"group_id": group_id, "task_id": task.id, "sample": sample}
    try:
        raw_first, _ = await loop.run_in_executor(executor, partial(env.reset, options={"task": task}))
        first_obs = env.present(raw_first)  # the one view of an observation (envs.base.Observation)
        turns: list[Turn] = []
        prev_obs = first_obs
        while True:
            index = len(traj.steps)
            role = router(index, traj)
            if role not in roles:
                raise KeyError(f"router chose role {role!r}, but the policies are {sorted(roles)}")
            policy = roles[role]
            system = system_prompt(env.family, env.tools, notes.get(role),
                                   tools_in_text=not policy.renders_tools)
            messages = build_messages(system, first_obs, turns, policy=policy, tools=env.tools,
                                      config=chat)
            t0 = time.monotonic()
            gen = await policy.generate(messages, env.tools if policy.renders_tools else None, **gen_kw)
            t1 = time.monotonic()
            raw_obs, reward, terminated, truncated, info = await loop.run_in_executor(
                executor, env.step, gen.text)
            obs = env.present(raw_obs)
            state = info.get("next_state", {})
            step = Step(role=role, index=index, prompt_ids=gen.prompt_ids,
                        response_ids=gen.response_ids, logprobs=gen.logprobs, text=gen.text,
                        action=state.get("action"), next_state=state, observation=obs,
                        timing={"generate": t1 - t0, "env": time.monotonic() - t1},
                        ids_from_server=gen.ids_from_server, finish_reason=gen.finish_reason)
            traj.steps.append(step)
            if recorder:
                recorder.record("step", {**where, "step": index, "role": role, "messages": messages,
                                         "text": gen.text, "action": step.action, "next_state": state,
                                         "observation": obs, "reward": reward,
                                         "ids_from_server": gen.ids_from_server})
            if "aborted" in info:
                traj.status, traj.error = "aborted", str(info["aborted"])
                break
            if judge is not None:
                history = [{"action": s.action or s.text, "next_state": s.next_state} for s in traj.steps[:-1]]
                req = JudgeRequest(env.family, task.instruction, history, step.action or gen.text, state,
                                   before=prev_obs, after=obs)
                pending.append((step, asyncio.create_task(_timed_judge(judge, req))))
            turns.append(Turn(gen.text, obs, valid=bool(state.get("valid", True))))
            prev_obs = obs
            if terminated or truncated:
                traj.status = "finished" if terminated else "truncated"
                traj.info["outcome"] = info.get("outcome")
                traj.outcome = (info.get("outcome") or {}).get("reward")
                break
    except asyncio.CancelledError:
        for _, t in pending:
            t.cancel()
        raise
    except Exception as e:  # infrastructure (sandbox, pool, policy server) or an env bug
        expected = isinstance(e, (*INFRA_ERRORS, PolicyError))
        log.warning("episode %s/%s aborted: %s: %s", group_id, sample, type(e).__name__, e,
                    exc_info=not expected)
        traj.status, traj.error = "aborted", f"{type(e).__name__}: {e}"
        traj.outcome = None
    acted = time.monotonic()
    for step, t in pending:
        result, elapsed = await t
        step.votes, step.score, step.vote_mean = result.votes, float(result.score), result.mean
        step.hint, step.judge_error = result.hint, result.error
        step.timing["judge"] = elapsed
        if recorder:
            recorder.record("judge", {**where, "step": step.index, **result.to_dict()})
    traj.info["timing"] = {"episode": time.monotonic() - started,
                           "judge_wait": time.monotonic() - acted}  # judging left after the last step
    if recorder:
        recorder.record("trajectory", {**where, "status": traj.status, "error": traj.error,
                                       "outcome": traj.outcome, "steps": len(traj.steps),
                                       "step_scores": [s.score for s in traj.steps]})
    return traj


async def collect(env_factory: Callable[[], Any], policies: Policy | Mapping[str, Policy],
                  tasks: Sequence[Any], n_samples: int = 1, parallel: int = 8,
                  judge: StepJudge | None = None, *,
                  router: Callable[[int, Trajectory], str] | None = None,
                  recorder: Recorder | None = None, chat: ChatConfig | None = None,
                  sampling: Mapping[str, Any] | None = None, batch_tag: str | None = None,
                  progress: bool = True) -> list[Trajectory]:
    """Run every task ``n_samples`` times, ``parallel`` episodes at once.

    Returns trajectories ordered by task, then sample. ``group_id`` is
    ``"<task id>@<batch tag>"``, so the samples of one task form one group.
    """
    _roles(policies, router)  # a configuration error fails here, before any episode starts
    batch_tag = batch_tag or uuid.uuid4().hex[:8]
    jobs = [(task, s) for task in tasks for s in range(n_samples)]
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="env")
    free: list[Any] = []
    made: list[Any] = []
    slots = asyncio.Semaphore(max(1, parallel))
    bar = tqdm(total=len(jobs), desc="episodes", disable=not progress)

    async def one(task: Any, sample: int) -> Trajectory:
        group_id = f"{task.id}@{batch_tag}"
        async with slots:
            env = free.pop() if free else None
            if env is None:
                try:
                    env = await loop.run_in_executor(executor, env_factory)
                except Exception as e:  # e.g. no Docker engine, image missing
                    log.warning("episode %s/%s aborted: could not make an env: %s", group_id, sample, e)
                    bar.update(1)
                    traj = Trajectory(task.id, group_id, sample, family="", status="aborted",
                                      error=f"{type(e).__name__}: {e}")
                    if recorder:  # logged like any episode, so the log's aborted count is complete
                        recorder.record("trajectory", {"group_id": group_id, "task_id": task.id, "sample": sample,
                                                       "status": "aborted", "error": traj.error, "outcome": None,
                                                       "steps": 0, "step_scores": []})
                    return traj
                made.append(env)
            try:
                traj = await run_episode(env, policies, task=task, group_id=group_id, sample=sample,
                                         judge=judge, router=router, recorder=recorder,
                                         executor=executor, chat=chat, sampling=sampling)
            finally:
                free.append(env)
        bar.update(1)
        return traj

    try:
        return list(await asyncio.gather(*(one(t, s) for t, s in jobs)))
    finally:
        bar.close()
        await asyncio.gather(*(loop.run_in_executor(executor, env.close) for env in made),
                             return_exceptions=True)
        executor.shutdown(wait=False)
