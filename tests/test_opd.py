"""On-Policy Distillation against hand-computed vectors: hint selection, the teacher context, the
per-token advantage (the same vectors through the local backend's batch and learner and through
the veRL backend's advantage function), and the teacher's forward pass in the learner."""

import asyncio
from pathlib import Path

import pytest
import torch

from nextstate.agents.hf_policy import HFPolicy
from nextstate.agents.testing import ScriptedOpenAIServer
from nextstate.agents.trajectory import Step, Trajectory
from nextstate.judges.hints import HINT_HEADER, HintJudge, select_hint, teacher_messages
from nextstate.judges.prm import JudgeRequest
from nextstate.judges.rules import RuleHints, rule_hint
from nextstate.train.advantage import token_advantages
from nextstate.train.batch import Sample, build_batch, collate
from nextstate.train.config import load_config
from nextstate.train.learner import Learner
from nextstate.train.loss import token_log_probs

FAILED = {"valid": True, "exit_code": 1,
          "output": "bash: line 4: /app/out/answer: No such file or directory\n[exit code 1]"}


def test_token_advantage_by_hand():
    # A_t = w_opd * (log pi_teacher - log pi_old) + w_rl * A_rl, with w_opd 2 and w_rl * A_rl = 0.3
    got = token_advantages([-0.5, -1.0, -2.0], [-1.0, -1.0, -1.5], 0.3, 2.0)
    assert got == pytest.approx([2 * 0.5 + 0.3, 0.0 + 0.3, 2 * -0.5 + 0.3])   # [1.3, 0.3, -0.7]


def test_hint_selection_keeps_plus_one_votes_over_ten_characters_and_takes_the_longest():
    votes = [1, -1, 1, 1, None, 1]
    hints = ["0123456789",                                     # 10 characters: too short
             "a much longer hint, but from a -1 vote",         # not a +1 vote
             "Run mkdir -p /app/out first.",                   # 28 characters
             "Create /app/out before you write.",              # 33 characters: the longest kept
             "an unparsed vote's hint is never kept either",
             None]
    assert select_hint(votes, hints) == "Create /app/out before you write."
    assert select_hint([-1, -1], ["a long enough hint here", "another long enough hint"]) is None
    assert select_hint([1], ["   padded    "]) is None   # 6 characters once stripped


def test_teacher_context_appends_the_hint_to_the_last_user_or_tool_turn():
    messages = [{"role": "user", "content": "Read /app/note, then write the word it holds to /app/out/answer."},
                {"role": "assistant", "content": "<tool_call>cat</tool_call>"},
                {"role": "tool", "content": "red\n[exit code 0]", "tool_call_id": "call_0"}]
    hinted = teacher_messages(messages, " mkdir /app/out first ")
    assert hinted[:2] == messages[:2]
    assert hinted[2]["content"] == f"red\n[exit code 0]\n\n{HINT_HEADER}\nmkdir /app/out first"
    assert messages[2]["content"] == "red\n[exit code 0]"          # the step's own prompt is unchanged
    first = teacher_messages(messages[:1], "read the note")          # step 0: the task is the last user turn
    assert first[0]["content"].endswith(f"/app/out/answer.\n\n{HINT_HEADER}\nread the note")
    parts = teacher_messages([{"role": "user", "content": [{"type": "text", "text": "look"}]}], "the hint")
    assert parts[0]["content"][-1] == {"type": "text", "text": f"\n\n{HINT_HEADER}\nthe hint"}
    assert teacher_messages([{"role": "system", "content": "s"}], "the hint")[-1] == \
        {"role": "user", "content": f"{HINT_HEADER}\nthe hint"}


def test_rule_hints_read_only_the_next_state():
    req = JudgeRequest("terminal", "task", [], {"name": "bash", "arguments": {"command": "echo red > /app/out/answer"}},
                       FAILED)
    result = asyncio.run(RuleHints().judge(req))
    assert result.votes == [1] and result.hint == "bash: line 4: /app/out/answer: No such file or directory"
    ok = asyncio.run(RuleHints().judge(JudgeRequest("terminal", "task", [], None,
                                                    {"valid": True, "exit_code": 0, "output": "red"})))
    assert ok.votes == [-1] and ok.hint is None
    assert rule_hint({"valid": False, "error": "The tool call is not valid JSON"}) == \
        "The action was rejected: The tool call is not valid JSON"
    assert rule_hint({"valid": True, "exit_code": 2, "output": "[exit code 2]"}) == "The command exited with 2."


async def test_llm_hint_judge_through_a_server_selects_by_vote():
    answers = ["[HINT_START]Create /app/out with mkdir -p before writing.[HINT_END] \\boxed{1}",
               "[HINT_START]A longer hint that voted minus one, so it is dropped.[HINT_END] \\boxed{-1}",
               "[HINT_START]mkdir it.[HINT_END] \\boxed{1}"]
    with ScriptedOpenAIServer(lambda req: answers) as s:
        from nextstate.agents.openai_policy import OpenAIPolicy
        judge = HintJudge(OpenAIPolicy(s.url, model="j"), m=3)
        result = await judge.judge(JudgeRequest("terminal", "write the word", [], {"name": "bash"}, FAILED))
        prompt = judge.messages(JudgeRequest("terminal", "write the word", [], {"name": "bash"}, FAILED))
    assert result.votes == [1, -1, 1]
    assert result.hint == "Create /app/out with mkdir -p before writing."
    assert "[HINT_START]" in prompt[1]["content"] and "No such file or directory" in prompt[1]["content"]


def _step(index, hinted, prompt=(1, 2, 3)):
    return Step(role="agent", index=index, prompt_ids=list(prompt), response_ids=[4, 5], logprobs=[-1.0, -2.0],
                text="x", action=None, next_state={"valid": True}, observation=f"obs{index}",
                teacher_prompt_ids=[1, 2, 9, 3] if hinted else None)


def _batch(mode, **over):
    cfg = load_config("terminal", cpu_demo=True, overrides=[f"opd.mode={mode}", "advantage.key=outcome",
                                                             *[f"{k}={v}" for k, v in over.items()]])
    trajs = [Trajectory("t", "g", 0, "terminal", [_step(0, False), _step(1, True)], outcome=1.0),
             Trajectory("t", "g", 1, "terminal", [_step(0, False), _step(1, False)], outcome=-1.0)]
    return build_batch(trajs, cfg.advantage, weight=1.0, role="agent", opd=cfg.opd), cfg


def test_modes_choose_the_samples_and_their_rl_part():
    rl, _ = _batch("rl")      # outcome GRPO in group g: A = +1 for o=1, -1 for o=-1 (population std 1)
    assert [s.advantage for s in rl.samples] == pytest.approx([1, 1, -1, -1], abs=1e-5)
    assert all(s.teacher_prompt_ids is None for s in rl.samples)
    opd, _ = _batch("opd")    # w_rl = 0: only the hinted step trains, with no RL part
    assert len(opd.samples) == 1 and opd.samples[0].advantage == 0.0
    assert opd.samples[0].teacher_prompt_ids == [1, 2, 9, 3] and opd.weight_opd == 1.0
    both, _ = _batch("combine", **{"opd.weight_rl": 0.5, "opd.weight_opd": 2.0})
    assert [s.advantage for s in both.samples] == pytest.approx([0.5, 0.5, -0.5, -0.5], abs=1e-5)
    assert [s.teacher_prompt_ids is not None for s in both.samples] == [False, True, False, False]
    assert both.weight_opd == 2.0 and both.metrics["opd/hinted_samples"] == 1


# the hinted step's teacher log-probs and, per mode, every sample's A_t by hand: old log-probs
# [-1, -2] on every step, outcome GRPO in group g (A = +1, +1, -1, -1), w_opd 2
HAND_TEACHER = [-0.5, -1.0]                      # gap to the old log-probs: [0.5, 1.0]
HAND = {"rl": ({}, [[1, 1], [1, 1], [-1, -1], [-1, -1]]),
        "opd": ({"opd.weight_opd": 2.0},            # w_rl 0: only the hinted step, 2 * gap
                [None, [1.0, 2.0], None, None]),
        "combine": ({"opd.weight_rl": 0.5, "opd.weight_opd": 2.0},   # 2 * gap + 0.5 * A on the hinted step
                    [[0.5, 0.5], [1.5, 2.5], [-0.5, -0.5], [-0.5, -0.5]])}


def _local_token_advantages(batch):
    """What the local learner trains each sample with, the teacher giving HAND_TEACHER (as
    :meth:`Learner.score_teacher` calls the shared formula)."""
    return [token_advantages(HAND_TEACHER, s.old_log_probs, s.advantage, batch.weight_opd).tolist()
            if s.teacher_prompt_ids else [s.advantage] * len(s.response_ids) for s in batch.samples]


def _verl_token_advantages(cfg, teacher_log_probs):
    """The same four steps as veRL rows through the veRL backend's step_advantages: the trained
    rows' token advantages (None for a row whose mask it zeroed)."""
    pytest.importorskip("verl.protocol", reason="veRL is not installed")
    import numpy as np
    from tensordict import TensorDict
    from verl.protocol import DataProto

    from nextstate.train.advantage import rl_weight
    from nextstate.train.verl_backend import advantage as vadv

    n = 4
    nt = {"uid": np.array(["g"] * n, dtype=object), vadv.FIELD_STEP: np.array([0, 1, 0, 1], dtype=object),
          vadv.FIELD_OUTCOME: np.array([1.0, 1.0, -1.0, -1.0], dtype=object),
          vadv.FIELD_VOTE_MEAN: np.array([float("nan")] * n, dtype=object),
          vadv.FIELD_STATE: np.array([0] * n, dtype=object),
          vadv.FIELD_EPISODE: np.array(["g/0", "g/0", "g/1", "g/1"], dtype=object)}
    data = DataProto(batch=TensorDict({"response_mask": torch.ones((n, 2), dtype=torch.int64)}, batch_size=n),
                     non_tensor_batch=nt)
    teacher = None
    if cfg.opd.mode != "rl":
        log_probs = torch.zeros((n, 2))
        log_probs[1] = torch.tensor(teacher_log_probs)
        teacher = vadv.TeacherScores(hinted=np.array([False, True, False, False]), log_probs=log_probs,
                                     old_log_probs=torch.tensor([[-1.0, -2.0]] * n), weight_opd=cfg.opd.weight_opd)
    data, metrics = vadv.step_advantages(data, key="outcome", drop_constant=cfg.advantage.drop_constant,
                                         weight_rl=rl_weight(cfg.opd), teacher=teacher)
    mask = data.batch["response_mask"]
    rows = [adv.tolist() if m.any() else None for adv, m in zip(data.batch["advantages"], mask)]
    return rows, metrics


@pytest.mark.parametrize("mode", list(HAND))
def test_both_backends_give_the_hand_computed_token_advantages(mode):
    over, expected = HAND[mode]
    batch, cfg = _batch(mode, **over)
    local = _local_token_advantages(batch)
    assert len(local) == sum(e is not None for e in expected)
    for got, want in zip(local, [e for e in expected if e is not None]):
        assert got == pytest.approx(want, abs=1e-5)
    verl, metrics = _verl_token_advantages(cfg, HAND_TEACHER)
    assert len(verl) == len(expected)
    for got, want in zip(verl, expected):
        assert (got is None) == (want is None)
        if want is not None:
            assert got == pytest.approx(want, abs=1e-5)
    if mode != "rl":
        assert metrics["opd/hinted_samples"] == batch.metrics["opd/hinted_samples"] == 1
        assert metrics["opd/teacher_gap_mean"] == pytest.approx(0.75)
    assert metrics["nextstate/samples"] == len(batch.samples)


def test_the_learner_scores_the_response_in_the_teacher_context():
    policy = HFPolicy("tiny", seed=0)
    batch, cfg = _batch("combine", **{"opd.weight_rl": 0.5, "opd.weight_opd": 2.0, "train.kl_coef": 0})
    learner = Learner(policy, cfg)
    scored = learner.score_teacher(batch)
    hinted = batch.samples[1]
    # the teacher (a frozen copy of the starting model) on prompt [1, 2, 9, 3] + response [4, 5]
    with torch.no_grad():
        logits = learner.teacher(input_ids=torch.tensor([[1, 2, 9, 3, 4, 5]])).logits[0] / cfg.rollout.temperature
        lp = torch.log_softmax(logits, -1)
        teacher = [lp[3, 4].item(), lp[4, 5].item()]
    expected = [2.0 * (teacher[0] + 1.0) + 0.5, 2.0 * (teacher[1] + 2.0) + 0.5]
    assert hinted.token_advantages == pytest.approx(expected, abs=1e-5)
    assert all(s.token_advantages is None for s in batch.samples if s is not hinted)
    assert scored["opd/scored_samples"] == 1.0
    mb = collate(batch.samples, learner.pad_id)   # per-token advantages reach the loss's tensor
    assert mb.advantages[1].tolist() == pytest.approx(expected, abs=1e-5)
    assert mb.advantages[0].tolist() == pytest.approx([0.5, 0.5], abs=1e-5)
    # the same scores by the project's own log-prob code
    own = token_log_probs(learner.teacher, collate([Sample([1, 2, 9, 3], [4, 5], [0, 0], 0, 0)], 0),
                          cfg.rollout.temperature)[0][0].tolist()
    assert own == pytest.approx(teacher, abs=1e-5)
    # the veRL backend's function, given the same teacher log-probs, trains the same vectors
    verl, _ = _verl_token_advantages(cfg, teacher)
    assert verl[1] == pytest.approx(expected, abs=1e-5) and verl[0] == pytest.approx([0.5, 0.5], abs=1e-5)
    metrics = learner.step(batch, progress=False)
    assert metrics["train/skipped_nonfinite"] == 0.0 and "opd/teacher_gap_mean" in metrics


@pytest.mark.docker
async def test_an_outdir_episode_gets_its_failure_as_hint_and_a_teacher_context(terminal_image):
    """A scripted agent that writes before it creates /app/out: the write fails visibly, the rule
    source turns the error's last line into that step's hint, and the step's teacher context is
    its own prompt with the hint on the last turn; the recovery then passes the task."""
    import json

    from nextstate.agents.testing import ScriptedPolicy
    from nextstate.envs.pool import SandboxPool
    from nextstate.envs.terminal import TerminalEnv
    from nextstate.train.rollout import collect

    def call(command: str) -> str:
        return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"

    policy = ScriptedPolicy([call("cat /app/note"), call("echo red > /app/out/answer"),
                             call("mkdir -p /app/out"), call("echo red > /app/out/answer")])
    with SandboxPool(terminal_image, size=1) as pool:
        env = TerminalEnv("outdir:0:1", pool=pool, max_steps=4)
        seen: list[list[dict]] = []
        script = policy.script
        policy.script = lambda messages: seen.append(messages) or script[min(len(seen) - 1, 3)]
        [traj] = await collect(lambda: env, policy, env.tasks, hinter=RuleHints(), progress=False)
    assert traj.status == "truncated" and traj.outcome == 1.0   # graded at the step limit: recovered
    assert [s.next_state["exit_code"] for s in traj.steps] == [0, 1, 0, 0]
    assert [s.hint is not None for s in traj.steps] == [False, True, False, False]
    failed = traj.steps[1]
    assert failed.hint.endswith("/app/out/answer: No such file or directory")
    assert failed.teacher_prompt_ids == policy.prompt_ids(teacher_messages(seen[1], failed.hint), env.tools)
    assert failed.prompt_ids == policy.prompt_ids(seen[1], env.tools)
    text = policy.tokenizer.decode(failed.teacher_prompt_ids)
    assert f"red\n[exit code 0]\n\n{HINT_HEADER}\n{failed.hint}" in text
    assert all(s.teacher_prompt_ids is None for s in traj.steps if s is not failed)


def test_opd_settings_are_checked():
    from nextstate.train.config import ConfigError

    assert load_config("terminal").opd.mode == "rl"   # the default trains as before
    for bad in ("opd.mode=distil", "opd.hint_source=oracle", "opd.teacher=gpt"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config("terminal", overrides=[bad])


def test_shuffled_votes_keep_the_votes_but_move_them():
    cfg = load_config("terminal", cpu_demo=True, overrides=["advantage.shuffle_votes=true"])
    votes = [1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0]
    trajs = [Trajectory("t", "g", i, "terminal", [Step(role="agent", index=0, prompt_ids=[1], response_ids=[2],
                                                       logprobs=[-1.0], text="x", action=None, next_state={},
                                                       observation="o", vote_mean=v)], outcome=0.0)
             for i, v in enumerate(votes)]
    rewards = [row["reward"] for row in build_batch(trajs, cfg.advantage, weight=1.0, role="agent", seed=3).step_log]
    assert sorted(rewards) == sorted(votes) and rewards != votes   # R_t = 0 + vote, permuted
    again = [row["reward"] for row in build_batch(trajs, cfg.advantage, weight=1.0, role="agent", seed=3).step_log]
    assert again == rewards


def test_bench_summaries_by_hand():
    from bench.learning import ci95, steps_to
    assert ci95([0.5, 0.6, 0.7]) == pytest.approx([0.6 - 4.303 * 0.1 / 3 ** 0.5, 0.6 + 4.303 * 0.1 / 3 ** 0.5], abs=1e-4)
    runs = [{"curve": [(0, 0.5), (5, 0.7), (10, 0.9)]}, {"curve": [(0, 0.5), (5, 0.9), (10, 0.8)]}]
    assert steps_to(runs) == 5 and steps_to(runs, 0.95) is None


def test_every_bench_run_starts_from_the_shared_warm_start(tmp_path: Path) -> None:
    """The model's protocol names the base model and its SFT; a run must not redo it with its own seed."""
    from bench.learning import MODELS, run_config

    cfg = run_config("outdir", "combine", 3, 4, tmp_path, [*MODELS["smollm2"], "train.lr=2e-5"], 16)
    assert cfg.model.name == str(tmp_path) and cfg.sft.steps == 0 and cfg.run.seed == 3
    assert cfg.train.lr == 2e-5 and cfg.opd.mode == "combine" and cfg.eval.tasks.endswith(":16")


def test_the_llm_sourced_variants_ask_the_model_itself_with_a_timeout_it_can_meet(tmp_path: Path) -> None:
    from bench.learning import MODELS, run_config

    judged = run_config("outdir", "step_index_llm", 0, 4, tmp_path, list(MODELS["smollm2"]), 16)
    hinted = run_config("outdir", "opd_llm", 0, 4, tmp_path, list(MODELS["smollm2"]), 16)
    assert (judged.judge.mode, judged.advantage.key, judged.opd.mode) == ("policy", "step_index", "rl")
    assert (hinted.judge.mode, hinted.opd.mode, hinted.opd.hint_source) == ("none", "opd", "judge")
    assert judged.judge.timeout == hinted.judge.timeout == 3600 and judged.judge.max_tokens == 160
