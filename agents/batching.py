"""Batched generation for a local transformers model: a request batcher and a decode loop.

:class:`Batcher` collects requests from any thread or event loop for a few
milliseconds (and everything that arrived while the previous batch ran) and
hands them to one worker thread as one batch. :func:`decode` then generates
all rows of a batch together: the prefix the prompts share prefilled once,
the rest left-padded, one forward pass per new token for every unfinished
row, with a KV cache; rows that finish leave the batch (their cache rows are
dropped).

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
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from agents.policy import PolicyError


@dataclass
class Row:
    """One sequence to generate.

    ``temperature`` 0 means greedy. ``generator`` draws this row's samples (so a
    seeded request gives the same tokens whatever else shares its batch).
    """

    prompt: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    generator: torch.Generator | None = None


@dataclass
class Decoded:
    """What one row produced: tokens, ``log_softmax(logits / T)`` of each, and whether a
    stop condition (rather than the length limit) ended it."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stopped: bool = False


def _choose(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor,
            rows: Sequence[Row]) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token of each row and its log-prob under ``log_softmax(logits / T)`` (T = 1 when greedy)."""
    logp = torch.log_softmax(logits / temps[:, None], dim=-1)
    tokens = logits.argmax(dim=-1)
    sampled = [i for i, r in enumerate(rows) if r.temperature > 0]
    if sampled:
        probs = logp[sampled].exp()
        p = top_p[sampled]
        if bool((p < 1).any()):  # nucleus: keep the smallest prefix whose mass reaches top_p
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= p[:, None]
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        for j, i in enumerate(sampled):
            tokens[i] = torch.multinomial(probs[j], 1, generator=rows[i].generator)[0]
    return tokens, logp.gather(-1, tokens[:, None])[:, 0]


def common_prefix(prompts: Sequence[list[int]]) -> int:
    """Length of the longest prefix all ``prompts`` share, leaving each at least one token."""
    if len(prompts) < 2:
        return 0
    return min(len(os.path.commonprefix(list(prompts))), min(map(len, prompts)) - 1)


@torch.no_grad()
def decode(model: Any, rows: Sequence[Row], pad_id: int,
           text_of: Callable[[list[int]], str] | None = None) -> list[Decoded]:
    """Generate every row of ``rows`` together; ``text_of`` decodes ids for stop strings.

    The prefix every prompt shares (a system prompt and tool schemas, the judge's
    template, the ``n`` copies of a voting request) is prefilled once and its
    KV cache copied to every row; the rest of each prompt follows it,
    left-padded, so a row reads ``[shared prefix][padding][own suffix]`` with
    the padding masked out and position ids counting real tokens only.
    """
    from transformers import DynamicCache

    device = model.device
    cache = DynamicCache(config=model.config)
    shared = common_prefix([r.prompt for r in rows])
    if shared:
        prefix = torch.tensor([rows[0].prompt[:shared]], dtype=torch.long, device=device)
        model(input_ids=prefix, position_ids=torch.arange(shared, device=device)[None],
              past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(len(rows))
    width = max(len(r.prompt) for r in rows) - shared
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), shared + width), dtype=torch.long)
    mask[:, :shared] = 1
    for i, r in enumerate(rows):
        own = r.prompt[shared:]
        ids[i, width - len(own):] = torch.tensor(own, dtype=torch.long)
        mask[i, shared + width - len(own):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1].float()
    nxt = positions[:, -1] + 1
    temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows], device=device)
    top_p = torch.tensor([r.top_p for r in rows], device=device)
    out = [Decoded() for _ in rows]
    active = list(range(len(rows)))   # batch position -> row index
    while True:
        tokens, logps = _choose(logits, temps, top_p, [rows[i] for i in active])
        keep = []
        for j, (i, tok, lp) in enumerate(zip(active, tokens.tolist(), logps.tolist())):
            row, got = rows[i], out[i]
            got.ids.append(tok)
            got.logprobs.append(lp)
            got.stopped = tok in row.stop_ids or bool(
                row.stop_strings and text_of and any(s in text_of(got.ids) for s in row.stop_strings))
            if not got.stopped and len(got.ids) < row.max_new_tokens:
                keep.append(j)
        if not keep:
            return out
        if len(keep) < len(active):   # finished rows leave the batch and the cache
            sel = torch.tensor(keep, device=device)
            cache.batch_select_indices(sel)
            mask, nxt, temps, top_p, tokens = mask[sel], nxt[sel], temps[sel], top_p[sel], tokens[sel]
            active = [active[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=nxt[:, None],
                       past_key_values=cache, use_cache=True).logits[:, -1].float()
        nxt = nxt + 1


class Batcher:
    """Runs ``run_batch(items, deliver)`` on one worker thread, batching what callers submit.

    A batch is taken from the queue when the worker is free: what is queued,
    plus what arrives within ``window_s`` of the first item, up to ``max_rows``
    rows (``rows_of`` counts an item's rows; an item larger than that runs
    alone), lower ``priority`` first, then in order of arrival. ``run_batch``
    calls ``deliver(i, result_or_exception)`` for each item as soon as that item
    is done (an exception is raised to that item's caller only); an item it
    leaves undelivered fails. Cancelled requests are skipped. ``submit`` is
    thread-safe and never blocks.
    """

    def __init__(self, run_batch: Callable[[list[Any], Callable[[int, Any], None]], None], *,
                 window_s: float = 0.005, max_rows: int = 32, rows_of: Callable[[Any], int] = lambda item: 1,
                 name: str = "batcher"):
        self.run_batch, self.window_s, self.max_rows, self.rows_of = run_batch, window_s, max_rows, rows_of
        self.name = name
        self.batches = 0          # run_batch calls
        self.items = 0            # items run
        self.largest = 0          # most items in one batch
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
            if nxt[3] is None or rows + self.rows_of(nxt[2]) > self.max_rows:
                self._queue.put(nxt)   # the stop, or the next batch's first item
                break
            batch.append(nxt)
            rows += self.rows_of(nxt[2])
        return [(item, fut) for _, _, item, fut in batch]

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

            try:
                self.run_batch([item for item, _ in batch], deliver)
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
