"""The ``hf`` rollout server (the plugin's CPU stand-in for vLLM) on the tiny model, without Ray."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("verl.workers.rollout.replica", reason="veRL's rollout stack is not installed")

from nextstate.agents.tiny import save_tiny  # noqa: E402
from nextstate.train.verl_backend.hf_rollout import NAME, HFReplica, HFRolloutServer, HFServerAdapter  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny"))


async def test_concurrent_requests_are_batched_and_log_probs_are_the_models(model_dir):
    server = HFRolloutServer(str(model_dir), max_tokens=32)
    prompts = [[256, 10, 20, 30], [256, 40, 50, 60, 70, 80, 90], [256, 5]]
    limits = [12, 5, 9]
    outs = await asyncio.gather(*(server.generate(p, {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                                      "max_tokens": n}) for p, n in zip(prompts, limits)))
    for prompt, limit, out in zip(prompts, limits, outs):
        assert 0 < len(out.token_ids) <= limit and len(out.log_probs) == len(out.token_ids)
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = server.model(ids).logits[0, len(prompt) - 1:-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=1e-4)
        assert out.extra_fields["global_steps"] is None and out.stop_reason == "completed"


def test_weight_updates_load_the_actors_tensors_and_refuse_unknown_names(model_dir):
    server = HFRolloutServer(str(model_dir))
    before = server.weight_checksum()
    state = {k: v + 0.01 for k, v in server.model.state_dict().items() if k.endswith("q_proj.weight")}
    assert server.update_weights(state, global_steps=3)["loaded"] == len(state) > 0
    assert server.weight_checksum() != before and server.global_steps == 3
    with pytest.raises(KeyError, match="does not have"):
        server.update_weights({"no.such.weight": torch.zeros(1)})


def test_registered_in_both_of_verls_rollout_registries():
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    assert get_rollout_class(NAME, "async") is HFServerAdapter
    assert get_rollout_replica_class(NAME) is HFReplica


async def test_generation_stops_at_stop_token_ids_and_after_stop_strings(model_dir):
    server = HFRolloutServer(str(model_dir), max_tokens=32)
    prompt = [256, 10, 20, 30]
    greedy = {"temperature": 0.0, "max_tokens": 12}
    free = (await server.generate(prompt, greedy)).token_ids
    by_id = await server.generate(prompt, {**greedy, "stop_token_ids": [free[0]]})
    assert by_id.token_ids == free[:1] and len(by_id.log_probs) == 1
    decode = server.tokenizer.decode
    text = decode(free[:2], skip_special_tokens=True)                       # a two-token stop string
    first = next(j for j in range(len(free)) if text in decode(free[:j + 1], skip_special_tokens=True))
    by_string = await server.generate(prompt, {**greedy, "stop": [text]})
    assert by_string.token_ids == free[:first + 1] and len(free) > first + 1
