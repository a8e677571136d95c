"""Group sampling at the proxy (``--samples N``): the rule terms, the listwise judge's prompt and
parsing, and the real ``tiny`` model served over a real socket with the ``openai`` SDK."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from nextstate.agents.hf_policy import HFPolicy
from nextstate.agents.openai_policy import OpenAIPolicy
from nextstate.agents.policy import Generation, Policy
from nextstate.agents.testing import ScriptedOpenAIServer
from nextstate.train.config import Config, GroupConfig
from nextstate.train.proxy import ProxyTrainer, TrainingProxy, serving
from nextstate.train.proxy import group as grouping
from nextstate.train.proxy.__main__ import main
from test_proxy import client, wait_for   # tests/ is on the path (pytest's prepend import mode)

QUERY = [{"role": "user", "content": "list the files in the repository"}]


def groups(run: Path) -> list[dict]:
    path = run / "rollouts.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if r["kind"] == "group"]


# -- pure parts -----------------------------------------------------------------------------------
def test_rule_terms():
    assert grouping.quality_gate("Here are the files: a.txt") == 1.0
    for garbled in ("", "   ", "abc\ufffd", "ab\x1ecd\x02ef" * 3, "ha " * 40):
        assert grouping.quality_gate(garbled) == 0.0, garbled
    tools = [{"type": "function", "function": {"name": "bash"}}]
    assert grouping.quality_gate('<tool_call>{"name": "bash", "arguments": {}}</tool_call>', tools) == 1.0
    assert grouping.quality_gate("<tool_call>{broken</tool_call>", tools) == 0.0
    assert grouping.relevance("the files are here", "list the files") == pytest.approx(2 / 3)
    assert grouping.relevance("anything", "a b") == 0.0   # no word of three letters: nothing to match
    # {files, here} vs {files, there}: 1/3; vs {cats}: 0
    assert grouping.diversity(["files here", "files there", "cats"]) == pytest.approx(
        [1 - (1 / 3 + 0) / 2, 1 - (1 / 3 + 0) / 2, 1.0])


def test_scores_parse_from_the_last_box_of_n():
    assert grouping.parse_scores("first \\boxed{1, 2} then \\boxed{10, 0, 5}", 3) == [1.0, 0.0, 0.5]
    assert grouping.parse_scores("\\boxed{3, 4, 5} and \\boxed{1}", 3) == [0.3, 0.4, 0.5]
    assert grouping.parse_scores("\\boxed{11, 2, 3}", 3) is None
    assert grouping.parse_scores("no box", 2) is None


def test_quality_gate_reward_composition():
    cfg = GroupConfig(samples=3, reward="quality_gate", weight_feedback=0.5, weight_relevance=0.25,
                      weight_diversity=0.25)
    texts = ["files here", "files there", "\ufffd"]
    values, terms = grouping.rewards(cfg, grouping.Ranking([0.8, 0.4, 1.0]), QUERY, texts)
    assert terms["gate"] == [1.0, 1.0, 0.0]
    # relevance: {files} of {list, the, files, repository}; diversity: 1 - (1/3 + 0) / 2 for both
    div = 1 - (1 / 3) / 2
    assert values == pytest.approx([0.5 * 0.8 + 0.25 * 0.25 + 0.25 * div, 0.5 * 0.4 + 0.25 * 0.25 + 0.25 * div, 0.0])
    assert grouping.rewards(GroupConfig(samples=3), grouping.Ranking([0.8, 0.4, 1.0]), QUERY, texts)[0] == [0.8, 0.4, 1.0]
    assert grouping.rewards(cfg, grouping.Ranking(None, "no scores"), QUERY, texts) == (None, {})


def test_pick_and_group_advantages():
    assert grouping.pick("best", [0.1, 0.9, 0.9], 3, random.Random(0)) == 1
    assert grouping.pick("best", None, 3, random.Random(0)) == 0
    assert grouping.pick("random", None, 4, random.Random(5)) == random.Random(5).randrange(4)
    adv, signal = grouping.advantages([1.0, 0.0, 0.0, 1.0])
    assert signal and adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)   # mean 0.5, std 0.5
    assert grouping.advantages([0.3, 0.3]) == ([0.0, 0.0], False)


def test_rankers_are_a_registry_that_refuses_a_name_twice():
    assert {"listwise", "rules"} <= set(grouping.RANKERS)
    with pytest.raises(ValueError, match="already registered"):
        grouping.register_ranker("rules")(grouping.RuleRanker)
    with pytest.raises(ValueError, match="unknown ranker"):
        grouping.make_ranker("oracle")


class _SeedEcho(Policy):
    """Answers with the seed it was asked with (a stand-in that shows what a policy receives)."""

    async def generate(self, messages, tools=None, **sampling):
        return Generation(text=str(sampling.get("seed")))


def test_a_policy_without_batching_samples_a_group_one_request_each():
    assert [g.text for g in asyncio.run(_SeedEcho().generate_group(QUERY, n=3, seed=5))] == ["5", "6", "7"]
    assert [g.text for g in asyncio.run(_SeedEcho().generate_group(QUERY, n=2))] == ["None", "None"]


def test_auto_ranks_with_the_judges_llm_else_by_rule():
    from nextstate.train.config import config_from_dict, parse_overrides
    from nextstate.train.proxy.__main__ import make_group_ranker
    url = config_from_dict(parse_overrides(["group.samples=2", "judge.mode=url", "judge.url=http://127.0.0.1:9/v1"]))
    ranker = make_group_ranker(url, policy=None)
    assert isinstance(ranker, grouping.ListwiseRanker) and isinstance(ranker.backend, OpenAIPolicy)
    assert ranker.backend.base_url == "http://127.0.0.1:9/v1"
    rules = config_from_dict(parse_overrides(["group.samples=2", "judge.mode=rules"]))
    assert isinstance(make_group_ranker(rules, policy=None), grouping.RuleRanker)
    assert make_group_ranker(config_from_dict({}), policy=None) is None   # samples 1: no group sampling


@pytest.mark.parametrize("flags, says", [
    (["--samples", "4", "--group-reward", "quality_gate", "--set", "group.weight_relevance=-1"],
     "group.weight_relevance must be a finite number >= 0"),
    (["--samples", "4", "--set", "group.weight_diversity=lots"], "cannot use 'lots' as float"),
    (["--samples", "0"], "group.samples must be at least 1"),
    (["--samples", "2", "--ranker", "listwise", "--judge", "rules"], "--ranker listwise needs an LLM judge"),
])
def test_bad_group_settings_exit_2_with_one_line(tmp_path, capsys, flags, says):
    assert main(["--model", "tiny", "--output", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


# -- served ---------------------------------------------------------------------------------------
def test_best_of_n_with_the_quality_gate_trains_on_the_group(tmp_path):
    """4 candidates in one batch, the rule ranker, the quality-gate reward: the answer is the
    best candidate, and the candidates with a nonzero group advantage train in one PPO step."""
    cfg = Config()
    cfg.train.kl_coef, cfg.train.lr = 0.0, 1e-3
    group = GroupConfig(samples=4, ranker="rules", reward="quality_gate")
    policy = HFPolicy("tiny", max_new_tokens=24)
    trainer = ProxyTrainer(policy, cfg, tmp_path, batch=2, save_every=100)
    proxy = TrainingProxy(policy, tmp_path, trainer=trainer, model_name="tiny", max_tokens=24, group=group,
                          ranker=grouping.RuleRanker())
    with serving(proxy) as url:
        # the tiny model's 4 candidates often get equal rewards (a group with nothing to learn):
        # ask with seeds 0, 1, ... until a group's rewards differ; the equal ones are not offered to train
        for seed in range(16):
            calls = policy.decode_calls
            answer = client(url).chat.completions.create(model="tiny", messages=QUERY, max_tokens=24, seed=seed)
            assert policy.decode_calls == calls + 1   # the 4 candidates: one batch
            wait_for(lambda: len(groups(tmp_path)) > seed and not proxy.pending and not trainer.busy.is_set(),
                     "the group's record and the learner")
            if len(set(groups(tmp_path)[-1]["rewards"])) > 1:
                break
    *flat, g = groups(tmp_path)
    assert len(set(g["rewards"])) > 1, "no seed in 0..15 gave the 4 candidates different rewards"
    assert all(not any(f["advantages"]) for f in flat)
    assert len(g["texts"]) == 4 and g["chosen"] == max(range(4), key=lambda i: (g["rewards"][i], -i))
    assert answer.choices[0].message.content == g["texts"][g["chosen"]]
    assert g["advantages"] == pytest.approx(grouping.advantages(g["rewards"])[0])
    values, _ = grouping.rewards(group, grouping.Ranking(g["scores"]), QUERY, g["texts"])
    assert g["rewards"] == pytest.approx(values)
    trained = [json.loads(x) for x in (tmp_path / "advantages.jsonl").read_text().splitlines()]
    expected = {i: a for i, a in enumerate(g["advantages"]) if a}
    assert {t["candidate"]: t["advantage"] for t in trained} == pytest.approx(expected)
    assert trainer.counts["grouped"] == 4 and trainer.steps == len(expected) // 2
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["group/samples"] == 2


def test_the_listwise_judge_reads_the_query_and_all_candidates(tmp_path):
    """The LLM judge (a scripted OpenAI server stands in for it: no LLM server runs here) sees
    the user's query and the 3 candidates; its scores choose the answer, streamed."""
    with ScriptedOpenAIServer("Candidate 2 answers best. \\boxed{2, 9, 4}") as judge:
        ranker = grouping.ListwiseRanker(OpenAIPolicy(judge.url), max_tokens=64)
        proxy = TrainingProxy(HFPolicy("tiny", max_new_tokens=16), tmp_path, model_name="tiny", max_tokens=16,
                              group=GroupConfig(samples=3), ranker=ranker)
        with serving(proxy) as url:
            stream = client(url).chat.completions.create(model="tiny", messages=QUERY, max_tokens=16, seed=1,
                                                         stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        prompt = judge.requests[0]["messages"][1]["content"]
    [g] = groups(tmp_path)
    assert g["scores"] == pytest.approx([0.2, 0.9, 0.4]) and g["chosen"] == 1 and text == g["texts"][1]
    assert QUERY[0]["content"] in prompt and all(f"### Candidate {i + 1}\n" in prompt for i in range(3))
    assert all(t[:40] in prompt for t in g["texts"])


def test_random_choice_answers_at_once_and_the_tiny_judge_gives_no_scores(tmp_path):
    """``choose=random``: the answer is a random candidate (seeded), the ranking follows in the
    background; the untrained tiny model as the listwise judge writes no score box, which is
    recorded as the group's error, and nothing trains."""
    policy = HFPolicy("tiny", max_new_tokens=16)
    trainer = ProxyTrainer(policy, Config(), tmp_path, batch=1, save_every=100)
    proxy = TrainingProxy(policy, tmp_path, trainer=trainer, model_name="tiny", max_tokens=16, seed=7,
                          group=GroupConfig(samples=4, choose="random"),
                          ranker=grouping.ListwiseRanker(policy, max_tokens=16))
    with serving(proxy) as url:
        answer = client(url).chat.completions.create(model="tiny", messages=QUERY, max_tokens=16, seed=2)
        wait_for(lambda: not proxy.pending, "the ranking")
    [g] = groups(tmp_path)
    assert g["chosen"] == random.Random(7).randrange(4) and answer.choices[0].message.content == g["texts"][g["chosen"]]
    assert g["scores"] is None and "boxed" in g["error"] and len(g["raw"]) == 1
    assert trainer.counts["grouped"] == 0 and trainer.ready == [] and trainer.steps == 0


def test_side_turns_are_not_group_sampled(tmp_path):
    policy = HFPolicy("tiny", max_new_tokens=8)
    proxy = TrainingProxy(policy, tmp_path, model_name="tiny", max_tokens=8, group=GroupConfig(samples=4),
                          ranker=grouping.RuleRanker())
    with serving(proxy) as url:
        client(url).chat.completions.create(model="tiny", messages=QUERY, max_tokens=8,
                                            extra_headers={"X-Turn-Type": "side"})
    assert groups(tmp_path) == [] and proxy.turns["side"] == 1


class _Broken:
    """A ranker that fails (a stand-in for a broken extension)."""

    async def rank(self, *args, **kw):
        raise RuntimeError("no scores today")


def test_a_ranker_that_fails_still_serves_the_first_candidate(tmp_path):
    proxy = TrainingProxy(HFPolicy("tiny", max_new_tokens=8), tmp_path, model_name="tiny", max_tokens=8,
                          group=GroupConfig(samples=2), ranker=_Broken())
    with serving(proxy) as url:
        answer = client(url).chat.completions.create(model="tiny", messages=QUERY, max_tokens=8, seed=4)
    [g] = groups(tmp_path)
    assert g["error"] == "the ranker failed: RuntimeError: no scores today" and g["chosen"] == 0
    assert answer.choices[0].message.content == g["texts"][0]
