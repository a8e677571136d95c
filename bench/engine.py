"""The project's engine against ``transformers`` ``generate``: tokens/s at 1, 16 and 64 at once.

``python -m bench.engine [--model smollm2] [--prompts agent|short] [--levels 1 16 64] [--max-tokens 64]
[--repeats 1] [--json]`` prints one JSON object. At each level ``c`` the same ``c`` chat prompts,
rendered with the model's own chat template, are answered twice, in turns, in one process. The
prompts: ``agent`` (default), the agent loop's own prompts of the reference runs of ``outdir``
tasks in real sandboxes (system turn with the tool schemas, the instruction, the turns so far:
about 600 tokens, most of them shared); ``short``, one short system turn and a distinct short
task each (about 50 tokens). The two paths:

* ``engine``: :class:`agents.hf_policy.HFPolicy`, ``c`` requests at once (continuous batching and
  the prefix cache of :mod:`agents.batching`; finished rows leave the batch);
* ``generate``: one ``model.generate`` call on the ``c`` left-padded prompts (static batching: the
  batch runs until its longest row ends).

Both sample at temperature 1 with no top-k / top-p truncation, up to ``--max-tokens`` new tokens,
stopping at the model's end-of-turn token. ``tokens_per_s`` counts the tokens each row really
produced (to and including its end token), over the wall time of the whole level; ``speedup`` is
engine over generate. Figures are printed, never asserted (the machine is shared: compare the two
of one run, not runs of different days).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from bench import finish, outdir_runs

SYSTEM = "You are a careful shell assistant. Answer with one bash command and one sentence on why."
TASKS = ["count the lines of {f}", "show the last 5 lines of {f}", "make the directory {f}.d",
         "find every file under /srv/{f}", "print the size of {f}", "sort {f} and drop duplicates",
         "replace 'a' by 'b' in {f}", "compress {f} with gzip"]


def short_prompts(n: int) -> list[tuple[list[dict], None]]:
    """``n`` distinct short chats sharing one system turn (no tools)."""
    return [([{"role": "system", "content": SYSTEM},
              {"role": "user", "content": TASKS[i % len(TASKS)].format(f=f"/data/file{i}.txt")}], None)
            for i in range(n)]


def agent_prompts(policy: Any, n: int) -> list[tuple[list[dict], list[dict] | None]]:
    """``n`` of the agent loop's prompts (messages, tools): the steps after the first of ``outdir``
    reference runs (each holds the word the episode read, so no two episodes' prompts are equal)."""

    runs = outdir_runs(policy, f"outdir:0:{-(-n // 3)}", lambda t: t.data["oracle"], 4)
    return [(e.messages, e.tools) for ep in runs for e in ep[1:]][:n]


def engine_level(policy: Any, chats: list[tuple[list[dict], Any]], max_tokens: int, seed: int) -> tuple[int, float]:
    """Tokens produced and wall seconds for ``chats`` sent at once to the engine."""
    async def run() -> list[Any]:
        return await asyncio.gather(*(policy.generate(m, tools, temperature=1.0, top_p=1.0, max_tokens=max_tokens,
                                                      seed=seed + i) for i, (m, tools) in enumerate(chats)))
    if policy.prefixes is not None:   # no KV carried over from the previous level or repeat
        policy.prefixes.clear()
    t0 = time.perf_counter()
    gens = asyncio.run(run())
    return sum(len(g.response_ids) for g in gens), time.perf_counter() - t0


def generate_level(policy: Any, chats: list[tuple[list[dict], Any]], max_tokens: int, seed: int) -> tuple[int, float]:
    """Tokens produced and wall seconds for ``chats`` as one left-padded ``model.generate`` batch."""
    import torch

    model, tok = policy.model, policy.tokenizer
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    t0 = time.perf_counter()
    ids = [policy.prompt_ids(m, tools) for m, tools in chats]   # the engine's own prompt tokens
    width = max(map(len, ids))
    enc = {"input_ids": torch.tensor([[pad] * (width - len(i)) + i for i in ids]),
           "attention_mask": torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])}
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_tokens,
                             pad_token_id=pad)
    wall = time.perf_counter() - t0
    produced = 0
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        produced += n
    return produced, wall


def run(model: str, levels: list[int], max_tokens: int, repeats: int, prompts: str = "agent",
        seed: int = 0) -> dict[str, Any]:
    """The figures of every level (see the module docstring)."""
    import torch

    from nextstate.agents.hf_policy import HFPolicy

    policy = HFPolicy(model, seed=seed, max_batch_rows=max(levels))
    out: dict[str, Any] = {"model": model, "prompts": prompts, "max_tokens": max_tokens, "repeats": repeats,
                           "threads": torch.get_num_threads(), "levels": {}}
    try:
        every = agent_prompts(policy, max(levels)) if prompts == "agent" else short_prompts(max(levels))
        out["prompt_tokens_mean"] = round(sum(len(policy.prompt_ids(m, t)) for m, t in every) / len(every), 1)
        engine_level(policy, every[:2], 4, seed)                      # warm-up of both paths
        generate_level(policy, every[:2], 4, seed)
        for c in levels:
            chats = every[:c]
            e_tok = e_s = g_tok = g_s = 0.0
            for r in range(repeats):
                n, s = engine_level(policy, chats, max_tokens, seed + 1000 * r)
                e_tok, e_s = e_tok + n, e_s + s
                n, s = generate_level(policy, chats, max_tokens, seed + 1000 * r)
                g_tok, g_s = g_tok + n, g_s + s
            engine, generate = e_tok / e_s, g_tok / g_s
            out["levels"][str(c)] = {"engine_tokens_per_s": round(engine, 1), "generate_tokens_per_s": round(generate, 1),
                                     "speedup": round(engine / generate, 2), "engine_tokens": int(e_tok),
                                     "generate_tokens": int(g_tok), "engine_s": round(e_s, 1), "generate_s": round(g_s, 1)}
            print(f"bench.engine: {c} at once: {out['levels'][str(c)]}", file=sys.stderr, flush=True)
    finally:
        asyncio.run(policy.aclose())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="a preset or a model directory (default: smollm2)")
    ap.add_argument("--prompts", choices=["agent", "short"], default="agent", help="see above")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 16, 64], help="requests at once")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens at most per answer")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each path per level, in turns")
    ap.add_argument("--json", action="store_true", help="one JSON object")
    args = ap.parse_args(argv)
    return finish("bench.engine", lambda: run(args.model, args.levels, args.max_tokens, args.repeats, args.prompts),
                  args.json, model=args.model)


if __name__ == "__main__":
    sys.exit(main())
