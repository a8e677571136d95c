"""HFPolicy on the tiny preset, and the tiny preset itself (no downloads)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nextstate.agents.hf_policy import HFPolicy
from nextstate.agents import make_policy
from nextstate.agents.tiny import HERE, build_files, load_tiny, save_tiny

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
    """The same tokens; the log-probs up to float noise (decode picks its thread count by timing,
    and a reduction split over two threads sums in another order)."""
    a = tiny.generate_sync(MESSAGES, temperature=1.0, seed=7)
    b = tiny.generate_sync(MESSAGES, temperature=1.0, seed=7)
    c = tiny.generate_sync(MESSAGES, temperature=1.0, seed=8)
    assert a.response_ids == b.response_ids
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    assert a.response_ids != c.response_ids


def test_greedy_and_length_limit(tiny):
    gen = tiny.generate_sync(MESSAGES, temperature=0.0, max_tokens=5)
    again = tiny.generate_sync(MESSAGES, temperature=0.0, max_tokens=5)
    assert gen.response_ids == again.response_ids
    assert 1 <= len(gen.response_ids) <= 5
    assert gen.finish_reason == ("stop" if gen.response_ids[-1] in tiny._eos_ids() else "length")


def test_stops_at_a_stop_string(tiny):
    """A seeded draw is replayed with its own third token's text as the stop string: the
    replay must end right there, with finish_reason "stop"."""
    free = tiny.generate_sync(MESSAGES, temperature=1.0, seed=3, max_tokens=24)
    assert len(free.response_ids) >= 3
    stop = tiny.tokenizer.decode(free.response_ids[2:3])
    cut = tiny.generate_sync(MESSAGES, temperature=1.0, seed=3, max_tokens=24, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text.endswith(stop)
    assert cut.response_ids == free.response_ids[:len(cut.response_ids)] and len(cut.response_ids) <= 3


def test_pad_id_zero_is_a_real_pad_id():
    """A tokenizer whose pad token has id 0 pads with 0, not with EOS."""
    fake = types.SimpleNamespace(tokenizer=types.SimpleNamespace(pad_token_id=0), _eos_ids=lambda: [9])
    assert HFPolicy._pad_id(fake) == 0
    fake.tokenizer.pad_token_id = None
    assert HFPolicy._pad_id(fake) == 9


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


def test_a_screenshot_in_the_prompt_reaches_a_template_that_takes_only_strings_as_image_text():
    """A GUI observation is text and ``image_url`` parts; a template that concatenates the content
    (SmolLM2's) raised TypeError on the list. The policy joins the parts, an image as ``<image>``,
    the same text the tiny preset's own template writes."""
    policy = HFPolicy("tiny", max_new_tokens=4)
    shot = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    gui = [MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "Task: click OK"}, shot]}]
    flat = [MESSAGES[0], {"role": "user", "content": "Task: click OK<image>"}]
    assert policy.prompt_ids(gui) == policy.prompt_ids(flat)   # tiny's template: unchanged
    policy.tokenizer.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
                                      "+ '<|im_end|>\\n' }}{% endfor %}{{ '<|im_start|>assistant\\n' }}")
    with pytest.raises(TypeError):
        policy.tokenizer.apply_chat_template(gui, add_generation_prompt=True, tokenize=False)
    assert policy.prompt_ids(gui) == policy.prompt_ids(flat)
    assert policy.tokenizer.decode(policy.prompt_ids(gui)).count("<image>") == 1
    assert policy.generate_sync(gui, temperature=0.0).prompt_ids == policy.prompt_ids(flat)


def test_tokenizer_is_byte_level_bpe_with_single_token_tags():
    _, tok = load_tiny()
    text = "h\xe9llo\n\t \x00 <tool_call>{}</tool_call> \U0001F600"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == text   # any text round-trips
    assert ids.count(tok.convert_tokens_to_ids("<tool_call>")) == 1
    assert tok.convert_ids_to_tokens(list(range(256, 261))) == [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]
    call = '<tool_call>{"name": "bash", "arguments": {"command": "cat /app/note"}}</tool_call>'
    assert len(tok.encode(call, add_special_tokens=False)) < len(call) / 3   # merges learned


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


def test_untied_preset_has_its_own_output_embedding_and_trains_saves_loads(tmp_path):
    """``tiny-untied``: the same tokenizer and input embedding as ``tiny``, a separate output
    matrix; a step on an output-only loss leaves the input embedding alone; it saves and loads
    by path untied."""
    tied, untied = make_policy("tiny"), make_policy("tiny-untied")
    model = untied.model
    assert tied.model.lm_head.weight is tied.model.model.embed_tokens.weight
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.model.embed_tokens.weight, tied.model.model.embed_tokens.weight)
    assert untied.tokenizer.get_vocab() == tied.tokenizer.get_vocab()
    embed = model.model.embed_tokens.weight.detach().clone()
    head = model.lm_head.weight.detach().clone()
    model.train()
    hidden = torch.randn(3, model.config.hidden_size)   # the output layer alone: no input embedding on the path
    loss = torch.nn.functional.cross_entropy(model.lm_head(hidden), torch.tensor([1, 2, 3]))
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    model.eval()
    assert torch.equal(model.model.embed_tokens.weight, embed)   # tied, this step would move the input too
    assert not torch.equal(model.lm_head.weight, head)
    save_tiny(tmp_path / "untied", tied=False)
    loaded = HFPolicy(str(tmp_path / "untied"))
    assert json.loads((tmp_path / "untied" / "config.json").read_text())["tie_word_embeddings"] is False
    assert loaded.model.lm_head.weight.data_ptr() != loaded.model.model.embed_tokens.weight.data_ptr()
    fresh, _ = load_tiny(tied=False)
    assert all(torch.equal(a, b) for a, b in zip(loaded.model.state_dict().values(), fresh.state_dict().values()))
    assert not torch.equal(fresh.lm_head.weight, fresh.model.embed_tokens.weight)


# -- batching ---------------------------------------------------------------------------
def _recomputed(policy: HFPolicy, gen, temperature: float) -> torch.Tensor:
    """log pi_old of ``gen`` as the trainer recomputes it: that (prompt, response) alone."""
    from nextstate.train.batch import Sample, collate
    from nextstate.train.loss import token_log_probs
    mb = collate([Sample(gen.prompt_ids, gen.response_ids, gen.logprobs, 0.0, 0.0)], pad_id=0)
    with torch.no_grad():
        lp, _ = token_log_probs(policy.model, mb, temperature)
    return lp[0, :len(gen.response_ids)]


def _chat(k: int) -> list[dict]:
    return [{"role": "user", "content": f"request {k}: " + "pad the prompt. " * (k * 7 % 60)}]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
async def test_batched_requests_match_the_trainers_recomputation(temperature):
    """Prompts of very different lengths (4x apart) in one batch: left padding, the attention
    mask and position ids must give each row exactly what it gets alone."""
    policy = HFPolicy("tiny", batch_window_s=0.2)
    chats = [_chat(k) for k in range(12)]
    lengths = [policy.count_tokens(c) for c in chats]
    assert max(lengths) > 4 * min(lengths)
    gens = await asyncio.gather(*(policy.generate(c, temperature=temperature, max_tokens=20, seed=k)
                                  for k, c in enumerate(chats)))
    assert policy.batcher.largest == 12 and policy.decode_calls == 1
    for c, gen in zip(chats, gens):
        assert gen.prompt_ids == policy.prompt_ids(c)
        assert len(gen.logprobs) == len(gen.response_ids) > 0
        expected = _recomputed(policy, gen, temperature or 1.0)
        assert torch.allclose(expected, torch.tensor(gen.logprobs), atol=2e-5), (expected, gen.logprobs)
    if temperature == 0.0:   # greedy: the same tokens as the request alone
        alone = await policy.generate(chats[5], temperature=0.0, max_tokens=20)
        assert alone.response_ids == gens[5].response_ids


async def test_seeded_request_does_not_depend_on_its_batch():
    policy = HFPolicy("tiny", batch_window_s=0.2)
    alone = await policy.generate(_chat(0), temperature=1.0, max_tokens=16, seed=11)
    crowd = await asyncio.gather(*(policy.generate(_chat(k), temperature=1.0, max_tokens=16, seed=11 + k)
                                   for k in range(8)))
    assert policy.batcher.largest == 8
    assert crowd[0].response_ids == alone.response_ids


def test_sampling_draws_from_the_softmax_and_its_nucleus():
    """One uniform draw per token, placed in the cumulative distribution: the frequencies are the
    softmax (top-p: the renormalized nucleus), the log-prob is the untruncated one's."""
    from nextstate.agents.batching import Row, _choose
    logits = torch.tensor([[0.0, 1.0, 2.0, -50.0]] * 2)
    rows = [Row([1], 1, 1.0, top_p, generator=torch.Generator().manual_seed(k)) for k, top_p in enumerate([1.0, 0.7])]
    counts = torch.zeros(2, 4)
    for _ in range(4000):
        tokens, logps = _choose(logits, torch.ones(2), torch.tensor([1.0, 0.7]), rows)
        counts[[0, 1], tokens] += 1
        assert torch.allclose(logps, torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0])
    probs = torch.softmax(logits[0], -1)
    nucleus = torch.tensor([0.0, probs[1], probs[2], 0.0]) / (probs[1] + probs[2])   # 0.67 < 0.7 <= 0.67 + 0.24
    assert torch.allclose(counts[0] / 4000, probs, atol=0.03) and counts[0, 3] == 0
    assert torch.allclose(counts[1] / 4000, nucleus, atol=0.03) and counts[1, 0] == counts[1, 3] == 0


async def test_concurrent_requests_are_batched():
    policy = HFPolicy("tiny", batch_window_s=0.05)
    gens = await asyncio.gather(*(policy.generate(_chat(k), temperature=1.0, max_tokens=8)
                                  for k in range(32)))
    assert len(gens) == 32 and all(g.response_ids for g in gens)
    assert policy.batcher.items == 32
    assert policy.decode_calls <= 4 < 32


async def test_n_votes_are_one_request_and_exact():
    """The judge asks for n=m answers in one request: n rows, batched with other requests."""
    policy = HFPolicy("tiny", batch_window_s=0.2)
    votes, other = await asyncio.gather(policy._run(_chat(2), None, 4, {"temperature": 0.6, "max_tokens": 12}),
                                        policy.generate(_chat(9), temperature=1.0, max_tokens=12))
    assert policy.decode_calls == 1 and policy.batcher.largest == 2
    assert len(votes) == 4 and len({tuple(g.response_ids) for g in votes}) > 1
    for gen in votes + [other]:
        temperature = 0.6 if gen in votes else 1.0
        assert torch.allclose(_recomputed(policy, gen, temperature), torch.tensor(gen.logprobs), atol=2e-5)
    texts = await policy.complete(_chat(2), n=3, temperature=0.6, max_tokens=8)
    assert len(texts) == 3


async def test_one_bad_request_does_not_poison_its_batch():
    """A bad sampling parameter fails before decoding; a prompt the model cannot embed (a token
    id past its vocabulary, as with a mismatched tokenizer) breaks the batched forward pass, and
    then each request reruns alone so that only the culprit fails."""
    class Mismatched(HFPolicy):
        def prompt_ids(self, messages, tools=None):
            ids = super().prompt_ids(messages, tools)
            return ids + [10_000] if "poison" in messages[-1]["content"] else ids

    policy = Mismatched("tiny", batch_window_s=0.2)
    good = [_chat(k) for k in range(4)]
    results = await asyncio.gather(
        *(policy.generate(c, temperature=1.0, max_tokens=8) for c in good),
        policy.generate([{"role": "user", "content": "poison"}], temperature=1.0, max_tokens=8),
        policy.generate(_chat(5), temperature=1.0, top_p=0.0, max_tokens=8),
        return_exceptions=True)
    assert all(not isinstance(r, BaseException) and r.response_ids for r in results[:4])
    assert isinstance(results[4], IndexError)
    assert isinstance(results[5], ValueError) and "top_p" in str(results[5])
    again = await policy.generate(good[0], temperature=1.0, max_tokens=8)   # the worker lives on
    assert again.response_ids


async def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Yields to the event loop until ``condition()`` holds (a worker thread got somewhere)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come about"
        await asyncio.sleep(0.01)


async def test_weight_swap_waits_for_the_running_batch():
    """The trainer's publish() holds ``policy.lock``: a batch never runs on half-swapped weights."""
    policy = HFPolicy("tiny", batch_window_s=0.0)
    with policy.lock:
        task = asyncio.ensure_future(policy.generate(_chat(1), temperature=0.0, max_tokens=8))
        await _until(lambda: policy.batcher.batches == 1)   # the worker has taken the batch
        await asyncio.sleep(0.1)
        assert not task.done()          # the batch waits for the swap to finish
        with torch.no_grad():
            for p in policy.model.parameters():
                p.mul_(0.5)
    gen = await task
    assert torch.allclose(_recomputed(policy, gen, 1.0), torch.tensor(gen.logprobs), atol=2e-5)


async def test_closed_policy_fails_clearly():
    from nextstate.agents.policy import PolicyError
    policy = HFPolicy("tiny")
    await policy.generate(_chat(1), max_tokens=4)
    await policy.aclose()
    with pytest.raises(PolicyError, match="closed"):
        await policy.generate(_chat(1), max_tokens=4)


async def test_shared_prefix_is_prefilled_once_and_stays_exact():
    """Episodes share a long system prompt: it is prefilled once (suffixes of different
    lengths after it); an unrelated prompt runs in the same batch from its own start."""
    policy = HFPolicy("tiny", batch_window_s=0.2)
    system = {"role": "system", "content": "You operate a Linux terminal. " * 40}
    chats = [[system, {"role": "user", "content": "task %d " % k + "details " * (k * 9)}] for k in range(6)]
    other = [{"role": "system", "content": "Judge the step."}, {"role": "user", "content": "x" * 900}]
    gens = await asyncio.gather(*(policy.generate(c, temperature=1.0, max_tokens=12) for c in chats + [other]))
    assert policy.decode_calls == 1
    shared = len(os.path.commonprefix([policy.prompt_ids(c) for c in chats]))
    total = sum(policy.count_tokens(c) for c in chats + [other])
    assert policy.prefixes.hits == 6 and policy.prefixes.prefilled_tokens == total - 5 * shared
    for gen in gens:
        assert torch.allclose(_recomputed(policy, gen, 1.0), torch.tensor(gen.logprobs), atol=2e-5)


async def test_judge_requests_go_ahead_of_queued_turns():
    """``complete`` (the judge's call, under a timeout) is taken before queued ``generate``
    turns, and each request is answered as soon as its own rows are done."""
    policy = HFPolicy("tiny", max_batch_rows=2)
    finished: list[str] = []

    async def turn(k: int) -> None:
        await policy.generate(_chat(k), temperature=1.0, max_tokens=4)
        finished.append(f"turn{k}")

    async def vote() -> None:
        await policy.complete(_chat(0), n=2, temperature=0.6, max_tokens=4)
        finished.append("vote")

    with policy.lock:   # the worker takes the first batch and waits on the lock
        first = asyncio.ensure_future(turn(0))
        await _until(lambda: policy.batcher.batches == 1)
        rest = [asyncio.ensure_future(turn(k)) for k in range(1, 7)]
        await _until(lambda: policy.batcher._queue.qsize() == 6)
        judge = asyncio.ensure_future(vote())
        await _until(lambda: policy.batcher._queue.qsize() == 7)   # queued last, taken first
    await asyncio.gather(first, judge, *rest)
    assert finished[:2] == ["turn0", "vote"], finished


async def _hold_first_token(policy: HFPolicy, messages: list[dict], release: threading.Event,
                            **sampling) -> tuple[asyncio.Future, threading.Event]:
    """Submit ``messages`` as a request whose worker waits at its first token until ``release``
    is set: its batch is then decoding, deterministically. Returns its future and an event set
    once it is held."""
    from nextstate.agents.hf_policy import _Request
    held = threading.Event()

    def on_token(_: int) -> None:
        if not held.is_set():
            held.set()
            release.wait(30)

    fut = policy.batcher.submit(_Request(messages, None, 1, sampling, on_token=on_token), 1)
    await _until(held.is_set)
    return asyncio.wrap_future(fut), held


async def test_a_request_joins_the_running_batch_and_stays_exact():
    """Continuous batching: requests queued while a long one decodes join its batch at the next
    token (one prompt shorter than the running cache, one longer, so both sides get left
    padding), finish before it, and give the tokens and log-probs they give alone; one that
    cannot run fails alone."""
    class Endless(HFPolicy):   # no end-of-text token: the long request runs to its length limit
        def _eos_ids(self):
            return []

        def prompt_ids(self, messages, tools=None):
            ids = super().prompt_ids(messages, tools)
            return ids + [10_000] if "poison" in messages[-1]["content"] else ids

    policy = Endless("tiny", batch_window_s=0.0)
    joiners = [_chat(0), _chat(8)]
    alone = [await policy.generate(c, temperature=1.0, max_tokens=8, seed=5 + k) for k, c in enumerate(joiners)]
    batches = policy.batcher.batches
    release = threading.Event()
    long, _ = await _hold_first_token(policy, _chat(1), release, temperature=1.0, max_tokens=100, seed=1)
    finished: list[str] = []
    long.add_done_callback(lambda _: finished.append("long"))

    async def ask(name: str, messages: list[dict], seed: int):
        try:
            return await policy.generate(messages, temperature=1.0, max_tokens=8, seed=seed)
        finally:
            finished.append(name)

    tasks = [asyncio.ensure_future(ask(f"joiner{k}", c, 5 + k)) for k, c in enumerate(joiners)]
    tasks.append(asyncio.ensure_future(ask("poison", [{"role": "user", "content": "poison"}], 0)))
    await _until(lambda: policy.batcher._queue.qsize() == 3)
    release.set()
    *gens, poisoned = await asyncio.gather(*tasks, return_exceptions=True)
    long_gen = (await long)[0]
    assert policy.batcher.batches == batches + 1 and policy.batcher.joined == 3
    assert isinstance(poisoned, IndexError)
    assert len(long_gen.response_ids) == 100 and finished[-1] == "long"   # the joiners did not wait for it
    assert policy.decode_calls == 3   # two requests alone, then one batch
    prompt = policy.count_tokens(_chat(1))
    assert policy.count_tokens(joiners[0]) < prompt + 1 < policy.count_tokens(joiners[1])
    for gen, ref in zip(gens, alone):
        assert gen.response_ids == ref.response_ids
        assert torch.allclose(torch.tensor(ref.logprobs), torch.tensor(gen.logprobs), atol=2e-5)
    for gen in [*gens, long_gen]:
        assert torch.allclose(_recomputed(policy, gen, 1.0), torch.tensor(gen.logprobs), atol=2e-5)


async def test_a_waiting_weight_swap_stops_joins():
    """While a weight swap waits for the running batch, queued requests do not join it: the
    swap waits only for the rows already running, and the queued request gets the new weights."""
    policy = HFPolicy("tiny", batch_window_s=0.0)
    release = threading.Event()
    running, _ = await _hold_first_token(policy, _chat(1), release, temperature=1.0, max_tokens=8)
    swapped = threading.Event()

    def swap() -> None:
        with policy.lock, torch.no_grad():
            for p in policy.model.parameters():
                p.mul_(0.5)
            policy.version += 1
        swapped.set()

    swapper = threading.Thread(target=swap)
    swapper.start()
    await _until(lambda: policy.lock.waiting == 1)
    queued = asyncio.ensure_future(policy.generate(_chat(2), temperature=1.0, max_tokens=8))
    await _until(lambda: policy.batcher._queue.qsize() == 1)
    release.set()
    first, gen = (await running)[0], await queued
    swapper.join()
    assert swapped.is_set() and policy.batcher.joined == 0 and policy.batcher.batches == 2
    assert first.policy_version == 0 and gen.policy_version == 1
    assert torch.allclose(_recomputed(policy, gen, 1.0), torch.tensor(gen.logprobs), atol=2e-5)


# -- prefix cache ------------------------------------------------------------------------
def _episode(k: int) -> list[dict]:
    return [{"role": "system", "content": "You operate a Linux terminal. " * 20},
            {"role": "user", "content": f"task {k}: " + "list the files. " * (3 + 5 * k)}]


async def test_next_turns_reuse_their_episodes_cache_and_stay_exact():
    """A turn's prompt extends the previous turn's prompt and answer: it starts from that
    sequence's KV cache, in a batch with a prompt that has none, and the tokens and log-probs
    are those of the same requests run without reuse."""
    policy = HFPolicy("tiny", batch_window_s=0.2)
    plain = HFPolicy("tiny", batch_window_s=0.2, prefix_cache_bytes=0)
    assert plain.prefixes is None
    firsts = await asyncio.gather(*(policy.generate(_episode(k), temperature=1.0, max_tokens=16, seed=k)
                                    for k in range(3)))
    seconds = [_episode(k) + [{"role": "assistant", "content": g.text}, {"role": "user", "content": "out: ok"}]
               for k, g in enumerate(firsts)]
    batch = seconds + [_chat(4)]
    reused = policy.prefixes.reused_tokens
    gens = await asyncio.gather(*(policy.generate(c, temperature=0.0, max_tokens=16) for c in batch))
    assert policy.batcher.largest == 4
    assert policy.prefixes.reused_tokens - reused >= sum(len(g.prompt_ids) for g in firsts)
    alone = await asyncio.gather(*(plain.generate(c, temperature=0.0, max_tokens=16) for c in batch))
    assert policy.model.config._attn_implementation == "sdpa"   # decode's own attention is undone
    for gen, ref in zip(gens, alone):
        assert gen.prompt_ids == ref.prompt_ids
        assert gen.response_ids == ref.response_ids
        assert torch.allclose(_recomputed(policy, gen, 1.0), torch.tensor(gen.logprobs), atol=2e-5)


async def test_changed_weights_are_never_served_from_the_cache():
    """The trainer writes new weights in place: every stored cache is dropped, so the next turn
    is prefilled under the new weights (its log-probs match a recomputation with them)."""
    policy = HFPolicy("tiny")
    first = await policy.generate(_episode(1), temperature=1.0, max_tokens=12)
    assert len(policy.prefixes) >= 1
    with policy.lock, torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(0.5)
    nxt = _episode(1) + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "out: ok"}]
    gen = await policy.generate(nxt, temperature=1.0, max_tokens=12)
    assert policy.prefixes.reused_tokens == 0
    assert torch.allclose(_recomputed(policy, gen, 1.0), torch.tensor(gen.logprobs), atol=2e-5)


async def test_a_sliding_window_model_generates_without_reuse():
    """Only full-attention caches are reused; a model with sliding-window layers still batches
    (one prefill, no stored prefixes) and stays exact."""
    from transformers import AutoModelForCausalLM, MistralConfig
    policy = HFPolicy("tiny", batch_window_s=0.2)
    c = policy.model.config
    cfg = MistralConfig(vocab_size=c.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=64,
                        pad_token_id=c.pad_token_id, eos_token_id=c.eos_token_id)
    torch.manual_seed(0)
    policy.model = AutoModelForCausalLM.from_config(cfg).eval()
    gens = await asyncio.gather(*(policy.generate(_episode(k), temperature=1.0, max_tokens=12) for k in range(3)))
    assert policy.decode_calls == 1 and policy.prefixes.reused_tokens == 0 and len(policy.prefixes) == 0
    for gen in gens:
        assert torch.allclose(_recomputed(policy, gen, 1.0), torch.tensor(gen.logprobs), atol=2e-5)


def test_prefix_cache_finds_the_longest_common_prefix_and_evicts_the_least_recent():
    """Any token ids (not only bytes); the match is cut to ``limit``; a sequence that extends a
    stored one replaces it; past ``max_bytes`` the least recently used sequence goes."""
    from nextstate.agents.batching import PrefixCache

    def kv(n: int) -> list:   # one layer, 2 heads, head dim 3; value = position
        t = torch.arange(n, dtype=torch.float32)[None, :, None].expand(2, n, 3).clone()
        return [(t, t.clone())]

    size = 2 * 2 * 40 * 3 * 4   # one 40-token entry, keys and values
    cache = PrefixCache(max_bytes=2 * size + 200, block=4)   # two entries (three do not fit)
    a = [50_000 + i for i in range(40)]
    cache.add(a, kv(40))
    n, got = cache.match(a[:21] + [7, 7, 7])
    assert n == 21 and got[0][0].shape == (2, 21, 3) and float(got[0][0][0, -1, 0]) == 20
    assert cache.match(a + [1], limit=30)[0] == 30
    assert cache.match(a[:3])[0] == 0   # less than one block in common
    cache.add(a[:20] + [9] * 20, kv(40))
    assert len(cache) == 2 and cache.match(a[:20] + [9] * 25)[0] == 40
    cache.match(a)   # a is now the most recent
    cache.add([1] * 40, kv(40))
    assert len(cache) == 2 and cache.match(a)[0] == 40 and cache.match(a[:20] + [9] * 20)[0] == 20
    cache.add(a + [5] * 4, kv(44)[:1])   # extends a: replaces it
    assert len(cache) == 2 and cache.match(a + [5] * 4)[0] == 44
