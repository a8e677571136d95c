"""A policy backed by a local transformers model (``"tiny"``, a path, or a hub name).

Log-probs: for each sampled token, ``log_softmax(raw_logits / T)[token]`` with
``T`` the sampling temperature (``T = 1`` for greedy decoding). That is the
distribution the token was drawn from when ``top_p = 1`` (top-k is always
off), and it is what the trainer recomputes for ``log pi_old`` (logits divided
by the rollout temperature, no truncation), so the two agree exactly up to
numerics. With ``top_p < 1`` the token was drawn from the truncated
distribution but the log-prob reported is still the untruncated one, as the
trainer computes it.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from agents.policy import Generation, Policy


class HFPolicy(Policy):
    """``model.generate`` in a worker thread, one call at a time.

    ``.model`` and ``.tokenizer`` are public: the local trainer updates
    ``.model`` in place, holding ``.lock`` while it does (generation holds it too).
    ``seed=`` in :meth:`generate` reseeds torch's global RNG for that call. The model
    runs in ``dtype`` (default float32) on ``device``; ``seed`` (init) draws the tiny
    preset's weights.
    """

    def __init__(self, model_name_or_path: str = "tiny", device: str = "cpu", dtype: Any = None, *,
                 seed: int = 0, max_new_tokens: int = 512, name: str | None = None):
        import torch
        if model_name_or_path == "tiny":
            from agents.tiny import load_tiny
            self.model, self.tokenizer = load_tiny(seed)
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer
            self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
            self.model = AutoModelForCausalLM.from_pretrained(model_name_or_path)
        self.model.to(device=device, dtype=dtype or torch.float32).eval()
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.name = name or f"hf:{model_name_or_path}"
        self.renders_tools = "tools" in (self.tokenizer.chat_template or "")
        self.lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-policy")

    # -- prompts ----------------------------------------------------------------------
    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of the chat template applied to ``messages``, ready for the answer."""
        kw = {"tools": tools} if tools and self.renders_tools else {}
        with self._tokenizer_lock:  # callers on the event loop and in the worker share it
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                           tokenize=True, return_dict=False, **kw))

    def count_tokens(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        return len(self.prompt_ids(messages, tools))

    def _eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        ids = eos if isinstance(eos, list) else [eos]
        return [i for i in {*ids, self.tokenizer.eos_token_id} if i is not None]

    # -- generation -------------------------------------------------------------------
    def _generate(self, messages: list[dict], tools: list[dict] | None, n: int,
                  sampling: dict[str, Any]) -> list[Generation]:
        import torch
        temperature = float(sampling.get("temperature", 1.0) or 0.0)
        max_tokens = int(sampling.get("max_tokens") or self.max_new_tokens)
        stop = sampling.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        eos = self._eos_ids()
        stop_strings = []
        for s in stop:  # a stop string that is one token stops like EOS (and exactly)
            ids = self.tokenizer.encode(s, add_special_tokens=False)
            if len(ids) == 1:
                eos.append(ids[0])
            else:
                stop_strings.append(s)
        kwargs: dict[str, Any] = dict(max_new_tokens=max_tokens, eos_token_id=eos,
                                      pad_token_id=self.tokenizer.pad_token_id or eos[0],
                                      return_dict_in_generate=True, output_logits=True,
                                      num_return_sequences=n, do_sample=temperature > 0)
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=float(sampling.get("top_p", 1.0)), top_k=0)
        if stop_strings:
            kwargs.update(stop_strings=stop_strings, tokenizer=self.tokenizer)
        prompt = self.prompt_ids(messages, tools)
        with self.lock, torch.no_grad():
            if sampling.get("seed") is not None:
                torch.manual_seed(int(sampling["seed"]))
            inputs = torch.tensor([prompt], device=self.model.device)
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
            scale = temperature if temperature > 0 else 1.0
            logits = torch.stack(out.logits, dim=1).float() / scale        # (n, steps, vocab)
            response = out.sequences[:, len(prompt):]
            picked = torch.log_softmax(logits, dim=-1).gather(-1, response[..., None])[..., 0]
        gens = []
        for i in range(n):
            ids = response[i].tolist()
            cut = next((j + 1 for j, t in enumerate(ids) if t in eos), len(ids))
            ids = ids[:cut]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            hit = [text.index(s) + len(s) for s in stop_strings if s in text]
            if hit:
                text = text[:min(hit)]
            ended = cut < response.shape[1] or (ids and ids[-1] in eos) or bool(hit)
            gens.append(Generation(text=text, prompt_ids=prompt, response_ids=ids,
                                   logprobs=picked[i, :cut].tolist(),
                                   finish_reason="stop" if ended else "length",
                                   ids_from_server=True))
        return gens

    async def _run(self, messages: list[dict], tools: list[dict] | None, n: int,
                   sampling: dict[str, Any]) -> list[Generation]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker,
                                          partial(self._generate, messages, tools, n, sampling))

    async def generate(self, messages: list[dict], tools: list[dict] | None = None,
                       **sampling: Any) -> Generation:
        return (await self._run(messages, tools, 1, sampling))[0]

    async def complete(self, messages: list[dict], n: int = 1, temperature: float = 1.0,
                       max_tokens: int = 1024) -> list[str]:
        """``n`` answers sampled in one batched ``generate``."""
        gens = await self._run(messages, None, n, {"temperature": temperature, "max_tokens": max_tokens})
        return [g.text for g in gens]

    async def aclose(self) -> None:
        self._worker.shutdown(wait=False)
