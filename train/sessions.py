"""Sessions of an OpenAI-compatible client, as ``train.proxy`` sees them.

A session is one agent's conversation: its main-line turns, each the messages
the client sent, the answer the proxy generated (exact ids and log-probs) and,
once the session's next main-line request arrives, the new messages after that
answer: the turn's next state. Sessions are named by the client (OpenClaw's
``X-Session-Id`` header or a ``session_id`` body key) or found by longest-prefix
match for clients that name none: a request whose messages extend an earlier
request's messages plus its answer continues that session.

If the client sent back the answer changed (other text, other tool calls: a
client that rewrote it, a different tokenization), the turn is marked
``rewritten``: its next state followed an action the model did not take, so it
is not trained on. A client that leaves the answer out and adds a message
instead (mini-swe-agent's reply to a malformed action) marks it ``dropped``:
that message is about the answer as generated, and it is its next state.

Concurrent requests on one named session: a request continues the branch (a trajectory of
that session) whose waiting turn its messages extend, else the latest branch with no request
in flight; when every branch has one in flight (the client sent two requests at once, so the
second cannot hold the first's answer), it starts a new branch: a trajectory of its own
(``group_id`` ``<id>#<n>``), trained like any other. Nothing waits and nothing is overwritten.

Matching is cheap however many sessions are open: each message's :func:`canonical` key is
computed once per request (a turn keeps its request's keys), and the unnamed sessions waiting
for a next state are indexed by their turn's length and last message, so a request looks only
at the sessions whose turn could be its prefix.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from nextstate.agents.policy import Generation, content_text


def canonical(message: dict[str, Any]) -> tuple:
    """What identifies a message when matching: role, text, tool calls (name and parsed
    arguments) and the tool call it answers; ids, names and other extras are ignored."""
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        calls.append((fn.get("name"), json.dumps(args, sort_keys=True)))
    return message.get("role"), content_text(message.get("content")), tuple(calls)


def message_keys(messages: list[dict[str, Any]]) -> tuple[tuple, ...]:
    """The :func:`canonical` key of each message."""
    return tuple(canonical(m) for m in messages)


@dataclass
class Turn:
    """One main-line request and the answer the proxy generated."""

    index: int
    messages: list[dict]
    generation: Generation
    reply: dict                        # the assistant message sent to the client
    temperature: float
    tools: list[dict] | None = None
    next_messages: list[dict] | None = None
    rewritten: bool = False            # sent back changed: not trained on
    dropped: bool = False              # not sent back; the new messages answer it (trained on)
    hint: str | None = None            # the hint source's hint from its next state (OPD)
    candidate: int | None = None       # which of a group's candidates (--samples) it trains as; None: not so
    rubric_version: int | None = None  # the version of the evolving rubric (--rubric) that judged it
    started: float = field(default_factory=time.time)
    keys: tuple[tuple, ...] = ()       # message_keys(messages), computed once (given, or here)
    reply_key: tuple = field(init=False)

    def __post_init__(self) -> None:
        self.keys = self.keys or message_keys(self.messages)
        self.reply_key = canonical(self.reply)

    def continued_by(self, keys: tuple[tuple, ...]) -> bool:
        """Whether the messages of ``keys`` (:func:`message_keys`) start with this turn's
        messages and go on past them."""
        return len(keys) > len(self.keys) and keys[:len(self.keys)] == self.keys


@dataclass
class Session:
    """A conversation. ``group_id`` names it in ``rollouts.jsonl``; ``keyed``: named by the client."""

    id: str
    group_id: str
    keyed: bool
    instruction: str = ""
    turns: int = 0
    last: Turn | None = None           # the latest turn, while it waits for its next state
    history: list[dict] = field(default_factory=list)   # earlier steps for the judge
    done: bool = False
    outcome: float | None = None
    scores: list[float] = field(default_factory=list)
    inflight: int = 0                  # main requests claimed and not yet answered
    waiting: list[tuple[Turn, float, list[int] | None]] = field(default_factory=list)   # judged, awaiting the outcome


def _continued(sessions: list[Session], keys: tuple[tuple, ...]) -> Session | None:
    """The session of ``sessions`` whose waiting turn the messages of ``keys`` continue: the
    longest such turn; among equals, one whose answer the messages repeat unchanged, then the oldest."""
    best, best_key = None, None
    for s in sessions:
        if s.last is None or not s.last.continued_by(keys):
            continue
        n = len(s.last.keys)
        key = (n, keys[n] == s.last.reply_key, -s.last.started)
        if best_key is None or key > best_key:
            best, best_key = s, key
    return best


def _bucket(turn: Turn) -> tuple[int, tuple]:
    """Where an unnamed session waiting on ``turn`` is indexed: the turn's length and last message."""
    return len(turn.keys), turn.keys[-1]


class SessionTable:
    """Finds the session of each main-line request and the next state it brings."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}        # by group id: every session and branch
        self.named: dict[str, list[Session]] = {}     # by the client's id, oldest first
        # unnamed sessions with a waiting turn, by (its length, its last message's key)
        self._waiting: dict[tuple[int, tuple], list[Session]] = {}

    def _new(self, sid: str | None, messages: list[dict]) -> Session:
        keyed = sid is not None
        sid = sid or f"s-{uuid.uuid4().hex[:12]}"
        same = self.named.setdefault(sid, [])
        group = sid if not same else f"{sid}#{len(same) + 1}"   # a branch, or a name reused after its end
        first_user = next((m for m in messages if m.get("role") == "user"), None)
        session = Session(sid, group, keyed, content_text(first_user.get("content")) if first_user else "")
        same.append(session)
        self.sessions[group] = session
        return session

    def get(self, sid: str) -> Session | None:
        """The latest session (or branch) named ``sid``."""
        same = self.named.get(sid)
        return same[-1] if same else None

    def branches(self, sid: str) -> list[Session]:
        """The open branches of the session named ``sid``, oldest first."""
        return [s for s in self.named.get(sid, []) if not s.done]

    def _unlist(self, session: Session) -> None:
        """Take the session out of the index of waiting unnamed sessions, where it is while it
        is unnamed, open and has a waiting turn."""
        if session.keyed or session.done or session.last is None:
            return
        key = _bucket(session.last)
        self._waiting[key].remove(session)
        if not self._waiting[key]:
            del self._waiting[key]

    def pop_last(self, session: Session) -> Turn | None:
        """Take the session's waiting turn: no request continues it any more."""
        self._unlist(session)
        turn, session.last = session.last, None
        return turn

    def end(self, session: Session) -> None:
        """The session is over: no request continues it (its last turn stays, unclaimed)."""
        self._unlist(session)
        session.done = True

    def _branch(self, sid: str, keys: tuple[tuple, ...]) -> Session | None:
        """The branch of named session ``sid`` a request continues: the one whose waiting turn
        the messages extend (the longest), else the latest with no request in flight; None
        when every branch is busy (the request then starts a new branch)."""
        open_ = self.branches(sid)
        going_on = _continued(open_, keys)
        if going_on is not None:
            return going_on
        idle = [s for s in open_ if s.inflight == 0]
        return idle[-1] if idle else None

    def match(self, keys: tuple[tuple, ...]) -> Session | None:
        """The unnamed session whose waiting turn the messages of ``keys`` continue (see
        :func:`_continued`); only the sessions of the buckets of ``keys``' prefixes are looked at."""
        return _continued([s for n in range(1, len(keys)) for s in self._waiting.get((n, keys[n - 1]), ())], keys)

    def claim(self, messages: list[dict], sid: str | None,
              keys: tuple[tuple, ...] | None = None) -> tuple[Session, Turn | None]:
        """The session of a main-line request, and its previous turn if this request is that
        turn's next state (``next_messages`` and ``rewritten`` are then set on it). ``keys``:
        the messages' :func:`message_keys`, when the caller has them."""
        keys = keys or message_keys(messages)
        session = self._branch(sid, keys) if sid is not None else self.match(keys)
        if session is None:
            session = self._new(sid, messages)
        session.inflight += 1
        prev = self.pop_last(session)
        if prev is None:
            return session, None
        n = len(prev.keys)
        going_on = prev.continued_by(keys)
        if going_on and messages[n].get("role") != "assistant":
            # the client left the answer out (mini-swe-agent does after a format error): what it
            # added instead is the answer's next state
            prev.next_messages, prev.dropped = messages[n:], True
            return session, prev
        if going_on:
            cut: int | None = n
        else:   # a named session whose history changed: the next state follows its last answer
            cut = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if cut is None:
            prev.next_messages = []
        else:
            prev.next_messages = messages[cut + 1:]
            prev.rewritten = keys[cut] != prev.reply_key
        return session, prev

    def add(self, session: Session, turn: Turn) -> None:
        """``turn`` becomes the session's latest, waiting for its next state."""
        session.turns += 1
        self.pop_last(session)
        session.last = turn
        if not session.keyed and not session.done:
            self._waiting.setdefault(_bucket(turn), []).append(session)
        self.release(session)

    def release(self, session: Session) -> None:
        """A claimed request is over (answered, failed or aborted)."""
        session.inflight = max(0, session.inflight - 1)

    def open(self) -> list[Session]:
        return [s for s in self.sessions.values() if not s.done]
