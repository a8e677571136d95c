"""What a training update costs on this CPU, per 1k trained tokens, four ways side by side.

``python -m bench.train_speed [--model smollm2] [--episodes 4] [--updates 3] [--json]`` prints one
JSON object. The samples are real: the reference runs of ``outdir:0:EPISODES`` in real sandboxes
(4 steps each), every step's prompt as the agent loop builds it with the model's chat template.
Each option runs ``--updates`` AdamW updates of token-mean cross-entropy on the same samples, in
turns in one process (the machine is shared: compare options of one run):

* ``full``: every weight trains, one sample per step (what ``train.sft`` and the learner do);
* ``freeze``: the embeddings and the lower two thirds of the layers frozen (no gradient there);
* ``lora``: LoRA adapters (``peft``, rank 16 on every attention and MLP projection), base frozen;
* ``packed``: every weight trains, one sequence per episode (its last prompt and answer, which hold
  the earlier turns verbatim), the loss on all of the episode's answers at once instead of one
  sample per step over a repeated prefix. Only offered where the template renders each turn's
  prompt as a prefix of the next (checked here: ``packable``).

Figures per option: ``s_per_1k_trained_tokens`` (answer tokens, the ones with a gradient signal),
``tokens_processed`` per update, ``trainable_params``. Their effect on learning is not measured
here (that takes a training run per option).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from bench import finish, outdir_runs


def samples(policy: Any, runs: list[list[Any]]) -> tuple[list[Any], list[Any], bool]:
    """Per-step samples, per-episode packed samples (answers masked in, prompts out), and whether
    every step's prompt + answer is a prefix of the episode's last sequence."""
    from nextstate.train.batch import Sample

    tok = policy.tokenizer
    steps, packed, prefix_ok = [], [], True
    for ep in runs:
        rows = [(policy.prompt_ids(e.messages, e.tools), tok.encode(e.text, add_special_tokens=False)) for e in ep]
        steps += [Sample(p, r, [0.0] * len(r), 0.0, 0.0) for p, r in rows]
        full = rows[-1][0] + rows[-1][1]
        mask = [0] * len(full)
        for p, r in rows:
            prefix_ok &= full[:len(p) + len(r)] == p + r
            for i in range(len(p), min(len(p) + len(r), len(full))):
                mask[i] = 1
        packed.append((full, mask))
    return steps, packed, prefix_ok


def timed_updates(model: Any, batches: list[Any], updates: int, params: list[Any]) -> float:
    """Seconds per update (mean) of ``updates`` AdamW steps, each over every micro-batch of ``batches``
    (``(input_ids, attention_mask, loss_mask)`` triples)."""
    import torch

    opt = torch.optim.AdamW(params, lr=1e-5)
    model.train()
    times = []
    for _ in range(updates):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for ids, attn, mask in batches:
            logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
            m = mask[:, 1:].float()
            (-(lp * m).sum() / m.sum()).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    model.eval()
    return statistics.fmean(times)


def tensors(rows: list[tuple[list[int], list[int]]], pad: int, size: int) -> list[Any]:
    """``(ids, mask)`` rows as right-padded micro-batches of ``size``."""
    import torch

    out = []
    for k in range(0, len(rows), size):
        chunk = rows[k:k + size]
        width = max(len(i) for i, _ in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, (i, m) in enumerate(chunk):
            ids[j, :len(i)], attn[j, :len(i)], mask[j, :len(m)] = torch.tensor(i), 1, torch.tensor(m)
        out.append((ids, attn, mask))
    return out


def measure(model_name: str, episodes: int, updates: int, micro: int) -> dict[str, Any]:
    """The figures of every option (see the module docstring)."""
    import copy

    from nextstate.agents.hf_policy import HFPolicy

    policy = HFPolicy(model_name)
    try:
        runs = outdir_runs(policy, f"outdir:0:{episodes}", lambda t: t.data["oracle"], 4)
        steps, packed, packable = samples(policy, runs)
    finally:
        asyncio.run(policy.aclose())
    pad = policy.tokenizer.pad_token_id or 0
    per_step = [(s.prompt_ids + s.response_ids, [0] * len(s.prompt_ids) + [1] * len(s.response_ids)) for s in steps]
    trained = sum(len(s.response_ids) for s in steps)
    base = policy.model
    layers = base.config.num_hidden_layers
    out: dict[str, Any] = {"model": model_name, "episodes": len(runs), "steps": len(steps), "updates": updates,
                           "micro_batch": micro, "trained_tokens": trained, "layers": layers,
                           "packable": packable, "options": {}}

    def option(name: str, model: Any, rows: list[tuple[list[int], list[int]]]) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        s = timed_updates(model, tensors(rows, pad, micro), updates, params)
        out["options"][name] = {"s_per_update": round(s, 2), "s_per_1k_trained_tokens": round(1000 * s / trained, 2),
                                "tokens_processed": sum(len(i) for i, _ in rows),
                                "trainable_params": sum(p.numel() for p in params)}
        print(f"bench.train_speed: {name}: {out['options'][name]}", file=sys.stderr, flush=True)

    option("full", copy.deepcopy(base), per_step)
    frozen = copy.deepcopy(base)
    frozen.get_input_embeddings().requires_grad_(False)
    for layer in frozen.model.layers[:2 * layers // 3]:
        layer.requires_grad_(False)
    option("freeze", frozen, per_step)
    del frozen
    try:
        from peft import LoraConfig, get_peft_model
        lora = get_peft_model(copy.deepcopy(base), LoraConfig(
            r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"]))
        option("lora", lora, per_step)
        del lora
    except ImportError:
        out["options"]["lora"] = "peft is not installed"
    if packable:
        option("packed", copy.deepcopy(base), packed)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.train_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="a preset or a model directory (default: smollm2)")
    ap.add_argument("--episodes", type=int, default=4, help="outdir reference runs whose steps are trained on")
    ap.add_argument("--updates", type=int, default=3, help="timed updates per option")
    ap.add_argument("--micro-batch", type=int, default=4, help="samples per forward/backward")
    ap.add_argument("--json", action="store_true", help="one JSON object")
    args = ap.parse_args(argv)
    return finish("bench.train_speed", lambda: measure(args.model, args.episodes, args.updates, args.micro_batch),
                  args.json, model=args.model)


if __name__ == "__main__":
    sys.exit(main())
