"""The ``tiny`` preset: a small randomly initialised causal LM that needs no download.

Untrained, it cannot solve tasks; it exists so that every code path that
touches a real model (chat templates, token ids, log-probs, training updates,
saving and loading by path) runs on a CPU in seconds, and so that the CPU demo
can warm-start it (``python -m train.sft``) and then train it with RL.

Shipped next to this file (regenerate with :func:`build_files` after editing
the recipe below, and commit the result):

* ``tokenizer.json`` -- byte-level BPE: token id ``b`` is byte ``b`` (0..255), then
  the special tokens ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>`` and the
  tool-call tags ``<tool_call>`` / ``</tool_call>`` (single tokens, but kept
  when decoding with ``skip_special_tokens=True`` so the tool-call parser sees them),
  then 1,024 merges learned from the project's own prompts (:func:`_corpus`), so a
  tool call is about 25 tokens instead of 90 bytes and any text still round-trips;
* ``tokenizer_config.json`` and ``chat_template.jinja`` -- ChatML, with the
  tool schemas rendered into the system turn;
* ``config.json`` -- a 2-layer Llama with hidden size 64 (Llama, because
  ``AutoTokenizer`` then keeps this tokenizer as it is instead of
  substituting a model-specific class with its own pre-tokenizer).

Weights are not shipped: :func:`load_tiny` initialises them from a fixed seed.

Two presets share these files (:data:`agents.presets.PRESETS`): ``tiny``, whose input and output embeddings are
one matrix (``tie_word_embeddings``), and ``tiny-untied``, the same model with a separate output
matrix (82k more parameters). Untie it where a word must be copied as the same token it was read
as: training a token as an output in contexts that don't determine it then no longer moves its
input embedding (``docs/multi-agent.md``, the relay demo).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>"]
BUILT_IN_FAMILIES = ("terminal", "toolcall", "swe", "gui")
MERGES = 1024  # learned BPE merges on top of the 256 bytes
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + len(TOOL_TAGS) + MERGES


def _byte_alphabet() -> list[str]:
    """One printable character per byte value, index = byte (the usual byte-level trick)."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    shift, chars = 0, []
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + shift))
            shift += 1
    return chars


def _corpus() -> list[str]:
    """The text the tokenizer's merges are learned from: what this project puts in front of a
    model (system prompts and tool lines of every family, judge templates, task instructions,
    shell commands and their results). Deterministic: built from the repository's own files."""
    from nextstate.agents.chat import TOOL_FORMAT, action_text, system_prompt
    from nextstate.envs import env_class
    from nextstate.envs.terminal import procedural

    texts = [TOOL_FORMAT, "Available tools (name and argument names), one per line:"]
    for family in BUILT_IN_FAMILIES:   # not registry.names(): users and tests register more
        tools = getattr(env_class(family), "tools", [])
        texts.append(system_prompt(family, tools))
        for tool in tools:
            f = tool.get("function", tool)
            props = (f.get("parameters") or {}).get("properties") or {}
            texts.append(json.dumps({"name": f["name"], "arguments": list(props)}))
            texts.append(json.dumps({"name": f["name"], "arguments": {k: "" for k in props}}))
            texts.append(json.dumps(tool))
    root = HERE.parent.parent
    for path in sorted((root / "judges" / "templates").glob("*.yaml")):
        if path.stem in ("default", *BUILT_IN_FAMILIES):   # families added later leave the merges alone
            texts.append(path.read_text())
    for path in sorted((root / "envs").glob("*/tasks/*/task.yaml")):
        texts.append(path.read_text())
    for path in sorted((root / "envs").glob("*/tasks/*/solution.sh")):
        texts.append(path.read_text())
    for seed in range(64):  # the CPU demo's tasks, as often as a short run shows them
        task = procedural.instance(seed)
        texts += [task.instruction, task.data["value"] + "\n[exit code 0]"]
        texts += [action_text(a) for a in task.data["oracle"]]
    for code in (0, 1, 2, 126, 127):
        texts.append(f"[exit code {code}]")
    texts += ["Invalid action: The tool call is not valid JSON", "No such file or directory",
              "command not found", "Permission denied", "Result of the action: ok"]
    return texts


def _tokenizer_json() -> str:
    """A byte-level BPE: ids 0..255 are the bytes, then the special tokens and tool tags, then
    :data:`MERGES` merges learned from :func:`_corpus` (so common words and JSON keys are one
    token each and prompts are 3-4x shorter than bytes)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = _byte_alphabet()
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre
    extra = SPECIAL_TOKENS + TOOL_TAGS
    learner.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=256 + MERGES, min_frequency=2, initial_alphabet=alphabet, show_progress=False,
        special_tokens=[]))
    learned = json.loads(learner.to_str())["model"]["merges"]
    vocab = {ch: i for i, ch in enumerate(alphabet + extra)}
    merges = []
    for merge in learned:
        a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
        if a + b not in vocab:
            vocab[a + b] = len(alphabet) + len(extra) + len(merges)
            merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TOOL_TAGS])
    return tok.to_str(pretty=True)


def _model_config() -> dict[str, Any]:
    from transformers import LlamaConfig

    ids = {t: 256 + i for i, t in enumerate(SPECIAL_TOKENS)}
    cfg = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
        tie_word_embeddings=True, bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"],
    )
    out = cfg.to_diff_dict()
    out.pop("transformers_version", None)
    return out


def build_files(directory: str | os.PathLike) -> Path:
    """Write the preset's tokenizer and config files into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(_tokenizer_json() + "\n")
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
               "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "model_max_length": 32768, "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(_model_config(), indent=2, sort_keys=True) + "\n")
    if out.resolve() != HERE:
        (out / "chat_template.jinja").write_text((HERE / "chat_template.jinja").read_text())
    return out


def load_tokenizer() -> Any:
    """The tiny preset's tokenizer (from the shipped files)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(HERE))


def load_tiny(seed: int = 0, tied: bool = True) -> tuple[Any, Any]:
    """``(model, tokenizer)``: weights drawn from ``seed``, the same on every machine;
    ``tied=False``: a separate output embedding (the ``tiny-untied`` preset)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(HERE), tie_word_embeddings=tied)
    devices = []  # seed only this draw, not the caller's global RNG
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return model.eval(), load_tokenizer()


def save_tiny(directory: str | os.PathLike, seed: int = 0, tied: bool = True) -> Path:
    """Write a complete HF model directory (weights included) loadable by path."""
    model, tokenizer = load_tiny(seed, tied)
    out = Path(directory)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
