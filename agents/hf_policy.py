"""A policy backed by a local transformers model (a preset of :mod:`agents.presets`, a path, or a hub name).

Generation is batched: requests from concurrent episodes and from the judge
(``complete(n=m)`` is one request of ``m`` rows) are collected for a few
milliseconds by a :class:`~agents.batching.Batcher` and generated together by
:func:`~agents.batching.decode` on one worker thread; requests that arrive
while a batch decodes join it at its next token (see :mod:`agents.batching`,
which also says why this and not transformers' continuous batching). Prompts
start from the KV cache of the longest prefix already run
(:class:`~agents.batching.PrefixCache`: an episode's previous turn, a shared
system prompt), so a turn prefills only what is new since the last one. The
judge's ``complete`` requests are queued ahead of ``generate`` turns: the
judge waits under a timeout, an episode's next turn does not.

Log-probs: for each sampled token, ``log_softmax(raw_logits / T)[token]`` with
``T`` the sampling temperature (``T = 1`` for greedy decoding). That is the
distribution the token was drawn from when ``top_p = 1`` (top-k is always
off), and it is what the trainer recomputes for ``log pi_old`` (logits divided
by the rollout temperature, no truncation), so the two agree exactly up to
numerics, batched or not. With ``top_p < 1`` the token was drawn from the
truncated distribution but the log-prob reported is still the untruncated
one, as the trainer computes it.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from nextstate.agents.batching import Batcher, Decoded, PrefixCache, Row, decode
from nextstate.agents.policy import Generation, Policy, content_text, cut_at_stop, split_stops


class WeightsLock:
    """The lock over the serving weights: a running batch holds it, and so does whoever changes
    the weights (``with policy.lock:``). It is handed over first come, first served, so a weight
    swap that waits for the running batch goes before the next batch; ``waiting`` counts the
    threads waiting for it. While one does (a swap), the running batch takes no new rows, so the
    swap waits only for the rows already running (continuous batching would otherwise keep it
    out for good)."""

    def __init__(self) -> None:
        self._turns = threading.Condition()
        self._next = 0      # tickets handed out
        self._serving = 0   # the ticket that holds the lock (or gets it next)
        self._gone: set[int] = set()   # tickets whose holder stopped waiting (an exception)

    @property
    def waiting(self) -> int:
        return max(0, self._next - self._serving - 1)

    def __enter__(self) -> "WeightsLock":
        with self._turns:
            ticket = self._next
            self._next += 1
            try:
                self._turns.wait_for(lambda: self._serving == ticket)
            except BaseException:   # a KeyboardInterrupt while waiting: its turn is skipped
                if ticket == self._serving:
                    self._pass_on()
                else:
                    self._gone.add(ticket)
                raise
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._turns:
            self._pass_on()

    def _pass_on(self) -> None:
        """The serving ticket is over: hand the lock to the next one still waiting."""
        self._serving += 1
        while self._serving in self._gone:
            self._gone.discard(self._serving)
            self._serving += 1
        self._turns.notify_all()


def text_messages(messages: list[dict]) -> list[dict]:
    """``messages`` with each list content (OpenAI text and ``image_url`` parts) joined into one
    string, an image as ``<image>``: a causal LM read through its tokenizer sees no pixels, and a
    template written for string content (SmolLM2's: ``'...' + message['content']``) cannot render
    a list (a GUI observation's screenshot). The same text the tiny preset's template writes."""
    return [{**m, "content": content_text(m["content"], sep="")} if isinstance(m.get("content"), list) else m
            for m in messages]


@dataclass
class _Request:
    messages: list[dict]
    tools: list[dict] | None
    n: int
    sampling: dict[str, Any]
    priority: int = 1
    on_token: Callable[[int], None] | None = None   # called with each sampled token (worker thread)
    cancel: threading.Event | None = None           # set: its rows end at their next token


class HFPolicy(Policy):
    """A local model serving batched generations from one worker thread.

    ``.model`` and ``.tokenizer`` are public: the local trainer updates
    ``.model`` in place, holding ``.lock`` while it does (each batch holds it
    from its first token to its last, so no generation sees half-swapped weights;
    while someone waits for it, no new request joins the running batch).
    ``seed=`` in :meth:`generate` seeds that request's own random generator, so
    its tokens do not depend on what else shares its batch. The model runs in
    ``dtype`` (default float32) on ``device``; ``seed`` (init) draws the weights of a
    preset made from a seed (``tiny``). ``batch_window_s``: how long a batch waits for more
    requests after its first; ``max_batch_rows``: rows generating at once (requests
    that arrive while a batch runs join it up to that many);
    ``prefix_cache_bytes``: memory for the KV caches of past sequences (``.prefixes``; emptied
    whenever the weights change; 0 turns reuse off).
    ``decode_calls`` counts batched generations (one per batch, more if a batch failed);
    ``cancelled`` the rows ended early because their stream was closed.
    ``version`` numbers the weights: whoever changes them bumps it while holding ``.lock``, and
    each generation reports the version it was sampled with (``Generation.policy_version``).
    """

    def __init__(self, model_name_or_path: str = "tiny", device: str = "cpu", dtype: Any = None, *,
                 seed: int = 0, max_new_tokens: int = 512, name: str | None = None,
                 batch_window_s: float = 0.005, max_batch_rows: int = 32,
                 prefix_cache_bytes: int = 1 << 30):
        import torch
        from nextstate.agents.presets import PRESETS
        if model_name_or_path in PRESETS:
            self.model, self.tokenizer = PRESETS[model_name_or_path].load(seed)
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer
            self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
            self.model = AutoModelForCausalLM.from_pretrained(model_name_or_path)
        self.model.to(device=device, dtype=dtype or torch.float32).eval()
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.name = name or f"hf:{model_name_or_path}"
        self.renders_tools = "tools" in (self.tokenizer.chat_template or "")
        self.lock = WeightsLock()
        self._tokenizer_lock = threading.Lock()
        self.decode_calls = 0
        self.cancelled = 0
        self.version = 0
        self.batcher = Batcher(self._run_batch, window_s=batch_window_s, max_rows=max_batch_rows,
                               rows_of=lambda req: req.n, name=f"{self.name} batcher")

    # -- prompts ----------------------------------------------------------------------
    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of the chat template applied to ``messages``, ready for the answer."""
        kw = {"tools": tools} if tools and self.renders_tools else {}
        with self._tokenizer_lock:  # callers on the event loop and in the worker share it
            return list(self.tokenizer.apply_chat_template(text_messages(messages), add_generation_prompt=True,
                                                           tokenize=True, return_dict=False, **kw))

    def count_tokens(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        return len(self.prompt_ids(messages, tools))

    def _eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        ids = eos if isinstance(eos, list) else [eos]
        return [i for i in {*ids, self.tokenizer.eos_token_id} if i is not None]

    def _decode_text(self, ids: list[int]) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- generation -------------------------------------------------------------------
    def _rows(self, req: _Request) -> list[Row]:
        """The ``n`` rows of a request (raises for bad sampling parameters or a bad prompt)."""
        import torch
        s = req.sampling
        temperature = float(s.get("temperature", 1.0) or 0.0)
        top_p = float(s.get("top_p", 1.0) if s.get("top_p") is not None else 1.0)
        max_tokens = int(s.get("max_tokens") or self.max_new_tokens)
        if temperature < 0 or not 0 < top_p <= 1 or max_tokens < 1 or req.n < 1:
            raise ValueError(f"bad sampling parameters: temperature={temperature}, top_p={top_p}, "
                             f"max_tokens={max_tokens}, n={req.n}")
        with self._tokenizer_lock:  # a stop string that is one token stops like EOS (and exactly)
            one_token, stop_strings = split_stops(self.tokenizer, s.get("stop"))
        stop_ids = {*self._eos_ids(), *one_token}
        prompt = self.prompt_ids(req.messages, req.tools)
        seed = s.get("seed")
        rows = []
        for i in range(req.n):
            gen = None
            if temperature > 0:
                gen = torch.Generator(device=self.model.device)
                # a seeded request is reproducible; otherwise draw from torch's global RNG
                gen.manual_seed(hash((int(seed), i)) & (2**63 - 1) if seed is not None
                                else int(torch.randint(2**62, ())))
            rows.append(Row(prompt, max_tokens, temperature, top_p, frozenset(stop_ids),
                            tuple(stop_strings), gen, req.cancel))
        return rows

    def _generation(self, row: Row, got: Decoded) -> Generation:
        text = self._decode_text(got.ids)
        text, _ = cut_at_stop(text, row.stop_strings)
        return Generation(text=text, prompt_ids=row.prompt, response_ids=got.ids, logprobs=got.logprobs,
                          finish_reason="stop" if got.stopped else "length", ids_from_server=True,
                          policy_version=self.version)

    def _decode(self, rows: list[Row], on_done: Callable[[int, Decoded], None] | None = None,
                on_token: Callable[[int, int], None] | None = None,
                join: Callable[[int], list[Row]] | None = None) -> list[Decoded]:
        with self.lock:
            self.decode_calls += 1
            return decode(self.model, rows, self._pad_id(), self._decode_text, self.prefixes, on_done,
                          on_token=on_token, join=join)

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self._eos_ids()[0]

    def _run_batch(self, first: list[_Request], deliver: Callable[[int, Any], None],
                   more: Callable[[int], list[_Request]]) -> None:
        """Generations for every request of a batch (worker thread), in one :func:`decode`, each
        delivered as soon as its rows are done; requests queued meanwhile join the running batch
        between two tokens (unless a weight swap waits for it); an error stays with its request."""
        reqs: list[_Request] = []
        rows: dict[int, list[Row]] = {}
        flat: list[tuple[int, int]] = []   # decode's row index -> (request, row of the request)
        outs: dict[int, list[Decoded | None]] = {}
        left: dict[int, int] = {}

        def admit(new: list[_Request]) -> list[Row]:
            """The rows of ``new`` (a request whose rows cannot be made gets its error now)."""
            added = []
            for req in new:
                k = len(reqs)
                reqs.append(req)
                try:
                    rows[k] = self._rows(req)
                except Exception as e:
                    deliver(k, e)
                    continue
                outs[k], left[k] = [None] * len(rows[k]), len(rows[k])
                flat.extend((k, i) for i in range(len(rows[k])))
                added += rows[k]
            return added

        def join(running: int) -> list[Row]:
            return [] if self.lock.waiting else admit(more(running))

        def row_done(j: int, got: Decoded) -> None:
            k, i = flat[j]
            outs[k][i] = got
            self.cancelled += got.cancelled
            left[k] -= 1
            if got.error is not None:
                deliver(k, got.error)
            elif not left[k] and not any(d.error for d in outs[k]):
                deliver(k, [self._generation(r, d) for r, d in zip(rows[k], outs[k])])

        def token(j: int, tok: int) -> None:
            callback = reqs[flat[j][0]].on_token
            if callback is not None:
                callback(tok)

        start = admit(first)
        if not start:
            return
        try:
            self._decode(start, row_done, token, join)
        except Exception:   # run each unfinished request alone: only the culprit fails
            for k in [k for k, n in left.items() if n]:
                try:
                    got = self._decode(rows[k])
                except Exception as e:
                    deliver(k, e)
                else:
                    deliver(k, [self._generation(r, d) for r, d in zip(rows[k], got)])

    async def _run(self, messages: list[dict], tools: list[dict] | None, n: int,
                   sampling: dict[str, Any], priority: int = 1) -> list[Generation]:
        req = _Request(messages, tools, n, sampling, priority)
        return await asyncio.wrap_future(self.batcher.submit(req, priority))

    async def generate(self, messages: list[dict], tools: list[dict] | None = None,
                       **sampling: Any) -> Generation:
        return (await self._run(messages, tools, 1, sampling))[0]

    async def generate_group(self, messages: list[dict], tools: list[dict] | None = None, n: int = 1,
                             **sampling: Any) -> list[Generation]:
        """``n`` answers sampled as one request of ``n`` rows, in one batch (row ``i`` of a seeded
        request draws from its own generator, so the answers differ and are reproducible)."""
        return await self._run(messages, tools, n, sampling)

    async def stream(self, messages: list[dict], tools: list[dict] | None = None,
                     **sampling: Any) -> AsyncIterator[tuple[str, int] | Generation]:
        """One answer as it is sampled: ``(text piece, weights version)`` pairs, then the
        :class:`Generation` (whose text the pieces add up to). Text that may still become a stop
        string is held back until it cannot; the first pair comes with the first token. Closing
        the generator early (``aclose``, a cancelled task) cancels the generation: it leaves the
        queue, or its row leaves the running batch at its next token."""
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()
        req = _Request(messages, tools, 1, sampling,   # the callback runs under .lock: the version is exact
                       on_token=lambda tok: loop.call_soon_threadsafe(tokens.put_nowait, (tok, self.version)),
                       cancel=threading.Event())
        fut = self.batcher.submit(req, req.priority)
        fut.add_done_callback(lambda _: loop.call_soon_threadsafe(tokens.put_nowait, None))
        stop = sampling.get("stop") or []
        hold = max((len(s) for s in ([stop] if isinstance(stop, str) else stop)), default=1) - 1
        ids: list[int] = []
        sent = ""
        try:
            while (item := await tokens.get()) is not None:
                tok, version = item
                ids.append(tok)
                text = self._decode_text(ids).rstrip("\ufffd")   # an unfinished UTF-8 sequence waits
                ready = text[:max(len(sent), len(text) - hold)]
                if len(ids) == 1 or (ready.startswith(sent) and len(ready) > len(sent)):
                    yield ready[len(sent):], version
                    sent = ready
            gen = (await asyncio.wrap_future(fut))[0]
        finally:
            if not fut.done():
                req.cancel.set()
                fut.cancel()
        if gen.text.startswith(sent) and len(gen.text) > len(sent):
            yield gen.text[len(sent):], gen.policy_version
        yield gen

    async def complete(self, messages: list[dict], n: int = 1, temperature: float = 1.0,
                       max_tokens: int = 1024) -> list[str]:
        """``n`` answers sampled as one request of ``n`` rows, batched with whatever else is
        pending but ahead of :meth:`generate` requests: this is what the step judge calls, under
        a timeout, while an episode's next turn can wait."""
        gens = await self._run(messages, None, n, {"temperature": temperature, "max_tokens": max_tokens},
                               priority=0)
        return [g.text for g in gens]

    async def aclose(self) -> None:
        self.batcher.close()
