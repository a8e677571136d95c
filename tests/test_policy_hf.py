"""HFPolicy on the tiny preset, and the tiny preset itself (no downloads)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agents.hf_policy import HFPolicy
from agents.policy import make_policy
from agents.tiny import HERE, build_files, load_tiny, save_tiny

MESSAGES = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Say hi."}]
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    return HFPolicy("tiny", max_new_tokens=24)


def test_ids_and_logprobs_line_up(tiny):
    gen = tiny.generate_sync(MESSAGES, tools=TOOLS, temperature=1.0, seed=3)
    assert gen.ids_from_server
    assert gen.prompt_ids == tiny.prompt_ids(MESSAGES, TOOLS)
    assert 0 < len(gen.response_ids) <= 24
    assert len(gen.logprobs) == len(gen.response_ids)
    assert all(lp <= 0.0 for lp in gen.logprobs)
    assert gen.finish_reason in ("stop", "length")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_are_log_softmax_of_logits_over_temperature(tiny, temperature):
    gen = tiny.generate_sync(MESSAGES, temperature=temperature, seed=1)
    ids = torch.tensor([gen.prompt_ids + gen.response_ids])
    with torch.no_grad():
        logits = tiny.model(ids).logits[0, len(gen.prompt_ids) - 1:-1] / temperature
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen.response_ids)[:, None])[:, 0]
    assert torch.allclose(expected, torch.tensor(gen.logprobs), atol=1e-4)


def test_deterministic_with_a_seed(tiny):
    a = tiny.generate_sync(MESSAGES, temperature=1.0, seed=7)
    b = tiny.generate_sync(MESSAGES, temperature=1.0, seed=7)
    c = tiny.generate_sync(MESSAGES, temperature=1.0, seed=8)
    assert a.response_ids == b.response_ids and a.logprobs == b.logprobs
    assert a.response_ids != c.response_ids


def test_greedy_and_length_limit(tiny):
    gen = tiny.generate_sync(MESSAGES, temperature=0.0, max_tokens=5)
    again = tiny.generate_sync(MESSAGES, temperature=0.0, max_tokens=5)
    assert gen.response_ids == again.response_ids
    if len(gen.response_ids) == 5 and gen.response_ids[-1] not in tiny._eos_ids():
        assert gen.finish_reason == "length"


def test_stops_at_tool_call_close(tiny):
    close_id = tiny.tokenizer.convert_tokens_to_ids("</tool_call>")
    for seed in range(40):  # a random model emits the tag now and then
        gen = tiny.generate_sync(MESSAGES, temperature=1.0, seed=seed, max_tokens=24,
                                 stop=["</tool_call>"])
        if close_id in gen.response_ids:
            assert gen.response_ids[-1] == close_id and gen.finish_reason == "stop"
            assert gen.text.endswith("</tool_call>")
            return
    pytest.skip("the tiny model never emitted </tool_call> in 40 draws")


async def test_complete_samples_n(tiny):
    texts = await tiny.complete(MESSAGES, n=3, temperature=1.0, max_tokens=8)
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)


async def test_generation_does_not_block_the_event_loop(tiny):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    task = asyncio.create_task(ticker())
    start = time.monotonic()
    await tiny.generate(MESSAGES, max_tokens=24, temperature=1.0)
    took = time.monotonic() - start
    task.cancel()
    assert ticks >= min(3, int(took / 0.005) // 4)


def test_tiny_renders_tools_and_make_policy():
    p = make_policy("tiny")
    assert isinstance(p, HFPolicy) and p.renders_tools
    text = p.tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True,
                                           tokenize=False)
    assert '"name": "bash"' in text and text.endswith("<|im_start|>assistant\n")


def test_tokenizer_is_byte_level_with_single_token_tags():
    _, tok = load_tiny()
    text = "héllo\n\t \x00 <tool_call>{}</tool_call>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[:7] == list("héllo\n".encode())
    assert ids.count(tok.convert_tokens_to_ids("<tool_call>")) == 1
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_same_seed_same_weights():
    a, _ = load_tiny(seed=0)
    b, _ = load_tiny(seed=0)
    c, _ = load_tiny(seed=1)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)


def test_shipped_files_match_the_recipe(tmp_path):
    build_files(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja"):
        assert (tmp_path / name).read_text() == (HERE / name).read_text(), name


def test_saved_dir_loads_by_path_offline(tmp_path):
    save_tiny(tmp_path / "tiny")
    code = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "ids = tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True,"
        " tokenize=True, return_dict=False)\n"
        "print(len(ids), model.config.vocab_size, float(model.lm_head.weight.detach().sum()))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tiny")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    n_ids, vocab, weight_sum = out.stdout.split()
    model, tok = load_tiny()
    assert int(vocab) == model.config.vocab_size
    assert int(n_ids) == len(tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                                     add_generation_prompt=True, tokenize=True,
                                                     return_dict=False))
    assert abs(float(weight_sum) - float(model.lm_head.weight.detach().sum())) < 1e-3
    assert json.loads((Path(tmp_path) / "tiny" / "config.json").read_text())["model_type"] == "llama"
