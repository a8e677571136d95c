"""Batched generation for a local transformers model: a request batcher and a decode loop.

:class:`Batcher` collects requests from any thread or event loop for a few
milliseconds and hands them to one worker thread as one batch. :func:`decode`
then generates all rows of a batch together: each prompt starts from the KV
cache of the longest prefix already run (:class:`PrefixCache`: the episode's
previous turn and answer, a system prompt other rows share), the rest
prefilled in left-padded groups of similar lengths, then one forward pass per
new token for every unfinished row; rows that finish leave the batch (their
cache rows are stored for the next turn and dropped), and requests queued
meanwhile join it between two tokens (continuous batching: prefilled the same
way, their cache rows merged into the running ones), so a request never waits
for a whole batch to finish.

Why not transformers' own continuous batching (``generate_batch`` /
``init_continuous_batching``, transformers 5)? It runs on CPU here and its
log-probs match a recomputation for plain sampling, but it cannot serve what
the trainer and the agent loop need per request: ``do_sample`` and
``num_return_sequences`` are manager-wide (greedy and sampled requests, and
the judge's ``n=m`` votes, cannot share it), there are no stop strings and no
per-request seeds, its log-probs are those of the processed distribution
(top-p truncated) rather than the untruncated one the trainer recomputes, and
its scheduler thread steps the model on its own, so the trainer's weight swap
would have to stop and restart it (an 18 s warm-up on this CPU). The loop
here is short, and each row keeps its own temperature, top-p, length limit,
stop conditions and random generator.
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from transformers.cache_utils import DynamicLayer

from nextstate.agents.policy import PolicyError


@dataclass
class Row:
    """One sequence to generate.

    ``temperature`` 0 means greedy. ``generator`` draws this row's samples (so a
    seeded request gives the same tokens whatever else shares its batch). Setting ``cancel``
    ends the row at its next token (its caller went away).
    """

    prompt: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    generator: torch.Generator | None = None
    cancel: threading.Event | None = None


@dataclass
class Decoded:
    """What one row produced: tokens, ``log_softmax(logits / T)`` of each, whether a stop
    condition (rather than the length limit) ended it, or why it could not run."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stopped: bool = False
    cancelled: bool = False
    error: Exception | None = None   # a row that joined a running batch and could not run


def _choose(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor,
            rows: Sequence[Row]) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token of each row and its log-prob under ``log_softmax(logits / T)`` (T = 1 when greedy).

    A sampled row draws one uniform number from its own generator and takes the token where it
    falls in the cumulative distribution (top-p truncated when ``top_p < 1``): one draw a token,
    where ``torch.multinomial`` draws one per vocabulary entry. Only the chosen token's log-prob
    is formed (its scaled logit minus the row's ``logsumexp``)."""
    scaled = logits / temps[:, None]
    norm = torch.logsumexp(scaled, dim=-1)
    tokens = logits.argmax(dim=-1)
    sampled = [i for i, r in enumerate(rows) if r.temperature > 0]
    if sampled:
        at = torch.tensor(sampled, device=logits.device)
        probs = (scaled[at] - norm[at, None]).exp()
        p = top_p[at]
        if bool((p < 1).any()):  # nucleus: keep the smallest prefix whose mass reaches top_p
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= p[:, None]
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        cdf = probs.cumsum(-1, dtype=torch.float64)
        u = torch.cat([torch.rand(1, generator=rows[i].generator, dtype=torch.float64, device=logits.device)
                       for i in sampled])
        total = cdf[:, -1:].contiguous()
        picked = torch.searchsorted(cdf, u[:, None] * total, right=True)
        tokens[at] = torch.minimum(picked, torch.searchsorted(cdf, total))[:, 0]   # never past the last nonzero
    return tokens, scaled.gather(-1, tokens[:, None])[:, 0] - norm


KV = list[tuple[torch.Tensor, torch.Tensor]]   # per layer: keys and values, each [heads, tokens, head_dim]


def weights_key(model: Any) -> tuple:
    """Changes whenever a parameter of ``model`` is modified in place or replaced (torch bumps a
    tensor's ``_version`` on every in-place write: an optimizer step, ``copy_``, ``mul_``)."""
    return (id(model), *((id(p), p._version) for p in model.parameters()))


class PrefixCache:
    """KV caches of token sequences the model has run, reused by later prompts that start the same.

    An episode's next turn extends its previous prompt and answer, and the first turns of all
    episodes share a system prompt: :func:`decode` prefills only what no stored sequence
    covers. Matching is on token ids (any tokenizer): the longest common prefix of a prompt
    and a stored sequence, found through a chained hash of ``block``-token blocks. The least
    recently used sequences go once the entries pass ``max_bytes``; a sequence that another
    one extends is dropped for it. The entries belong to one set of weights: :meth:`check`
    clears them when :func:`weights_key` changes. Not thread-safe (one worker uses it).
    """

    def __init__(self, max_bytes: int = 1 << 30, block: int = 16):
        self.max_bytes, self.block = max_bytes, block
        self.bytes = 0
        self.hits = 0              # prompts that reused a stored prefix
        self.reused_tokens = 0     # prompt tokens not prefilled thanks to it
        self.prefilled_tokens = 0  # prompt tokens prefilled
        self._entries: "OrderedDict[int, tuple[list[int], KV, list[int]]]" = OrderedDict()
        self._index: dict[int, dict[int, None]] = {}   # chained block hash -> entry keys
        self._ids = itertools.count()
        self._weights: tuple | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, model: Any) -> None:
        """Forget every entry if ``model``'s weights changed since the last check."""
        key = weights_key(model)
        if key != self._weights:
            self.clear()
            self._weights = key

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.bytes = 0

    def _hashes(self, ids: list[int]) -> list[int]:
        h, out, b = 0, [], self.block
        for j in range(len(ids) // b):
            h = hash((h, *ids[j * b:(j + 1) * b]))
            out.append(h)
        return out

    def _longest(self, ids: list[int]) -> tuple[int, int | None]:
        """``(length, entry key)`` of the longest common prefix of ``ids`` and a stored sequence."""
        hashes = self._hashes(ids)
        lo, hi = 0, len(hashes)   # blocks [0, lo) are known to be stored; binary search the rest
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if hashes[mid - 1] in self._index else (lo, mid - 1)
        if lo == 0:
            return 0, None
        best, best_key = 0, None
        start = lo * self.block
        for key in self._index[hashes[lo - 1]]:   # no entry shares block lo: each extends < 1 block
            seq = self._entries[key][0]
            n = start
            while n < len(seq) and n < len(ids) and seq[n] == ids[n]:
                n += 1
            if n > best:
                best, best_key = n, key
        if best_key is not None and self._entries[best_key][0][:start] != ids[:start]:   # a hash collision
            return 0, None
        return best, best_key

    def match(self, ids: list[int], limit: int | None = None) -> tuple[int, KV | None]:
        """The longest stored prefix of ``ids`` (at most ``limit`` tokens): its length and KV."""
        n, key = self._longest(ids)
        n = min(n, len(ids) if limit is None else limit)
        if key is None or n <= 0:
            return 0, None
        self._entries.move_to_end(key)
        kv = self._entries[key][1]
        return n, [(k[:, :n], v[:, :n]) for k, v in kv]

    def add(self, ids: list[int], kv: KV) -> None:
        """Store ``kv``, the cache of ``ids`` (a sequence already covered is not stored twice)."""
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if not ids or size > self.max_bytes:
            return
        n, key = self._longest(ids)
        if n == len(ids):
            return
        if key is not None and n == len(self._entries[key][0]):   # ids extend a stored sequence
            self._drop(key)
        key = next(self._ids)
        hashes = self._hashes(ids)
        self._entries[key] = (list(ids), kv, hashes)
        for h in hashes:
            self._index.setdefault(h, {})[key] = None
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        _, kv, hashes = self._entries.pop(key)
        self.bytes -= sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        for h in hashes:
            keys = self._index[h]
            keys.pop(key, None)
            if not keys:
                del self._index[h]


MIN_SHARED = 16   # a prefix rows of a batch share is prefilled on its own from this many new tokens


def _shared_prefixes(prompts: Sequence[list[int]]) -> list[list[int]]:
    """The prefixes (of at least ``MIN_SHARED`` tokens) that prompts share, shortest first: for
    each prompt, its longest common prefix with another one, leaving it at least one token."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    lcp = [len(os.path.commonprefix([prompts[a], prompts[b]])) for a, b in zip(order, order[1:])] + [0]
    found: dict[tuple[int, ...], None] = {}
    for j, i in enumerate(order):
        n = min(max(lcp[j - 1] if j else 0, lcp[j]), len(prompts[i]) - 1)
        if n >= MIN_SHARED:
            found[tuple(prompts[i][:n])] = None
    return [list(p) for p in sorted(found, key=len)]


def _supported(model: Any) -> bool:
    """Whether ``model``'s cache is one full-attention ``DynamicLayer`` per layer (what
    :class:`PrefixCache` can slice and pad); other caches run without reuse."""
    from transformers import DynamicCache
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def _sdpa_gqa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, but grouped-query heads go to the kernel as they are
    (``enable_gqa``) instead of being copied per query head (transformers copies them whenever
    there is a mask; on CPU that copy, of the whole cache at every decoded token, costs more
    than the attention itself). Same result, bit for bit."""
    causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


_GQA = "nextstate_sdpa_gqa"


@contextmanager
def _fast_attention(model: Any) -> Iterator[None]:
    """Run ``model`` with :func:`_sdpa_gqa` (CPU, where it is faster, and only when the model
    uses ``sdpa``); the model's own setting is back on exit."""
    cfg = model.config
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or model.device.type != "cpu":
        yield
        return
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask
    AttentionInterface.register(_GQA, _sdpa_gqa)
    AttentionMaskInterface.register(_GQA, sdpa_mask)
    cfg._attn_implementation = _GQA
    try:
        yield
    finally:
        cfg._attn_implementation = "sdpa"


class _Preallocated(DynamicLayer):
    """A ``DynamicLayer`` that writes each new token into room reserved ahead, instead of
    concatenating the whole cache at every token."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor]], length: int, room: int):
        """The rows of ``parts`` (keys and values, [batch, heads, tokens, dim]) one under the
        other, each right-aligned to ``length`` tokens (zeros before), then ``room`` free."""
        super().__init__()
        k0, v0 = parts[0]
        batch = sum(k.shape[0] for k, _ in parts)
        self._k = k0.new_empty((batch, k0.shape[1], length + room, k0.shape[3]))
        self._v = v0.new_empty((batch, v0.shape[1], length + room, v0.shape[3]))
        self._k[:, :, :length].zero_()   # masked out, but a NaN there would still leak through
        self._v[:, :, :length].zero_()
        row = 0
        for k, v in parts:
            self._k[row:row + k.shape[0], :, length - k.shape[2]:length] = k
            self._v[row:row + k.shape[0], :, length - k.shape[2]:length] = v
            row += k.shape[0]
        self.n, self.is_initialized = length, True
        self.dtype, self.device = k0.dtype, k0.device
        self._view()

    def _view(self) -> None:
        self.keys, self.values = self._k[:, :, :self.n], self._v[:, :, :self.n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        m = key_states.shape[-2]
        if self.n + m > self._k.shape[2]:
            raise RuntimeError(f"cache full: {self.n} + {m} tokens, room for {self._k.shape[2]}")
        self._k[:, :, self.n:self.n + m] = key_states
        self._v[:, :, self.n:self.n + m] = value_states
        self.n += m
        self._view()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.n

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.n + query_length, 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the batch rows ``indices``, in that order. Only rows that change place are
        copied, in place (a row leaving the batch moves one other row, not the whole cache)."""
        indices = torch.as_tensor(indices, device=self._k.device)
        moved = (indices != torch.arange(len(indices), device=indices.device)).nonzero()[:, 0]
        if len(moved):
            self._k[moved], self._v[moved] = self._k[indices[moved]], self._v[indices[moved]]
        self._k, self._v = self._k[:len(indices)], self._v[:len(indices)]
        self._view()


def _cache_of(model: Any, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A ``DynamicCache`` holding ``kv`` (per layer: keys and values, [batch, heads, tokens, dim])."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    for layer, (k, v) in enumerate(kv):
        cache.update(k, v, layer)
    return cache


def _prefill(model: Any, prompts: list[list[int]], pasts: list[tuple[int, KV | None]], pad_id: int
             ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
    """Run the part of each prompt its past (a stored prefix) does not cover, as one batch.

    Row ``i`` of the cache reads ``[padding][past][padding][rest of prompt]``, the padding
    masked out and position ids counting real tokens only. Returns the last position's
    logits, the cache, its attention mask and each row's next position id.
    """
    device = model.device
    past = max(n for n, _ in pasts)
    width = max(len(p) - n for p, (n, _) in zip(prompts, pasts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), past + width), dtype=torch.long)
    positions = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, (p, (n, _)) in enumerate(zip(prompts, pasts)):
        own = p[n:]
        ids[i, width - len(own):] = torch.tensor(own, dtype=torch.long)
        mask[i, past - n:past] = 1
        mask[i, past + width - len(own):] = 1
        positions[i, width - len(own):] = torch.arange(n, len(p))
    if past:
        layers = []
        for layer in range(len(next(kv for _, kv in pasts if kv is not None))):
            k0, v0 = next(kv for _, kv in pasts if kv is not None)[layer]
            keys = k0.new_zeros((len(prompts), k0.shape[0], past, k0.shape[2]))
            values = v0.new_zeros((len(prompts), v0.shape[0], past, v0.shape[2]))
            for i, (n, kv) in enumerate(pasts):
                if n:
                    keys[i, :, past - n:] = kv[layer][0]
                    values[i, :, past - n:] = kv[layer][1]
            layers.append((keys, values))
        cache = _cache_of(model, layers)
    else:
        from transformers import DynamicCache
        cache = DynamicCache(config=model.config)
    ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1].float()
    return logits, cache, mask, positions[:, -1] + 1


def _groups(prompts: list[list[int]], pasts: list[int], r: int, max_scores: int, heads: int
            ) -> list[list[int]]:
    """Rows grouped for prefill: by the length left to prefill, a row joining a group while the
    padded group costs at most 1.25x what its rows cost alone (cost of a row: new tokens x
    (attention span + ``r``)), its attention scores within ``max_scores``."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]) - pasts[i], pasts[i]))
    groups: list[list[int]] = []
    for i in order:
        new, span = len(prompts[i]) - pasts[i], len(prompts[i])
        alone = new * (span + r)
        if groups:
            g = groups[-1]
            w, p = max(width, new), max(past, pasts[i])
            cost = (len(g) + 1) * w * (p + w + r)
            if cost <= 1.25 * (total + alone) + 64 * r and (len(g) + 1) * w * (p + w) * heads <= max_scores:
                g.append(i)
                width, past, total = w, p, total + alone
                continue
        groups.append([i])
        width, past, total = new, pasts[i], alone
    return groups


def _pad_left(mask: torch.Tensor, length: int) -> torch.Tensor:
    """An attention mask left-padded with zeros to ``length`` tokens."""
    return torch.cat([mask.new_zeros((mask.shape[0], length - mask.shape[1])), mask], dim=1)


class _Threads:
    """The intra-op thread count of decode's forward passes: 1 or torch's own, whichever took less
    time per token step lately. On a machine shared with other jobs two threads can be many times
    slower than one (every parallel region waits for a thread the kernel has descheduled); on a
    quiet machine two are faster. Now and then a step runs with the other count: after
    ``explore`` steps times how many times slower it was, so trying it costs at most about
    1/``explore`` of the time. Each count keeps a moving average of its step time."""

    def __init__(self, most: int, explore: int = 8):
        self.options = sorted({1, most})
        self.cost: dict[int, float] = {}
        self.explore, self.steps = explore, 0

    def best(self) -> int:
        """The count with the lowest average (an untried one first)."""
        return min(self.options, key=lambda n: self.cost.get(n, 0.0))

    def pick(self) -> int:
        """The count for the next step: the best, or, when its turn has come, the other."""
        best = self.best()
        other = next((n for n in self.options if n != best), best)
        self.steps += 1
        if self.steps < self.explore * self.cost.get(other, 0.0) / max(self.cost.get(best, 0.0), 1e-9):
            return best
        self.steps = 0
        return other

    def record(self, n: int, seconds: float) -> None:
        self.cost[n] = seconds if n not in self.cost else (self.cost[n] + seconds) / 2


_THREADS: dict[int, _Threads] = {}   # torch's own thread count -> its chooser (kept across decodes)


@contextmanager
def _chosen_threads() -> Iterator[_Threads]:
    """The chooser for torch's current thread count; that count is back on exit (set in this
    thread: another thread's setting is its own)."""
    own = torch.get_num_threads()
    try:
        yield _THREADS.setdefault(own, _Threads(own))
    finally:
        torch.set_num_threads(own)


@torch.no_grad()
def decode(model: Any, rows: Sequence[Row], pad_id: int,
           text_of: Callable[[list[int]], str] | None = None, prefixes: PrefixCache | None = None,
           on_done: Callable[[int, Decoded], None] | None = None, max_scores: int = 1 << 26,
           on_token: Callable[[int, int], None] | None = None,
           join: Callable[[int], Sequence[Row]] | None = None) -> list[Decoded]:
    """Generate every row of ``rows`` together; ``text_of`` decodes ids for stop strings.

    Prefill: each prompt starts from the longest prefix ``prefixes`` holds (a previous turn
    of its episode, a shared system prompt); a prefix prompts of the batch share (a system
    prompt and tool schemas, the judge's template, the ``n`` copies of a voting request) is
    prefilled once first (:func:`_shared_prefixes`). What is left of the prompts is prefilled in groups of
    similar lengths (:func:`_groups`; at most ``max_scores`` attention scores at once), then
    all rows decode together, one forward pass per new token, a finished row leaving the
    batch (``on_done(i, decoded)`` is called then, and its sequence stored in ``prefixes``).
    ``on_token(i, token)`` is called for each token of row ``i`` as it is sampled (streaming).

    Continuous batching: after each token step, ``join(running)`` is asked for new rows
    (``running``: how many rows the batch has now); the rows it returns are
    prefilled the same way and merged into the running batch (their cache rows right-aligned
    with the running ones, left padding masked out), so a request that arrives while a batch
    decodes starts at the next token instead of after the batch's last row. They take the
    indices after ``rows`` (for ``on_done``, ``on_token`` and the result); one that cannot run
    ends at once with its ``error`` set. Only models whose cache :class:`PrefixCache` supports
    take rows this way (others decode the rows they started with).
    """
    with _fast_attention(model), _chosen_threads() as threads:
        return _Decoder(model, pad_id, text_of, prefixes, max_scores, on_done, on_token, threads).run(rows, join)


class _Decoder:
    """The state of one :func:`decode`: the rows, their output, and the running batch (the
    cache, attention mask, next position id, temperature and top-p of each active row)."""

    def __init__(self, model: Any, pad_id: int, text_of: Callable[[list[int]], str] | None,
                 prefixes: PrefixCache | None, max_scores: int, on_done: Callable[[int, Decoded], None] | None,
                 on_token: Callable[[int, int], None] | None, threads: _Threads):
        self.model, self.pad_id, self.text_of, self.max_scores = model, pad_id, text_of, max_scores
        self.threads = threads
        self.on_done, self.on_token, self.prefixes = on_done, on_token, prefixes
        self.reuse = _supported(model)
        self.store = prefixes if prefixes is not None and self.reuse else PrefixCache()
        self.store.check(model)
        cfg = model.config
        self.r = 6 * getattr(cfg, "hidden_size", 64)
        self.heads = getattr(cfg, "num_attention_heads", 1)
        self.rows: list[Row] = []
        self.out: list[Decoded] = []
        self.active: list[int] = []   # batch position -> row index
        self.cache: Any = None
        self.mask = self.nxt = self.temps = self.top_p = self.logits = torch.empty(0)

    def run(self, rows: Sequence[Row], join: Callable[[int], Sequence[Row]] | None) -> list[Decoded]:
        torch.set_num_threads(self.threads.best())
        self._add(rows)
        device = self.model.device
        while True:
            tokens, logps = _choose(self.logits, self.temps, self.top_p, [self.rows[i] for i in self.active])
            keep = [j for j, (i, tok, lp) in enumerate(zip(self.active, tokens.tolist(), logps.tolist()))
                    if self._step(j, i, tok, lp)]
            if keep and len(keep) < len(self.active):   # finished rows leave the batch and the cache
                keep = _fill_gaps(keep)
                sel = torch.tensor(keep, device=device)
                self.cache.batch_select_indices(sel)
                self.mask, self.nxt, self.temps, self.top_p = (self.mask[sel], self.nxt[sel], self.temps[sel],
                                                               self.top_p[sel])
                tokens = tokens[sel]
            self.active = [self.active[j] for j in keep]
            if not self.active:
                return self.out
            self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.active), 1))], dim=1)
            threads = self.threads.pick()
            torch.set_num_threads(threads)
            start = time.perf_counter()
            self.logits = self.model(input_ids=tokens[:, None], attention_mask=self.mask,
                                     position_ids=self.nxt[:, None], past_key_values=self.cache,
                                     use_cache=True).logits[:, -1].float()
            self.threads.record(threads, time.perf_counter() - start)
            torch.set_num_threads(self.threads.best())   # for what comes next: sampling, joins
            self.nxt = self.nxt + 1
            if join is not None and self.reuse:
                self._join(join(len(self.active)))

    def _join(self, rows: Sequence[Row]) -> None:
        """Add ``rows`` to the running batch; if that fails, each alone: a row that cannot run
        (a token id past the vocabulary) ends with its ``error`` and the others go on."""
        if not rows:
            return
        try:
            self._add(rows)
        except Exception:
            for row in rows:
                try:
                    self._add([row])
                except Exception as e:
                    self.rows.append(row)
                    self.out.append(Decoded(error=e))
                    if self.on_done:
                        self.on_done(len(self.rows) - 1, self.out[-1])

    def _step(self, j: int, i: int, tok: int, lp: float) -> bool:
        """Record row ``i``'s (batch position ``j``) new token; whether it goes on."""
        row, got = self.rows[i], self.out[i]
        got.ids.append(tok)
        got.logprobs.append(lp)
        if self.on_token:
            self.on_token(i, tok)
        got.stopped = tok in row.stop_ids or bool(
            row.stop_strings and self.text_of and any(s in self.text_of(got.ids) for s in row.stop_strings))
        got.cancelled = row.cancel is not None and row.cancel.is_set()
        if not got.stopped and not got.cancelled and len(got.ids) < row.max_new_tokens:
            return True
        if self.prefixes is not None and self.reuse:   # what was fed: the prompt and all but the last token
            real = self.mask[j].bool()
            self.prefixes.add(row.prompt + got.ids[:-1],
                              [(k[j][:, real], v[j][:, real]) for k, v in _layers(self.cache)])
        if self.on_done:
            self.on_done(i, got)
        return False

    def _add(self, rows: Sequence[Row]) -> None:
        """Prefill ``rows`` and merge them into the running batch (empty at the start)."""
        model, store, reuse, pad_id = self.model, self.store, self.reuse, self.pad_id
        prompts = [r.prompt for r in rows]
        for prefix in _shared_prefixes(prompts) if reuse else ():
            n, kv = store.match(prefix)
            if len(prefix) - n >= MIN_SHARED:   # a pass reads all the weights: a few tokens go with each row
                n, kv = store.match(prefix, len(prefix) - 1)
                _, cache, _, _ = _prefill(model, [prefix], [(n, kv)], pad_id)
                store.add(prefix, [(k[0], v[0]) for k, v in _layers(cache)])
                store.prefilled_tokens += len(prefix) - n
        pasts = [store.match(p, len(p) - 1) if reuse else (0, None) for p in prompts]
        for p, (n, _) in zip(prompts, pasts):
            store.hits += n > 0
            store.reused_tokens += n
            store.prefilled_tokens += len(p) - n
        groups = (_groups(prompts, [n for n, _ in pasts], self.r, self.max_scores, self.heads) if reuse
                  else [list(range(len(rows)))])
        parts = [(g, *_prefill(model, [prompts[i] for i in g], [pasts[i] for i in g], pad_id)) for g in groups]
        order = [len(self.rows) + i for g, *_ in parts for i in g]
        self.rows += rows
        self.out += [Decoded() for _ in rows]
        caches = [_layers(c) for _, _, c, _, _ in parts]
        masks = [m for _, _, _, m, _ in parts]
        if self.active:   # the running batch: its cache so far, its rows' own mask and positions
            caches.insert(0, _layers(self.cache))
            masks.insert(0, self.mask)
        length = max(m.shape[1] for m in masks)
        device = model.device
        self.logits = torch.cat([self.logits] * bool(self.active) + [lg for _, lg, _, _, _ in parts])
        self.mask = torch.cat([_pad_left(m, length) for m in masks])
        self.nxt = torch.cat([self.nxt] * bool(self.active) + [n for _, _, _, _, n in parts])
        self.active = self.active + order
        rs = [self.rows[i] for i in self.active]
        self.temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rs], device=device)
        self.top_p = torch.tensor([r.top_p for r in rs], device=device)
        self.cache = parts[0][2]
        if reuse:   # one full-attention cache for every group, with room for the answers
            room = max(self.rows[i].max_new_tokens - len(self.out[i].ids) for i in self.active)
            self.cache.layers = [_Preallocated([c[layer] for c in caches], length, room)
                                 for layer in range(len(self.cache.layers))]


def _fill_gaps(keep: list[int]) -> list[int]:
    """The batch positions ``keep`` (ascending) in a new order: those among the first
    ``len(keep)`` stay where they are, the others fill the places of the rows that left."""
    n = len(keep)
    stay = {j for j in keep if j < n}
    movers = iter(j for j in keep if j >= n)
    return [q if q in stay else next(movers) for q in range(n)]


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


class Batcher:
    """Runs ``run_batch(items, deliver, more)`` on one worker thread, batching what callers submit.

    A batch is taken from the queue when the worker is free: what is queued,
    plus what arrives within ``window_s`` of the first item, up to ``max_rows``
    rows (``rows_of`` counts an item's rows; an item larger than that runs
    alone), lower ``priority`` first, then in order of arrival. While it runs,
    ``run_batch`` may call ``more(rows)`` (``rows``: how many it is running now)
    for what has been queued since, up to ``max_rows`` rows in all, taken in the
    same order (stopping at the first item that does not fit; nothing waits):
    continuous batching. The items it returns take the next indices.
    ``run_batch`` calls ``deliver(i, result_or_exception)`` for each item as
    soon as that item is done (an exception is raised to that item's caller
    only); an item it leaves undelivered fails. Cancelled requests are
    skipped. ``submit`` is thread-safe and never blocks.
    """

    def __init__(self, run_batch: Callable[[list[Any], Callable[[int, Any], None], Callable[[int], list[Any]]], None],
                 *, window_s: float = 0.005, max_rows: int = 32, rows_of: Callable[[Any], int] = lambda item: 1,
                 name: str = "batcher"):
        self.run_batch, self.window_s, self.max_rows, self.rows_of = run_batch, window_s, max_rows, rows_of
        self.name = name
        self.batches = 0          # run_batch calls
        self.items = 0            # items run
        self.joined = 0           # items that joined a running batch (through ``more``)
        self.largest = 0          # most items in one batch (joined ones included)
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False

    def submit(self, item: Any, priority: int = 0) -> Future:
        """Queue ``item``; the future gets its result (or exception)."""
        if self._closed:
            raise PolicyError(f"{self.name} is closed")
        fut: Future = Future()
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
        self._queue.put((priority, next(self._seq), item, fut))
        return fut

    def close(self) -> None:
        """Stop the worker after the batch it is running; queued requests fail."""
        self._closed = True
        self._queue.put((-math.inf, next(self._seq), None, None))

    def _fits(self, entry: tuple, rows: int) -> bool:
        return entry[3] is not None and rows + self.rows_of(entry[2]) <= self.max_rows

    def _take(self) -> list[tuple[Any, Future]] | None:
        first = self._queue.get()
        if first[3] is None:
            return None
        batch = [first]
        rows = self.rows_of(first[2])
        deadline = time.monotonic() + self.window_s
        while rows < self.max_rows:
            try:
                left = deadline - time.monotonic()
                nxt = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if not self._fits(nxt, rows):
                self._queue.put(nxt)   # the stop, or the next batch's first item
                break
            batch.append(nxt)
            rows += self.rows_of(nxt[2])
        return [(item, fut) for _, _, item, fut in batch]

    def _more(self, rows: int) -> list[tuple[Any, Future]]:
        """Queued items that fit beside ``rows`` running rows, in queue order (none is waited for)."""
        got = []
        while not self._closed:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if not self._fits(nxt, rows):
                self._queue.put(nxt)
                break
            if nxt[3].set_running_or_notify_cancel():
                got.append((nxt[2], nxt[3]))
                rows += self.rows_of(nxt[2])
        return got

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                break
            batch = [(item, fut) for item, fut in batch if fut.set_running_or_notify_cancel()]
            if not batch:
                continue
            self.batches += 1
            self.items += len(batch)
            self.largest = max(self.largest, len(batch))
            futures = [fut for _, fut in batch]

            def deliver(i: int, result: Any) -> None:
                fut = futures[i]
                if not fut.done():
                    (fut.set_exception if isinstance(result, BaseException) else fut.set_result)(result)

            def more(rows: int) -> list[Any]:
                joined = self._more(rows)
                futures.extend(fut for _, fut in joined)
                self.items += len(joined)
                self.joined += len(joined)
                self.largest = max(self.largest, len(futures))
                return [item for item, _ in joined]

            try:
                self.run_batch([item for item, _ in batch], deliver, more)
            except BaseException as e:  # run_batch isolates per-item errors; this is a bug or a crash
                for i in range(len(futures)):
                    deliver(i, e)
            for i in range(len(futures)):
                deliver(i, PolicyError(f"{self.name}: no result for this request"))
        closed = PolicyError(f"{self.name} was closed before this request ran")
        while True:
            try:
                _, _, _, fut = self._queue.get_nowait()
            except queue.Empty:
                return
            if fut is not None and fut.set_running_or_notify_cancel():
                fut.set_exception(closed)
