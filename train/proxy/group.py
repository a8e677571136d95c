"""Group sampling at the proxy's endpoint (``--samples N``, after AgentJet's "fake vLLM endpoint"):
``N`` candidates answer one main-line request, sampled in one batch
(:meth:`agents.hf_policy.HFPolicy.generate_group`); a ranker scores them relative to each other;
one is returned (:func:`pick`: the best, or a random one, which keeps what the user sees on-policy);
every candidate trains with the group-normalized advantage of its reward (:func:`advantages`).

Rankers (a registry, :func:`register_ranker`, that refuses a name twice) score each candidate in
[0, 1]:

* ``listwise`` -- :class:`ListwiseRanker`: the LLM judge reads the user's query and all the
  candidates in one prompt and scores each from 0 to 10;
* ``rules`` -- :class:`RuleRanker`, a rule baseline (no LLM): the quality gate times the lexical
  relevance to the user's last message.

Rewards (``group.reward``): ``rank``, the ranker's score; ``quality_gate``, AgentJet's
composition ``gate * (w_feedback * score + w_relevance * relevance + w_diversity * diversity)``:
the gate (:func:`quality_gate`, a rule: 0 for an empty, garbled or degenerate answer, or a broken
tool call) multiplies the rest, so a garbled answer cannot be rewarded for pleasing the judge. The
user sees one candidate only, so the ranker's score stands in for the user's feedback on each;
relevance (:func:`relevance`) and diversity (:func:`diversity`) are lexical rules.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from nextstate.agents.chat import clip
from nextstate.agents.policy import content_text
from nextstate.train.advantage import bucket_normalize
from nextstate.train.config import GroupConfig
from nextstate.train.proxy.registry import make, registrar

_WORD = re.compile(r"[^\W_]{3,}")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
RANKERS: dict[str, Callable[..., Any]] = {}


register_ranker = registrar(RANKERS, "ranker")
register_ranker.__doc__ = "Add a ranker under ``name`` (``group.ranker=name``); a name already taken is an error."


@dataclass
class Ranking:
    """A ranker's scores of a group's candidates, each in [0, 1] (None: it gave none, and ``error``
    says why), with what it was asked and answered."""

    scores: list[float] | None
    error: str | None = None
    prompt: str = ""
    raw: list[str] = field(default_factory=list)


# -- rule terms -----------------------------------------------------------------------------------
def words(text: str) -> set[str]:
    """The lower-cased words of three letters or more in ``text``."""
    return set(_WORD.findall(text.lower()))


def query_text(messages: list[dict]) -> str:
    """The user's query: the text of the last user message (else of the last message)."""
    users = [m for m in messages if m.get("role") == "user"] or messages[-1:]
    return content_text(users[-1].get("content")) if users else ""


def quality_gate(text: str, tools: list[dict] | None = None) -> float:
    """1, or 0 for an answer that is empty, holds undecodable bytes or control characters,
    repeats itself (it compresses below a fifth of its size), or, when the request offered
    tools, writes a ``<tool_call>`` block that is not a JSON ``{"name": ...}`` object (a rule)."""
    body = text.strip()
    if not body or "\ufffd" in body:
        return 0.0
    if sum(not (c.isprintable() or c in "\n\t") for c in body) > 0.02 * len(body):
        return 0.0
    raw = body.encode()
    if len(raw) >= 64 and len(zlib.compress(raw)) < 0.2 * len(raw):
        return 0.0
    if tools:
        for block in _TOOL_CALL.findall(body):
            try:
                call = json.loads(block.strip())
            except ValueError:
                return 0.0
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return 0.0
    return 1.0


def relevance(text: str, query: str) -> float:
    """The share of the query's words that the answer uses (0 when the query has none)."""
    asked = words(query)
    return len(asked & words(text)) / len(asked) if asked else 0.0


def diversity(texts: list[str]) -> list[float]:
    """Per candidate, 1 minus its mean word-set Jaccard similarity to the others (two empty
    answers are the same answer); 0 for a group of one."""
    sets = [words(t) for t in texts]

    def jaccard(a: set[str], b: set[str]) -> float:
        return len(a & b) / len(a | b) if a | b else 1.0

    n = len(sets)
    return [1.0 - sum(jaccard(sets[i], sets[j]) for j in range(n) if j != i) / (n - 1) if n > 1 else 0.0
            for i in range(n)]


# -- rankers ------------------------------------------------------------------------------------
@register_ranker("rules")
class RuleRanker:
    """A rule baseline for the listwise LLM judge: a candidate's score is its
    :func:`quality_gate` times its :func:`relevance` to the user's last message."""

    def __init__(self, **_: Any):
        pass

    async def rank(self, messages: list[dict], texts: list[str], tools: list[dict] | None = None,
                   criteria: str = "") -> Ranking:
        """Scores by rule (``criteria``, the user's stated preferences, are not read: a rule cannot)."""
        query = query_text(messages)
        scores = [quality_gate(t, tools) * relevance(t, query) for t in texts]
        return Ranking(scores, prompt=f"rules: quality gate x relevance to {clip(query, 200)!r}")


LISTWISE_SYSTEM = ("You compare candidate answers of an AI assistant to the same conversation. Read the "
                   "conversation and every candidate, then score each candidate from 0 (useless, wrong or "
                   "garbled) to 10 (exactly what the user needs), relative to the others.")
LISTWISE_USER = ("## Conversation\n{conversation}\n\n## Candidates\n{candidates}\n\n"
                 "Reason briefly, then end with the {n} scores in candidate order, comma-separated, "
                 "in one box: \\boxed{{{example}}}")


def parse_scores(answer: str, n: int) -> list[float] | None:
    """The ``n`` scores of the last ``\\boxed{s1, ..., sn}`` in ``answer`` (each 0-10), as [0, 1];
    None when there is no such box."""
    for box in reversed(_BOXED.findall(answer or "")):
        try:
            values = [float(x) for x in box.split(",")]
        except ValueError:
            continue
        if len(values) == n and all(0 <= v <= 10 for v in values):
            return [v / 10 for v in values]
    return None


@register_ranker("listwise")
class ListwiseRanker:
    """The LLM judge as a listwise ranker: one prompt holds the conversation (its last
    ``keep_messages`` messages, each clipped) and all the candidates; ``m`` answers are sampled
    and the scores of those that parse are averaged. No parseable answer, a timeout or a server
    error gives no scores (``Ranking.error``); it never raises."""

    def __init__(self, backend: Any, m: int = 1, temperature: float = 0.6, max_tokens: int = 1024,
                 timeout: float = 60.0, keep_messages: int = 6, message_chars: int = 1500,
                 candidate_chars: int = 1500, **_: Any):
        self.backend, self.m, self.temperature, self.max_tokens = backend, m, temperature, max_tokens
        self.timeout, self.keep_messages = timeout, keep_messages
        self.message_chars, self.candidate_chars = message_chars, candidate_chars

    def messages(self, messages: list[dict], texts: list[str], criteria: str = "") -> list[dict]:
        """The judge's prompt for ``texts`` answering ``messages`` (``criteria``: the user's stated
        preferences, the evolving rubric's current text)."""
        conversation = "\n\n".join(f"[{m.get('role')}] {clip(content_text(m.get('content')), self.message_chars)}"
                                   for m in messages[-self.keep_messages:])
        candidates = "\n\n".join(f"### Candidate {i + 1}\n{clip(t, self.candidate_chars) or '(empty)'}"
                                 for i, t in enumerate(texts))
        example = ", ".join(f"s{i + 1}" for i in range(len(texts)))
        user = LISTWISE_USER.format(conversation=conversation, candidates=candidates, n=len(texts), example=example)
        system = LISTWISE_SYSTEM + (f"\n\nThe user has stated these preferences; score against them too:\n{criteria}"
                                    if criteria else "")
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    async def rank(self, messages: list[dict], texts: list[str], tools: list[dict] | None = None,
                   criteria: str = "") -> Ranking:
        prompt = self.messages(messages, texts, criteria)
        shown = "\n\n".join(m["content"] for m in prompt)
        try:
            answers = await asyncio.wait_for(self.backend.complete(prompt, n=self.m, temperature=self.temperature,
                                                                   max_tokens=self.max_tokens), self.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as e:   # timeouts, HTTP errors, a broken backend: no scores
            return Ranking(None, f"{type(e).__name__}: {str(e) or f'no answer within {self.timeout:g}s'}", shown)
        parsed = [s for s in (parse_scores(a, len(texts)) for a in answers) if s is not None]
        if not parsed:
            return Ranking(None, f"no answer ended with \\boxed{{}} of {len(texts)} scores from 0 to 10", shown,
                           list(answers))
        return Ranking([float(v) for v in np.mean(parsed, axis=0)], None, shown, list(answers))


def make_ranker(name: str, backend: Any = None, **kw: Any) -> Any:
    """The registered ranker ``name`` (``backend``: the LLM of an LLM ranker)."""
    return make(RANKERS, "ranker", name, backend=backend, **kw)


# -- rewards, the choice, advantages ------------------------------------------------------------
def rewards(cfg: GroupConfig, ranking: Ranking, messages: list[dict], texts: list[str],
            tools: list[dict] | None = None) -> tuple[list[float] | None, dict[str, list[float]]]:
    """Each candidate's reward under ``cfg.reward`` and the terms it was made of (None: the
    ranker gave no scores)."""
    if ranking.scores is None:
        return None, {}
    if cfg.reward == "rank":
        return list(ranking.scores), {"score": list(ranking.scores)}
    query = query_text(messages)
    terms = {"gate": [quality_gate(t, tools) for t in texts], "score": list(ranking.scores),
             "relevance": [relevance(t, query) for t in texts], "diversity": diversity(texts)}
    out = [g * (cfg.weight_feedback * s + cfg.weight_relevance * r + cfg.weight_diversity * d)
           for g, s, r, d in zip(terms["gate"], terms["score"], terms["relevance"], terms["diversity"])]
    return out, terms


def pick(how: str, values: list[float] | None, n: int, rng: random.Random) -> int:
    """The candidate returned: ``best`` (the highest reward, the first of equals; the first when
    there are no rewards) or ``random``."""
    if how == "random":
        return rng.randrange(n)
    return int(np.argmax(values)) if values else 0


def advantages(values: list[float], eps: float = 1e-6) -> tuple[list[float], bool]:
    """``(A_i = (R_i - mean) / (std + eps) over the group, whether it carries a signal)``: a group
    whose rewards are all equal gets zeros (:func:`train.advantage.bucket_normalize`, one bucket)."""
    adv = bucket_normalize(np.zeros(len(values), dtype=np.int64), np.asarray(values), eps=eps)
    return [float(a) for a in adv.advantages], bool(adv.keep.all()) and len(values) > 1
