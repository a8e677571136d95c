"""What a policy is: messages in, one generation (text, token ids, log-probs) out.

Backends: :class:`agents.openai_policy.OpenAIPolicy` (any OpenAI-compatible
server: vLLM, SGLang, ...) and :class:`agents.hf_policy.HFPolicy` (a local
transformers model, ``"tiny"`` included). :func:`make_policy` picks one from a
string.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any


class PolicyError(RuntimeError):
    """A policy could not produce a generation (e.g. its server failed after all retries)."""


@dataclass
class Generation:
    """One sampled answer.

    ``prompt_ids``/``response_ids``/``logprobs`` are the exact tokens the model
    consumed and sampled, and ``log pi_old`` of each sampled token; they are
    empty and ``ids_from_server`` is False when the backend did not report
    them (they are never reconstructed by re-tokenizing text).
    """

    text: str
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    ids_from_server: bool = False
    message: dict[str, Any] | None = None  # the raw assistant message, when a server sent one
    policy_version: int | None = None  # the weights that produced it, when the backend counts them

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_stops(tokenizer: Any, stop: str | list[str] | None) -> tuple[list[int], list[str]]:
    """Stop strings as a token-level engine takes them: ``(token ids, strings)``.

    A stop string that is one token stops on that token (exactly, like EOS, with no
    detokenizer needed); the others stay strings, matched on the decoded text.
    """
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    ids, strings = [], []
    for text in stop:
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if len(tokens) == 1:
            ids.append(tokens[0])
        else:
            strings.append(text)
    return ids, strings


def cut_at_stop(text: str, stop_strings: list[str] | tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to and including its first stop string, and whether one was found."""
    hit = [text.index(s) + len(s) for s in stop_strings if s in text]
    return (text[:min(hit)], True) if hit else (text, False)


class Policy(ABC):
    """Something that answers a chat.

    ``renders_tools``: whether tool schemas passed as ``tools=`` reach the model
    (through the chat template or the server); when False, callers put them
    into the system prompt themselves (see :mod:`agents.chat`).
    """

    name: str = "policy"
    renders_tools: bool = True

    @abstractmethod
    async def generate(self, messages: list[dict], tools: list[dict] | None = None,
                       **sampling: Any) -> Generation:
        """One answer. ``sampling``: temperature, top_p, max_tokens, stop, seed."""

    async def complete(self, messages: list[dict], n: int = 1, temperature: float = 1.0,
                       max_tokens: int = 1024) -> list[str]:
        """``n`` sampled answer texts (one request each unless a backend batches them)."""
        gens = await asyncio.gather(*(self.generate(messages, temperature=temperature,
                                                    max_tokens=max_tokens) for _ in range(n)))
        return [g.text for g in gens]

    async def generate_group(self, messages: list[dict], tools: list[dict] | None = None, n: int = 1,
                             **sampling: Any) -> list[Generation]:
        """``n`` answers to the same messages (one request each unless a backend batches them; a
        ``seed`` becomes ``seed + i`` for answer ``i``, so seeded answers differ)."""
        seed = sampling.pop("seed", None)
        return list(await asyncio.gather(*(self.generate(messages, tools, **sampling,
                                                         **({} if seed is None else {"seed": seed + i}))
                                           for i in range(n))))

    def generate_sync(self, messages: list[dict], tools: list[dict] | None = None,
                      **sampling: Any) -> Generation:
        """:meth:`generate` for code without an event loop."""
        return asyncio.run(self.generate(messages, tools, **sampling))

    def count_tokens(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """Prompt size in tokens, for context budgeting. Default: about 4 characters a token."""
        chars = sum(len(content_text(m.get("content"))) + 16 for m in messages)
        chars += len(json.dumps(tools)) if tools else 0
        return chars // 4 + 1

    async def aclose(self) -> None:
        """Release connections or threads (no-op by default)."""


def content_text(content: Any, sep: str = "\n") -> str:
    """The text of a message's content (string, or parts joined by ``sep``, images shown as ``<image>``)."""
    if isinstance(content, list):
        return sep.join(p.get("text", "") if p.get("type") == "text" else "<image>" for p in content)
    return "" if content is None else str(content)
