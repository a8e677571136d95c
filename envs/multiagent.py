"""Several agents in one episode, and PettingZoo's AEC API over nextstate envs.

Two routes lead to a multi-agent episode:

* **A single-agent family plus a router** (planner/executor, turn-taking): the roles take turns
  on one env and share its history; :func:`train.rollout.run_episode` plays them, and
  :class:`AECEnv` exposes them with ``roles=[...]`` and ``router=``.
* **A native multi-agent family**: a :class:`MultiAgentEnv` decides who acts next
  (``agent_selection``) and what each agent sees (its own inbox), so information can be split
  between agents. :mod:`envs.relay` is one.

:class:`MultiAgentEnv` keeps the single-agent Gymnasium API: ``step(action)`` is the selected
agent's action, and its observation is what the *next* selected agent sees. ``info["agent"]``
names who acted and ``info["next_agent"]`` who acts next.

:class:`AECEnv` is PettingZoo's ``AECEnv`` (``agents``, ``agent_selection``, ``observe``,
``step``, ``last``) over either route; it passes PettingZoo's own ``api_test``. The team shares
one reward: the episode's outcome, given to every agent on the final step.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, ClassVar

import numpy as np
import pettingzoo

from nextstate.envs.actions import MAX_ACTION_BYTES, ToolCall, parse_action
from nextstate.envs.base import MAX_OBSERVATION_CHARS, AnyText, NextStateEnv, Task, ToolResult


class MultiAgentEnv(NextStateEnv):
    """A turn-based env of several agents that decides who acts and what each one sees.

    A subclass declares ``possible_agents`` and ``agent_tools`` (each agent's tools; ``tools`` is
    their union) and may override :meth:`briefing` (an agent's own instruction) and
    :meth:`next_agent` (default: round robin). Its :meth:`call_tool` may :meth:`send` text to
    another agent's inbox; the acting agent's own tool output goes to its inbox.
    """

    possible_agents: ClassVar[list[str]] = []
    agent_tools: ClassVar[dict[str, list[dict[str, Any]]]] = {}
    measures: ClassVar[dict[str, str]] = {}   # "<agent>/<name>": what it measures (see agent_measures)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.agent_selection = self.possible_agents[0]
        self._inbox: dict[str, list[str]] = {}
        self._briefed: set[str] = set()

    # -- hooks -----------------------------------------------------------------------------
    def briefing(self, agent: str, task: Task) -> str:
        """What ``agent`` is told before its first turn (default: the task's instruction)."""
        return task.instruction

    def next_agent(self, agent: str) -> str:
        """Who acts after ``agent`` (default: the next of ``possible_agents``, round robin)."""
        i = self.possible_agents.index(agent)
        return self.possible_agents[(i + 1) % len(self.possible_agents)]

    @classmethod
    def agent_measures(cls, task: Task, actions: list[tuple[str, dict[str, Any] | None]]) -> dict[str, float]:
        """Each agent's own measures of one episode of ``task`` (values in [0, 1], named as in
        ``measures``), from ``actions``: who acted and the tool call it made (None: an invalid
        action), in order. A measure the episode says nothing about is left out (default: none)."""
        return {}

    # -- for subclasses' tools ---------------------------------------------------------------
    def send(self, agent: str, text: str) -> None:
        """Put ``text`` in ``agent``'s inbox: it reads it at its next turn."""
        self._inbox[agent].append(text)

    def tools_for(self, agent: str) -> list[dict[str, Any]]:
        """The tools ``agent`` may call."""
        return self.agent_tools[agent]

    def view(self, agent: str) -> str:
        """What ``agent`` sees now: its briefing at its first turn, then what reached its inbox
        since its last turn (emptied by reading)."""
        parts = [] if agent in self._briefed else [self.briefing(agent, self.task)]
        self._briefed.add(agent)
        parts += self._inbox[agent]
        self._inbox[agent] = []
        return "\n\n".join(parts) if parts else "(nothing new)"

    # -- the NextStateEnv hooks this class fills in ---------------------------------------------
    def parse(self, action: Any) -> ToolCall:
        return parse_action(action, self.tools_for(self.agent_selection))

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.agent_selection = self.possible_agents[0]
        self._inbox = {a: [] for a in self.possible_agents}
        self._briefed = set()
        obs, info = super().reset(seed=seed, options=options)
        info.update(agent=self.agent_selection, tools=copy.deepcopy(self.tools_for(self.agent_selection)))
        return obs, info

    def first_observation(self, task: Task, extras: Any) -> Any:
        if extras is not None:
            self.send(self.agent_selection, str(extras))
        return self.view(self.agent_selection)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        actor = self.agent_selection
        obs, reward, terminated, truncated, info = super().step(action)
        info.update(agent=actor, next_agent=self.agent_selection)
        return obs, reward, terminated, truncated, info

    def observe(self, result: ToolResult) -> Any:
        """The acting agent's result goes to its inbox; the turn passes; the next agent's view."""
        actor = self.agent_selection
        self.send(actor, result.output)
        self.agent_selection = self.next_agent(actor)
        return self.view(self.agent_selection)


class Text(str):
    """An observation string that carries the ``dtype`` of gymnasium's ``Text`` space (``<U``).

    PettingZoo's ``api_test`` compares each observation's ``dtype`` with its space's; a plain
    ``str`` has none. This is a ``str`` in every other respect."""

    dtype = np.dtype("<U")


class AECEnv(pettingzoo.AECEnv):
    """PettingZoo's AEC API over a nextstate env.

    Args:
        env: a :class:`MultiAgentEnv` (it decides who acts), or any :class:`NextStateEnv`
            played by several ``roles`` that a ``router`` picks from (they share the history).
        roles: the agents of a single-agent env (default: ``["agent"]``).
        router: ``router(step_index) -> role`` for a single-agent env (default: round robin).

    ``reset(options={"task": t})`` plays task ``t`` (a Task or an id); without it the env draws one.
    """

    metadata = {"name": "nextstate_aec_v0", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(self, env: NextStateEnv, roles: list[str] | None = None,
                 router: Callable[[int], str] | None = None):
        super().__init__()
        self.env = env
        native = isinstance(env, MultiAgentEnv)
        if native and (roles or router):
            raise ValueError("a MultiAgentEnv decides who acts: pass no roles or router")
        self.possible_agents = list(env.possible_agents if native else roles or ["agent"])
        self._router = None if native else router or (lambda i: self.possible_agents[i % len(self.possible_agents)])
        self._spaces = {a: (AnyText(MAX_OBSERVATION_CHARS), AnyText(MAX_ACTION_BYTES)) for a in self.possible_agents}
        self._seen: dict[str, str] = {}
        self._steps = 0

    def observation_space(self, agent: str) -> AnyText:
        return self._spaces[agent][0]

    def action_space(self, agent: str) -> AnyText:
        return self._spaces[agent][1]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        task = (options or {}).get("task")
        obs, info = self.env.reset(seed=seed, options={"task": task} if task is not None else None)
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._steps = 0
        self._seen = {a: "" for a in self.agents}
        self.agent_selection = self._who_acts()
        self._seen[self.agent_selection] = self._text(obs)
        self.infos[self.agent_selection] = {"task_id": info["task_id"]}

    def observe(self, agent: str) -> Text:
        return Text(self._seen[agent])

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._steps += 1
        self._clear_rewards()
        if terminated or truncated:
            for a in self.agents:
                self.rewards[a] = float(reward)
                self.terminations[a], self.truncations[a] = bool(terminated), bool(truncated)
                self.infos[a] = {"outcome": info.get("outcome"), "aborted": info.get("aborted")}
                self._seen[a] = self._text(obs)
            self._deads_step_first()
        else:
            self.agent_selection = self._who_acts()
            self.infos = {a: {} for a in self.agents}
            self.infos[self.agent_selection] = {"next_state": info.get("next_state")}
            shared = self._router is not None
            for a in (self.agents if shared else [self.agent_selection]):
                self._seen[a] = self._text(obs)
        self._accumulate_rewards()

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def _who_acts(self) -> str:
        return self.env.agent_selection if self._router is None else self._router(self._steps)

    def _text(self, obs: Any) -> str:
        return self.env.present(obs).text
