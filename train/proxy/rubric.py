"""A judge rubric that evolves with what the user says (after AgentJet's interactive training).

Each new user message of a main-line request goes to a preference source (``--rubric``, a
registry, :func:`register_source`, that refuses a name twice):

* ``llm`` -- :class:`LLMPreferences`: the judge's LLM decides whether the message states a
  preference about how the assistant should answer ("you're too dry" counts as much as "please
  be more humorous") and writes it as one instruction; it then rewrites the rubric to take the
  new preferences in, merged with the earlier ones into one consistent text;
* ``rules`` -- :class:`RulePreferences`, a rule baseline: a sentence that asks for more or less of
  something, says "I prefer" / "I'd like", or asks for answers "suitable for" someone is a
  preference; the rubric is the deduplicated list of them.

The :class:`Rubric` is versioned: version 0 has no preferences; every change is a new version,
recorded in ``rollouts.jsonl`` (``"kind": "rubric"``, with the message that caused it) and read
back from there on ``--resume``. The judges read the current version (the step judge in its
task text, :func:`with_rubric`; the listwise ranker in its prompt), and their records carry
``rubric_version``. A change waits until ``every`` user messages have passed since the last
one (preferences stated meanwhile wait, and are merged together as soon as it may); ``pinned``
records preferences and changes nothing; the operator's reset is a new version with none.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from nextstate.agents.chat import clip
from nextstate.train.proxy.registry import make, registrar

SOURCES: dict[str, Callable[..., Any]] = {}
_PREFERENCE = re.compile(r"\[PREFERENCE\](.*?)\[/PREFERENCE\]", re.DOTALL)
_RUBRIC = re.compile(r"\[RUBRIC\](.*?)\[/RUBRIC\]", re.DOTALL)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_ASKS = re.compile(r"\b(?:(?:be|make|keep|sound|write|answer|get)\b[\w\s',]{0,30}?\b(?:more|less)\b"
                   r"|i(?:'d| would)? (?:prefer|like (?:it|the answers?|your answers?))\b"
                   r"|suitable for\b|(?:more|less) \w+(?: \w+)?,? please\b)", re.I)


register_source = registrar(SOURCES, "rubric source")
register_source.__doc__ = "Add a preference source under ``name`` (``--rubric name``); a name already taken is an error."


@dataclass
class Version:
    """One version of the rubric: its criteria text, the preferences it takes in, what made it
    (``by``: ``start``, a source's name, ``operator reset``) and the message that caused it."""

    version: int
    text: str = ""
    preferences: list[str] = field(default_factory=list)
    by: str = "start"
    cause: dict[str, Any] | None = None
    error: str | None = None


def with_rubric(instruction: str, version: Version) -> str:
    """The task text a judge reads, with the user's stated preferences (none at version 0)."""
    if not version.text:
        return instruction
    return f"{instruction}\n\n## The user's stated preferences (rubric v{version.version}): judge against them too\n" \
           f"{version.text}"


def _key(preference: str) -> str:
    """What two preferences are compared by: the text lower-cased, without end punctuation."""
    return preference.strip().rstrip(".!").lower()


def dedupe(preferences: list[str]) -> list[str]:
    """``preferences`` without repeats (compared by :func:`_key`), in order."""
    seen, out = set(), []
    for p in preferences:
        key = _key(p)
        if key and key not in seen:
            seen.add(key)
            out.append(p.strip())
    return out


def rule_merge(current: Version, new: list[str]) -> tuple[str, list[str]]:
    """The rule baseline's merge: the deduplicated list of every preference, one line each."""
    prefs = dedupe(current.preferences + new)
    return "\n".join(f"- {p}" for p in prefs), prefs


@register_source("rules")
class RulePreferences:
    """A rule baseline (no LLM): a sentence matching a few request patterns (more/less of
    something, "I prefer", "suitable for") is a preference; merging lists them, deduplicated.
    It misses preferences said otherwise ("you're too dry")."""

    def __init__(self, **_: Any):
        pass

    async def detect(self, message: str) -> tuple[str | None, dict[str, Any]]:
        for sentence in _SENTENCE.findall(message):
            if _ASKS.search(sentence):
                return sentence.strip(), {"rule": _ASKS.search(sentence).group(0)}
        return None, {}

    async def merge(self, current: Version, new: list[str]) -> tuple[str, list[str], dict[str, Any]]:
        text, prefs = rule_merge(current, new)
        return text, prefs, {}


DETECT_SYSTEM = ("You read one message a user sent to an AI assistant and say whether it states a preference about "
                 "how the assistant should answer from now on (tone, style, format, length, audience), in any words. "
                 "Answer with the preference as one instruction between [PREFERENCE] and [/PREFERENCE], or with NONE.")
DETECT_EXAMPLES = [("What is 12 times 7?", "NONE"),
                   ("Please use simpler words.", "[PREFERENCE]Use simpler words.[/PREFERENCE]"),
                   ("The output says: file not found.", "NONE"),
                   ("Way too long, I stopped reading halfway.", "[PREFERENCE]Keep the answers short.[/PREFERENCE]")]
MERGE_SYSTEM = ("You keep the rubric a judge uses to score an AI assistant's answers for one user. Given the current "
                "rubric and the user's new preferences, write one consistent rubric that takes them in with the "
                "earlier ones (merge and reconcile them, do not just append lines; a newer preference wins a "
                "conflict), between [RUBRIC] and [/RUBRIC].")
MERGE_EXAMPLES = [("Current rubric: Answers are formal.\nNew preferences: Use simpler words.",
                   "[RUBRIC]Answers are formal in tone and use simple, everyday words.[/RUBRIC]")]


def few_shot(system: str, examples: list[tuple[str, str]], ask: str) -> list[dict]:
    """A chat of ``system``, the worked ``examples`` as earlier turns, then ``ask`` (small models
    follow an answer format they have seen far better than one they are told)."""
    turns = [m for q, a in examples for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]
    return [{"role": "system", "content": system}, *turns, {"role": "user", "content": ask}]


@register_source("llm")
class LLMPreferences:
    """The judge's LLM as the preference source: one request decides whether a message states a
    preference (and writes it), one rewrites the rubric around the new ones; each is a few-shot
    chat (:data:`DETECT_EXAMPLES`, :data:`MERGE_EXAMPLES`). A failed or unparseable merge falls
    back to :func:`rule_merge`, and the version says so (``error``)."""

    def __init__(self, backend: Any, temperature: float = 0.0, max_tokens: int = 256, timeout: float = 60.0,
                 message_chars: int = 2000, **_: Any):
        self.backend, self.temperature, self.max_tokens, self.timeout = backend, temperature, max_tokens, timeout
        self.message_chars = message_chars

    async def _ask(self, messages: list[dict]) -> str:
        answers = await asyncio.wait_for(self.backend.complete(messages, n=1, temperature=self.temperature,
                                                               max_tokens=self.max_tokens), self.timeout)
        return answers[0] if answers else ""

    async def detect(self, message: str) -> tuple[str | None, dict[str, Any]]:
        ask = clip(message, self.message_chars)
        try:
            answer = await self._ask(few_shot(DETECT_SYSTEM, DETECT_EXAMPLES, ask))
        except asyncio.CancelledError:
            raise
        except Exception as e:   # no preference seen when the LLM cannot be asked
            return None, {"prompt": ask, "error": f"{type(e).__name__}: {e}"}
        found = [p.strip() for p in _PREFERENCE.findall(answer) if p.strip()]
        return (found[-1] if found else None), {"prompt": ask, "raw": answer}

    async def merge(self, current: Version, new: list[str]) -> tuple[str, list[str], dict[str, Any]]:
        ask = f"Current rubric: {current.text or '(none)'}\nNew preferences: {' '.join(new)}"
        prefs = dedupe(current.preferences + new)
        try:
            answer = await self._ask(few_shot(MERGE_SYSTEM, MERGE_EXAMPLES, ask))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            text, _ = rule_merge(current, new)
            return text, prefs, {"prompt": ask, "error": f"the LLM merge failed ({type(e).__name__}: {e}); "
                                                        "the rule merge took its place"}
        found = [r.strip() for r in _RUBRIC.findall(answer) if r.strip()]
        if not found:
            text, _ = rule_merge(current, new)
            return text, prefs, {"prompt": ask, "raw": answer,
                                 "error": "the LLM wrote no [RUBRIC] block; the rule merge took its place"}
        return found[-1], prefs, {"prompt": ask, "raw": answer}


def make_source(name: str, backend: Any = None, **kw: Any) -> Any:
    """The registered preference source ``name`` (``backend``: the LLM of an LLM source)."""
    return make(SOURCES, "rubric source", name, backend=backend, **kw)


def load_versions(rollouts: Path) -> list[Version]:
    """The rubric versions recorded in ``rollouts`` (``"kind": "rubric"``), oldest first."""
    if not rollouts.exists():
        return []
    out = []
    for line in rollouts.read_text().splitlines():
        if '"kind": "rubric"' not in line:
            continue
        rec = json.loads(line)
        out.append(Version(rec["version"], rec.get("text", ""), list(rec.get("preferences") or []),
                           rec.get("by", "start"), rec.get("cause"), rec.get("error")))
    return out


class Rubric:
    """The versioned rubric of preferences from ``source``. ``versions``: those of an earlier run
    (``--resume``), the last one current; ``every``: the user messages that must pass between two
    changes; ``pinned``: never change; ``reset``: start over (the operator's reset, a new version
    with no preferences). It records nothing until :meth:`start`."""

    def __init__(self, source: Any, *, every: int = 1, pinned: bool = False, versions: list[Version] | None = None,
                 reset: bool = False):
        self.source, self.every, self.pinned, self.reset_at_start = source, max(1, every), pinned, reset
        self.versions = list(versions or [])
        self.record: Callable[[str, dict], None] = lambda kind, payload: None
        self.pending: list[tuple[str, dict[str, Any]]] = []   # preferences waiting for the next allowed change
        self.messages = 0                                      # user messages seen
        self.last_change = -self.every                         # the message count at the last change
        self._lock = asyncio.Lock()

    def start(self, record: Callable[[str, dict], None]) -> None:
        """Record from now on with ``record(kind, payload)`` (``rollouts.jsonl``): version 0 when
        there was none before, the operator's reset when asked for."""
        self.record = record
        if not self.versions:
            self._add(Version(0))
        elif self.reset_at_start:
            self.reset()

    @property
    def current(self) -> Version:
        return self.versions[-1]

    def _add(self, version: Version) -> None:
        self.versions.append(version)
        self.record("rubric", {"group_id": "rubric", "task_id": "rubric", "sample": 0, **asdict(version)})

    def reset(self) -> Version:
        """The operator's reset: a new version with no preferences (pending ones dropped)."""
        self.pending = []
        self._add(Version(self.current.version + 1, by="operator reset"))
        return self.current

    async def observe(self, message: str, cause: dict[str, Any]) -> Version | None:
        """A new user message (``cause``: where it came from): a stated preference is recorded
        (every message's check is a ``"kind": "preference"`` record) and waits; waiting preferences are merged into a new version as
        soon as the bound allows (this message or a later one); the new version, or None."""
        preference, detail = await self.source.detect(message)
        async with self._lock:
            self.messages += 1
            self._preference(preference, message, cause, detail)
            if not self.pending or self.messages - self.last_change < self.every:
                return None
            new, causes = [p for p, _ in self.pending], [c for _, c in self.pending]
            self.pending = []
            t0 = time.monotonic()
            text, prefs, merged = await self.source.merge(self.current, new)
            self.last_change = self.messages
            self._add(Version(self.current.version + 1, text, prefs, type(self.source).__name__,
                              causes[-1] if len(causes) == 1 else {"messages": causes}, merged.get("error")))
            self.record("rubric_merge", {"group_id": "rubric", "task_id": "rubric", "sample": 0,
                                         "version": self.current.version, "seconds": time.monotonic() - t0, **merged})
            return self.current

    def _preference(self, preference: str | None, message: str, cause: dict[str, Any],
                    detail: dict[str, Any]) -> None:
        """(Lock held.) Record what the source said of a message (``preference`` None: none seen,
        or the source failed: ``detail`` says which); a preference waits for the next change unless
        the rubric is pinned or already holds it (said again, or a history sent again)."""
        known = {_key(p) for p in self.current.preferences} | {_key(p) for p, _ in self.pending}
        why = ("no preference stated" if detail.get("error") is None else "the source failed") \
            if preference is None else "pinned by the operator" if self.pinned else (
            "the rubric already holds it" if _key(preference) in known else None)
        self.record("preference", {"group_id": cause.get("group_id", "rubric"), "task_id": cause.get("session"),
                                   "sample": 0, "step": cause.get("step"), "preference": preference,
                                   "message": message, "applied": why is None, "why": why,
                                   "rubric_version": self.current.version, **detail})
        if why is None:
            self.pending.append((preference, {**cause, "message": message}))
