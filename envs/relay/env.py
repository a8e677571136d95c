"""The relay family: two agents, information split between them.

The word of ``/app/note`` (one of :data:`WORDS`, the seed's turn in them) must be answered. The
``reader`` can run shell commands and so read the note, but has no ``answer`` tool; the
``writer`` has the ``answer`` tool but no shell, and sees only what the reader ``say``-s to it.
Neither can succeed alone: the reader must look first, then pass on what it read, and the writer
must act on that message. Turns alternate, reader first. ``answer`` ends the episode: +1 for the
note's word, -1 otherwise (and -1 when the steps run out).

Seeds: ``relay:START:COUNT``, ``relay:train`` (0..1023) and ``relay:heldout``
(1000000..1000063, never trained on).

:func:`hasty_actions` is a behaviour policy for warm starts (``python -m train.sft --source
hasty``) that leaves each agent something to learn: the reader looks half of the time, the
writer repeats what it was told half of the time.
"""

from __future__ import annotations

import random
import re
import shlex
from typing import Any, ClassVar, Iterable

from nextstate.envs.actions import ToolCall, tool_schema
from nextstate.envs.base import Outcome, Task, ToolResult
from nextstate.envs.multiagent import MultiAgentEnv
from nextstate.envs.terminal.procedural import WORDS

PREFIX = "relay:"
CATEGORY = "relay"
NOTE = "/app/note"
NAMED = {"train": (0, 1024), "heldout": (1_000_000, 64)}
INSTRUCTION = f"Team task: answer the word held in {NOTE}. The reader can read files; the writer answers."
BRIEFINGS = {
    "reader": f"You are the reader. Your teammate, the writer, must answer the word held in {NOTE}. "
              "You can run shell commands, but you cannot answer: tell the writer the word with `say`.",
    "writer": f"You are the writer. Your teammate, the reader, can read {NOTE}; you cannot see any file. "
              "When the reader tells you the word, answer it with `answer`.",
}
SAY = tool_schema("say", "Send a message to your teammate.", {"message": "string"})
BASH = tool_schema("bash", "Run a command in a bash shell.", {"command": "string"})
ANSWER = tool_schema("answer", "Answer the word; this ends the episode.", {"word": "string"})


def instance(seed: int) -> Task:
    """The task of ``seed``: the same on every machine."""
    word = WORDS[seed % len(WORDS)]
    return Task(f"relay-{seed}", INSTRUCTION, {"seed": seed, "value": word}, category=CATEGORY)


def load(source: str) -> list[Task]:
    """Tasks of ``relay:START:COUNT`` or ``relay:NAME`` (``train``, ``heldout``)."""
    spec = source[len(PREFIX):]
    try:
        start, count = NAMED[spec] if spec in NAMED else (int(x) for x in spec.split(":"))
    except ValueError:
        raise ValueError(f"bad task source {source!r}: use relay:START:COUNT or relay:{{{','.join(NAMED)}}}") from None
    if count < 1 or start < 0:
        raise ValueError(f"bad task source {source!r}: START must be >= 0 and COUNT >= 1")
    return [instance(seed) for seed in range(start, start + count)]


def hasty_actions(task: Task, rng: random.Random) -> list[dict]:
    """A warm start's behaviour policy, in turn order. The reader reads the note and tells its
    word half of the time, otherwise it tells a word drawn at random without reading; the writer
    answers the word it was told half of the time, otherwise a word drawn at random. Each is
    right 5 times in 8; the team succeeds about 7 times in 16."""
    read = rng.random() < 0.5
    told = task.data["value"] if read else rng.choice(WORDS)
    answer = {"name": "answer", "arguments": {"word": told if rng.random() < 0.5 else rng.choice(WORDS)}}
    if not read:
        return [_say(told), answer]
    return [{"name": "bash", "arguments": {"command": f"cat {NOTE}"}}, _say("ready"), _say(told), answer]


def _say(text: str) -> dict:
    return {"name": "say", "arguments": {"message": text}}


def words(text: str) -> set[str]:
    """The lower-case words of ``text``."""
    return set(re.findall(r"[a-z]+", text.lower()))


class RelayEnv(MultiAgentEnv):
    """Reader and writer pass the note's word on (see the module docstring)."""

    family = "relay"
    possible_agents: ClassVar[list[str]] = ["reader", "writer"]
    agent_tools: ClassVar[dict[str, list[dict[str, Any]]]] = {"reader": [BASH, SAY], "writer": [SAY, ANSWER]}
    tools: ClassVar[list[dict[str, Any]]] = [BASH, SAY, ANSWER]
    default_max_steps = 8
    measures: ClassVar[dict[str, str]] = {
        "reader/word_told": "reader: says that carry the note's word",
        "writer/answer_when_told": "writer: answers the note's word once the reader told it"}

    def load_tasks(self, source: Any) -> list[Task]:
        if source is None:
            return load(PREFIX + "train")
        if isinstance(source, str) and source.startswith(PREFIX):
            return load(source)
        return super().load_tasks(source)

    def briefing(self, agent: str, task: Task) -> str:
        return BRIEFINGS[agent]

    def start_episode(self, task: Task) -> Any:
        self.answer: str | None = None
        r = self.sandbox.run(f"mkdir -p /app && printf '%s\\n' {shlex.quote(task.data['value'])} > {NOTE}")
        if r.exit_code != 0:
            raise RuntimeError(f"relay setup failed: {r.output.strip()[:200]}")
        return None

    def call_tool(self, call: ToolCall) -> ToolResult:
        me = self.agent_selection
        if call.name == "bash":
            return self.command_result(self.run(str(call.arguments["command"])))
        if call.name == "say":
            other = self.next_agent(me)
            self.send(other, f"The {me} says: {call.arguments['message']}")
            return ToolResult(f"Your message was passed to the {other}.", exit_code=0)
        self.answer = str(call.arguments["word"]).strip()
        return ToolResult(f"You answered {self.answer!r}.", exit_code=0, done=True)

    @classmethod
    def agent_measures(cls, task: Task, actions: list[tuple[str, dict[str, Any] | None]]) -> dict[str, float]:
        """``reader/word_told``: the share of the reader's ``say`` messages that carry the note's
        word; ``writer/answer_when_told``, on an episode where the reader told the word: whether
        the writer's last action after that answered it (undefined when the reader never told it:
        then nothing the writer does is its own part)."""
        word = task.data["value"]
        carried: list[bool] = []   # per reader ``say``: whether it carries the word
        answered: bool | None = None   # the writer's last action once told: the word?
        for agent, a in actions:
            if agent == "reader" and a and a["name"] == "say":
                carried.append(word in words(str(a["arguments"].get("message", ""))))
            elif agent == "writer" and any(carried):
                answered = a is not None and a["name"] == "answer" and \
                    str(a["arguments"].get("word", "")).strip().lower() == word
        out = {}
        if carried:
            out["reader/word_told"] = sum(carried) / len(carried)
        if answered is not None:
            out["writer/answer_when_told"] = float(answered)
        return out

    def compute_outcome(self) -> Outcome:
        word = self.task.data["value"]
        right = self.answer is not None and self.answer.lower() == word
        return Outcome(1.0 if right else -1.0, {"answer": self.answer, "word": word})

    def oracle_actions(self, task: Task, kind: str) -> Iterable[Any]:
        """In turn order. ``gold``: read, wait, tell, answer. ``noop``: the writer answers
        without having been told."""
        word = task.data["value"]
        if kind == "gold":
            return [{"name": "bash", "arguments": {"command": f"cat {NOTE}"}},
                    {"name": "say", "arguments": {"message": "ready"}},
                    {"name": "say", "arguments": {"message": word}},
                    {"name": "answer", "arguments": {"word": word}}]
        return [{"name": "say", "arguments": {"message": "hello"}},
                {"name": "answer", "arguments": {"word": ""}}]
