"""The ``hf`` rollout: a transformers model behind veRL 0.9.1's rollout server interfaces.

vLLM and SGLang need GPUs; this rollout serves the same token-in/token-out
calls from a transformers ``generate`` on the CPU, so veRL's own trainer, agent
loop and weight sync run on a machine without an accelerator. Three parts, the
same three veRL's vLLM rollout has:

* :class:`HFRolloutServer` -- a Ray actor holding the model. ``generate``
  takes prompt token ids and veRL's sampling parameters and returns a
  ``TokenOutput`` with the sampled ids and their log-probs
  (``log_softmax(logits / T)`` of each sampled token, the quantity veRL's
  actor recomputes as ``old_log_prob``), stopping at EOS, at ``stop_token_ids``
  and after ``stop`` strings (found in the response only, as vLLM does, so the rows
  run on to their limit and are cut after). Requests that arrive together are
  generated as one left-padded batch. ``update_weights`` loads a state dict.
  Sleep, wake-up and the KV-cache calls are no-ops: nothing is offloaded, so
  there is nothing to free or restore.
* :class:`HFReplica` -- the ``RolloutReplica`` veRL's ``LLMServerManager``
  launches (registered in ``RolloutReplicaRegistry`` as ``hf``); one server
  per replica, no GPU resources. Its server is the Ray actor
  ``hf_server_<replica>`` (``hf_server_<replica>_<policy>`` for the second and
  later policies of a run that trains several, from the replica's ``name_suffix``).
* :class:`HFServerAdapter` -- the ``BaseRollout`` inside the actor worker
  (registered in ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` as
  ``("hf", "async")``): veRL's naive checkpoint engine hands it the actor's
  full tensors after each update, and it sends them to the server (found by
  name; the worker group of a second policy carries the policy's name in
  ``NEXTSTATE_POLICY``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Generator

import ray
import torch
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

from nextstate.train.verl_backend import POLICY_ENV

log = logging.getLogger(__name__)

NAME = "hf"
MAX_BATCH = 16


def server_name(replica_rank: int, policy: str = "") -> str:
    """The Ray actor name of a replica's server (the adapter finds it by name); ``policy`` names
    the trained policy when a run trains several (:data:`train.verl_backend.POLICY_ENV`)."""
    return f"{NAME}_server_{replica_rank}" + (f"_{policy}" if policy else "")


@dataclass
class _Request:
    prompt_ids: list[int]
    params: dict[str, Any]
    future: asyncio.Future = field(repr=False)

    @property
    def sampling_key(self) -> tuple:
        p = self.params
        return (float(p.get("temperature", 1.0) or 0.0), float(p.get("top_p", 1.0) or 1.0),
                int(p.get("top_k", -1) or -1), float(p.get("repetition_penalty", 1.0) or 1.0),
                tuple(p.get("stop_token_ids") or ()), tuple(p.get("stop") or ()))


class HFRolloutServer:
    """The model and a batching queue (a Ray actor; see the module docstring)."""

    def __init__(self, model_path: str, dtype: str = "float32", max_tokens: int = 512, seed: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)   # for ``stop`` strings
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos = [i for i in eos if i is not None]
        pad = self.model.generation_config.pad_token_id
        self.pad = pad if pad is not None else (self.eos[0] if self.eos else 0)
        self.max_tokens = max_tokens
        self.global_steps: int | None = None
        self.weight_updates = 0
        self.lock = threading.Lock()          # generation and weight loads never overlap
        self.queue: asyncio.Queue[_Request] | None = None
        self.worker: asyncio.Task | None = None
        torch.manual_seed(seed)

    # -- generation --------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str = "",
                       **_: Any) -> TokenOutput:
        """Sample a response to ``prompt_ids`` (veRL's server ``generate`` call)."""
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.worker = asyncio.get_running_loop().create_task(self._serve())
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Request(list(prompt_ids), dict(sampling_params), future))
        return await future

    async def _serve(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while not self.queue.empty() and len(batch) < MAX_BATCH:
                batch.append(self.queue.get_nowait())
            groups: dict[tuple, list[_Request]] = {}
            for req in batch:
                groups.setdefault(req.sampling_key, []).append(req)
            for group in groups.values():
                try:
                    outs = await asyncio.to_thread(self._generate, group)
                except Exception as e:  # noqa: BLE001 - the callers get the error
                    for req in group:
                        if not req.future.done():
                            req.future.set_exception(e)
                    continue
                for req, out in zip(group, outs):
                    if not req.future.done():
                        req.future.set_result(out)

    def _generate(self, group: list[_Request]) -> list[TokenOutput]:
        temperature, top_p, top_k, repetition_penalty, stop_ids, stop_strings = group[0].sampling_key
        ends = [*self.eos, *stop_ids]
        limits = [int(r.params.get("max_tokens") or r.params.get("max_new_tokens") or self.max_tokens)
                  for r in group]
        width = max(len(r.prompt_ids) for r in group)
        ids = torch.full((len(group), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for i, r in enumerate(group):                          # left padding
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids):] = 1
        kwargs: dict[str, Any] = dict(max_new_tokens=max(limits), eos_token_id=ends, pad_token_id=self.pad,
                                      return_dict_in_generate=True, output_logits=True,
                                      do_sample=temperature > 0, repetition_penalty=repetition_penalty)
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else 0)
        with self.lock, torch.no_grad():
            out = self.model.generate(ids, attention_mask=mask, **kwargs)
            logits = torch.stack(out.logits, dim=1).float() / (temperature if temperature > 0 else 1.0)
            response = out.sequences[:, width:]
            picked = torch.log_softmax(logits, dim=-1).gather(-1, response[..., None])[..., 0]
        outputs = []
        for i, limit in enumerate(limits):
            row = response[i, :limit].tolist()
            cut = next((j + 1 for j, t in enumerate(row) if t in ends), len(row))
            if stop_strings:     # up to the token that completes the first stop string in the response
                cut = next((j + 1 for j in range(cut) if any(
                    s in self.tokenizer.decode(row[:j + 1], skip_special_tokens=True) for s in stop_strings)), cut)
            outputs.append(TokenOutput(token_ids=row[:cut], log_probs=picked[i, :cut].tolist(),
                                       stop_reason="completed",
                                       extra_fields={"global_steps": self.global_steps}))
        return outputs

    # -- weights -----------------------------------------------------------------------
    def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> dict[str, int]:
        """Load the actor's tensors (HF names); returns how many were loaded."""
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"hf rollout: the actor sent weights this model does not have: {unknown[:5]}")
        with self.lock, torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
        self.weight_updates += 1
        if global_steps is not None:
            self.global_steps = global_steps
        return {"loaded": len(state), "of": len(own)}

    def weight_checksum(self) -> float:
        """Sum of all parameters (tests compare it across a weight sync)."""
        with self.lock, torch.no_grad():
            return float(sum(p.double().sum() for p in self.model.parameters()))

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # -- the rest of veRL's server interface: nothing to free, abort or profile --------
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **_: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFReplica(RolloutReplica):
    """One :class:`HFRolloutServer` per replica (CPU only: no placement on accelerators)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        r = self.config
        server = ray.remote(HFRolloutServer).options(
            name=server_name(self.replica_rank, self.name_suffix.lstrip("_")), num_cpus=0, max_concurrency=self.max_concurrency,
        ).remote(model_path=self.model_config.path, dtype=_torch_dtype(r.dtype),
                 max_tokens=int(r.response_length), seed=int(r.seed))
        await server.weight_checksum.remote()          # the model is loaded
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{NAME}-replica-{self.replica_rank}"


class HFServerAdapter(BaseRollout):
    """Inside the actor worker: sends the updated weights to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        c = self.config                              # as veRL's vLLM adapter maps trainer ranks to replicas
        rank = int(os.environ.get("RANK", "0"))
        per_replica = c.tensor_model_parallel_size * c.data_parallel_size * c.pipeline_model_parallel_size
        self.replica_rank = rank // per_replica if replica_rank == -1 else replica_rank
        self._has_server = rank % per_replica == 0   # one sender per replica's server
        self._server = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank, os.environ.get(POLICY_ENV, "")))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        """No-op: the server keeps its weights and cache in host memory."""

    async def release(self) -> None:
        """No-op: there is no accelerator memory to give back."""

    async def update_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                             wire_format: str = "named_tensors", global_steps: int | None = None,
                             **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf rollout takes wire_format='named_tensors', got {wire_format!r}")
        state = {}
        for name, tensor in weights:
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            state[name] = tensor.detach().to("cpu", copy=True)
        if self._has_server:
            await self._server_handle().update_weights.remote(state, global_steps)


def _torch_dtype(name: str) -> str:
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(name, name)


def register() -> None:
    """Register the ``hf`` rollout in veRL's two rollout registries."""
    _ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFServerAdapter"
    RolloutReplicaRegistry.register(NAME, lambda: HFReplica)


register()
