"""The proxy's evolving rubric (``--rubric``): the rule baseline and the LLM source (a scripted
OpenAI server stands in for the LLM: none runs here), versions and their bound, pin and reset,
``--resume``, and the real ``tiny`` model served over a real socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from nextstate.agents.hf_policy import HFPolicy
from nextstate.agents.openai_policy import OpenAIPolicy
from nextstate.agents.recorder import Recorder
from nextstate.agents.testing import ScriptedOpenAIServer
from nextstate.judges.prm import StepJudge
from nextstate.train.config import Config
from nextstate.train.proxy import ProxyTrainer, TrainingProxy, serving
from nextstate.train.proxy.__main__ import build, parser
from nextstate.train.proxy.group import ListwiseRanker
from nextstate.train.proxy.rubric import (DETECT_EXAMPLES, LLMPreferences, Rubric, RulePreferences, Version,
                                          load_versions, register_source, with_rubric)
from nextstate.train.proxy.service import JUDGE_TEMPLATES
from nextstate.viewer import RunIndex
from test_proxy import client, wait_for   # tests/ is on the path (pytest's prepend import mode)


def rows(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "rollouts.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_the_rule_baseline_detects_plain_requests_and_misses_the_rest():
    rules = RulePreferences()
    detect = lambda text: asyncio.run(rules.detect(text))[0]   # noqa: E731
    assert detect("Thanks. Please be a bit more humorous!") == "Please be a bit more humorous!"
    assert detect("Make the answers more suitable for elderly readers.") == \
        "Make the answers more suitable for elderly readers."
    assert detect("I'd prefer short answers") == "I'd prefer short answers"
    assert detect("you're too dry") is None and detect("can you liven it up") is None   # what rules miss
    assert detect("list the files in /app") is None
    text, prefs, _ = asyncio.run(rules.merge(Version(1, "- Be detailed.", ["Be detailed."]), ["be detailed", "Be funny."]))
    assert prefs == ["Be detailed.", "Be funny."] and text == "- Be detailed.\n- Be funny."


def test_sources_are_a_registry_that_refuses_a_name_twice():
    with pytest.raises(ValueError, match="already registered"):
        register_source("rules")(RulePreferences)


def _rubric(every: int = 1, **kw) -> tuple[Rubric, list[tuple[str, dict]]]:
    log: list[tuple[str, dict]] = []
    rubric = Rubric(RulePreferences(), every=every, **kw)
    rubric.start(lambda kind, payload: log.append((kind, payload)))
    return rubric, log


def test_versions_their_causes_and_the_bound_on_change():
    rubric, log = _rubric(every=2)
    said = ["Please be more detailed.", "Be less formal, please.", "ok, next file", "Make it more cheerful.",
            "please be more detailed", "Make it more cheerful!", "fine"]
    versions = [asyncio.run(rubric.observe(text, {"session": "s", "group_id": "s", "step": step}))
                for step, text in enumerate(said)]
    # v1 at once; the second waits (1 message since the change < 2) and is merged at the third
    # message; the fourth waits and is merged at the fifth (which, like the sixth, says again what
    # is held: no change of its own)
    assert [v and v.version for v in versions] == [1, None, 2, None, 3, None, None]
    assert [v.preferences for v in rubric.versions] == [
        [], ["Please be more detailed."], ["Please be more detailed.", "Be less formal, please."],
        ["Please be more detailed.", "Be less formal, please.", "Make it more cheerful."]]
    assert rubric.versions[1].cause == {"session": "s", "group_id": "s", "step": 0, "message": said[0]}
    assert rubric.versions[2].cause["step"] == 1 and rubric.versions[3].cause["step"] == 3
    prefs = [p for k, p in log if k == "preference"]
    assert [(p["step"], p["applied"], p["why"]) for p in prefs] == [
        (0, True, None), (1, True, None), (2, False, "no preference stated"), (3, True, None),
        (4, False, "the rubric already holds it"), (5, False, "the rubric already holds it"),
        (6, False, "no preference stated")]


def test_pin_records_preferences_and_changes_nothing_and_reset_starts_over():
    rubric, log = _rubric(pinned=True)
    asyncio.run(rubric.observe("Please be more humorous.", {"session": "s", "step": 0}))
    assert rubric.current.version == 0
    [(_, pref)] = [x for x in log if x[0] == "preference"]   # one message, one check
    assert pref["applied"] is False and pref["why"] == "pinned by the operator"
    resumed = Rubric(RulePreferences(), versions=[Version(0), Version(1, "- Be funny.", ["Be funny."], "rules")],
                     reset=True)
    resumed.start(lambda *_: None)
    assert (resumed.current.version, resumed.current.preferences, resumed.current.by) == (2, [], "operator reset")


def test_the_llm_source_detects_in_any_words_and_merges_into_one_rubric():
    """The LLM (scripted) calls "you're too dry" a preference, then rewrites the rubric with the
    earlier one; a merge answer without a [RUBRIC] block falls back to the rule merge."""
    def script(req: dict) -> str:
        prompt = req["messages"][-1]["content"]
        if prompt.startswith("Current rubric:"):
            return "[RUBRIC]Detailed answers for elderly readers, with light humour.[/RUBRIC]"
        return "[PREFERENCE]Be livelier and more humorous.[/PREFERENCE]" if "too dry" in prompt else "NONE"

    with ScriptedOpenAIServer(script) as llm:
        source = LLMPreferences(OpenAIPolicy(llm.url))
        rubric = Rubric(source, versions=[Version(0), Version(1, "Detailed, for elderly readers.",
                                                               ["Be detailed for elderly readers."], "LLMPreferences")])
        rubric.start(lambda *_: None)
        assert asyncio.run(rubric.observe("the tests pass now", {"step": 0})) is None
        v = asyncio.run(rubric.observe("hmm, you're too dry", {"step": 1}))
        merge_prompt = llm.requests[-1]["messages"][-1]["content"]
    assert v.text == "Detailed answers for elderly readers, with light humour." and v.error is None
    assert v.preferences == ["Be detailed for elderly readers.", "Be livelier and more humorous."]
    assert merge_prompt == "Current rubric: Detailed, for elderly readers.\nNew preferences: Be livelier and more humorous."
    assert llm.requests[0]["messages"][0]["content"].startswith("You read one message")   # few-shot: system, examples
    assert len(llm.requests[0]["messages"]) == 2 + 2 * len(DETECT_EXAMPLES)
    with ScriptedOpenAIServer("no idea") as llm:
        text, prefs, detail = asyncio.run(LLMPreferences(OpenAIPolicy(llm.url)).merge(Version(0), ["Be brief."]))
    assert (text, prefs) == ("- Be brief.", ["Be brief."]) and "rule merge" in detail["error"]


def test_the_judges_read_the_current_rubric():
    v = Version(3, "- Be funny.", ["Be funny."], "rules")
    assert with_rubric("fix the bug", Version(0)) == "fix the bug"
    assert with_rubric("fix the bug", v).endswith("(rubric v3): judge against them too\n- Be funny.")
    system = ListwiseRanker(None).messages([{"role": "user", "content": "hi"}], ["a", "b"], v.text)[0]["content"]
    assert system.endswith("score against them too:\n- Be funny.")


def test_turns_judged_after_a_change_are_judged_by_the_new_version(tmp_path):
    """A session over HTTP: the user states a preference after turn 0; turn 0 is judged by v0
    (its judging starts first), turn 1 by v1, whose text the LLM judge's prompt holds (the judge:
    a scripted server); the training step's metrics name both versions."""
    cfg = Config()
    cfg.train.kl_coef = 0.0
    policy = HFPolicy("tiny", max_new_tokens=8)
    with ScriptedOpenAIServer("fine \\boxed{1}") as judge_server:
        judge = StepJudge(OpenAIPolicy(judge_server.url), templates=JUDGE_TEMPLATES)
        trainer = ProxyTrainer(policy, cfg, tmp_path, batch=2, save_every=100)
        proxy = TrainingProxy(policy, tmp_path, judge=judge, trainer=trainer, model_name="tiny", max_tokens=8,
                              rubric=Rubric(RulePreferences()))
        with serving(proxy) as url:
            c = client(url)
            msgs = [{"role": "user", "content": "list the files"}]
            for said in ("Please be a bit more humorous.", "thanks, next", None):
                answer = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8,
                                                   extra_headers={"X-Session-Id": "u"})
                if said is None:
                    break
                msgs += [answer.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": said}]
                if said.startswith("thanks"):   # turn 1's request carried the preference: v1 judges turn 1
                    wait_for(lambda: proxy.rubric.current.version == 1, "the rubric's change")
            wait_for(lambda: not proxy.pending and trainer.steps == 1 and not trainer.busy.is_set(), "the step")
            # the two judgings run concurrently, so their requests may reach the server in either order
            prompts = {"Step 1:" in p: p for p in (r["messages"][-1]["content"] for r in judge_server.requests)}
            health = httpx.get(url.removesuffix("/v1") + "/health").json()
    assert {r["step"]: r["rubric_version"] for r in rows(tmp_path, "judge")} == {0: 0, 1: 1}
    assert len(judge_server.requests) == 2 and set(prompts) == {False, True}
    assert "(rubric v" not in prompts[False] and "(rubric v1): judge against them too\n- Please be a bit more humorous." in prompts[True]
    [v1] = [r for r in rows(tmp_path, "rubric") if r["version"] == 1]
    assert v1["cause"]["message"] == "Please be a bit more humorous." and v1["cause"]["step"] == 1
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["rubric/versions"] == [0, 1] and health["rubric_version"] == 1


def test_resume_keeps_the_rubric_and_the_weights_and_reset_starts_over(tmp_path):
    """A proxy run writes rubric versions and a checkpoint; ``--resume`` goes on from both;
    ``--rubric-reset`` adds a version without preferences."""
    cfg = Config()
    cfg.train.kl_coef, cfg.train.lr = 0.0, 1e-3
    policy = HFPolicy("tiny", max_new_tokens=8)
    trainer = ProxyTrainer(policy, cfg, tmp_path, batch=1, save_every=1)
    rubric = Rubric(RulePreferences())
    proxy = TrainingProxy(policy, tmp_path, judge=None, trainer=trainer, model_name="tiny", max_tokens=8, rubric=rubric)
    with serving(proxy) as url:
        msgs = [{"role": "user", "content": "Please make the answers more cheerful. List the files."}]
        client(url).chat.completions.create(model="tiny", messages=msgs, max_tokens=8, extra_headers={"X-Session-Id": "r"})
        wait_for(lambda: rubric.current.version == 1, "the rubric's change")
        assert httpx.post(f"{url}/sessions/r/outcome", json={"outcome": 1.0}).status_code == 200
        wait_for(lambda: trainer.steps == 1 and not trainer.busy.is_set(), "a training step")
    trained = [p.detach().clone() for p in policy.model.parameters()]
    assert [v.version for v in load_versions(tmp_path / "rollouts.jsonl")] == [0, 1]
    index = RunIndex(tmp_path)   # the viewer lists the versions and what caused them
    index.refresh()
    assert [(v["version"], (v["cause"] or {}).get("message")) for v in index.overview()["rubric"]] == \
        [(0, None), (1, msgs[0]["content"])]
    base = ["--model", "tiny", "--output", str(tmp_path), "--rubric", "rules", "--judge", "none", "--resume"]
    again = build(parser().parse_args(base))
    try:
        assert again.rubric.current.version == 1 and again.rubric.current.preferences == rubric.current.preferences
        assert again.trainer.steps == 1 and again.policy.version == 1
        assert all(a.equal(b) for a, b in zip(trained, again.policy.model.parameters()))
    finally:
        asyncio.run(again.close())
    reset = build(parser().parse_args(base + ["--rubric-reset", "--no-train"]))
    asyncio.run(reset.close())
    assert [(v.version, v.by) for v in load_versions(tmp_path / "rollouts.jsonl")][-1] == (2, "operator reset")
