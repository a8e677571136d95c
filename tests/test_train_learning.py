"""The real loss path moves the tiny model the way the advantage says, and the loss is veRL's."""

import copy

import pytest
import torch
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty

from nextstate.agents.hf_policy import HFPolicy
from nextstate.agents.trajectory import Step, Trajectory
from nextstate.train.batch import Batch, Sample, build_batch, collate, micro_batches, pack
from nextstate.train.config import load_config
from nextstate.train.learner import Learner
from nextstate.train.loss import actor_config, actor_loss, token_log_probs

MESSAGES = [{"role": "user", "content": "list the files"}]


@pytest.fixture(scope="module")
def generation():
    policy = HFPolicy("tiny", seed=0)
    return policy.generate_sync(MESSAGES, max_tokens=16, temperature=1.0, seed=1)


def _cfg(**over):
    return load_config("terminal", cpu_demo=True,
                       overrides=["train.lr=1e-3", *[f"{k}={v}" for k, v in over.items()]])


def _logprob(learner, sample):
    with torch.no_grad():
        return token_log_probs(learner.model, collate([sample], learner.pad_id), 1.0)[0].sum().item()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_updates_raise_or_lower_the_logprob_of_a_fixed_response(generation, sign):
    policy = HFPolicy("tiny", seed=0)
    learner = Learner(policy, _cfg())
    sample = Sample(generation.prompt_ids, generation.response_ids, generation.logprobs, sign, sign)
    before = _logprob(learner, sample)
    assert before == pytest.approx(sum(generation.logprobs), abs=1e-3)   # pi_old as recorded at rollout
    for _ in range(4):
        metrics = learner.step(Batch([sample]), progress=False)
    after = _logprob(learner, sample)
    assert (after - before) * sign > 0.5
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    # the serving model only changes when the learner publishes
    served = token_log_probs(policy.model, collate([sample], learner.pad_id), 1.0)[0].sum().item()
    assert served == pytest.approx(before, abs=1e-4)
    learner.publish()
    served = token_log_probs(policy.model, collate([sample], learner.pad_id), 1.0)[0].sum().item()
    assert served == pytest.approx(after, abs=1e-4)


def test_a_non_finite_gradient_skips_the_update_and_says_so(generation):
    learner = Learner(HFPolicy("tiny", seed=0), _cfg())
    sample = Sample(generation.prompt_ids, generation.response_ids, generation.logprobs, 1.0, 1.0)
    metrics = learner.step(Batch([sample]), progress=False)
    assert metrics["train/skipped_nonfinite"] == 0.0
    with torch.no_grad():
        next(learner.model.parameters()).view(-1)[0] = float("nan")   # poisons every gradient
    before = [p.detach().clone() for p in learner.model.parameters()]
    metrics = learner.step(Batch([sample]), progress=False)
    assert metrics["train/skipped_nonfinite"] == 1.0
    assert all(torch.equal(a, b) or torch.isnan(a).any() for a, b in zip(before, learner.model.parameters()))


@pytest.mark.parametrize("updates", [1, 3])
def test_a_step_makes_updates_per_step_optimizer_updates(generation, updates):
    learner = Learner(HFPolicy("tiny", seed=0), _cfg(**{"train.updates_per_step": updates}))
    sample = Sample(generation.prompt_ids, generation.response_ids, generation.logprobs, 1.0, 1.0)
    metrics = learner.step(Batch([sample] * 4), progress=False)
    adam_steps = {float(state["step"]) for state in learner.optimizer.state.values()}
    assert adam_steps == {float(updates)} and metrics["train/updates"] == updates


def test_actor_loss_is_verls_vanilla_loss_plus_low_var_kl(generation):
    cfg = _cfg()
    actor = actor_config(cfg.train, 2)
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.kl_loss_coef) == (0.2, 0.28, 0.01)
    a = Sample(generation.prompt_ids, generation.response_ids, generation.logprobs, 1.0, 1.0)
    b = Sample(generation.prompt_ids, generation.response_ids[:5], [x - 0.3 for x in generation.logprobs[:5]],
               -0.5, 0.0)
    mb = collate([a, b], 258)
    torch.manual_seed(0)
    log_prob = mb.old_log_probs + 0.1 * torch.randn_like(mb.old_log_probs)
    ref = mb.old_log_probs - 0.05
    tokens = int(mb.response_mask.sum())
    loss, metrics = actor_loss(actor, log_prob, mb, ref_log_prob=ref, entropy=None, batch_num_tokens=tokens,
                               global_batch_size=2)
    mask = mb.response_mask.bool()
    cfg2 = copy.deepcopy(actor)
    cfg2.global_batch_info.update(dp_size=1, batch_num_tokens=tokens, global_batch_size=2)
    pg, _ = get_policy_loss_fn("vanilla")(old_log_prob=mb.old_log_probs, log_prob=log_prob, advantages=mb.advantages,
                                          response_mask=mask, loss_agg_mode="token-mean", config=cfg2)
    kl = agg_loss(loss_mat=kl_penalty(log_prob, ref, "low_var_kl"), loss_mask=mask, loss_agg_mode="token-mean",
                  batch_num_tokens=tokens)
    assert loss.item() == pytest.approx(pg.item() + 0.01 * kl.item(), rel=1e-6)
    assert 0 <= metrics["clip_frac"] <= 1 and metrics["kl"] > 0


def test_micro_batches_accumulate_to_the_same_gradient(generation):
    samples = [Sample(generation.prompt_ids, generation.response_ids[:k], generation.logprobs[:k], adv, adv)
               for k, adv in [(16, 1.0), (7, -1.0), (11, 0.5), (3, -0.2)]]
    grads = []
    for size in (1, 4):
        learner = Learner(HFPolicy("tiny", seed=0), _cfg(**{"train.micro_batch_size": size}))
        learner.optimizer.step = lambda: None          # keep the weights: compare the gradients only
        learner.step(Batch(samples), progress=False)
        grads.append(torch.cat([p.grad.flatten() for p in learner.model.parameters() if p.grad is not None]))
    assert len(micro_batches(samples, 1, 258)) == 4
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def _episode(generation):
    """Three steps of one episode, each prompt holding the last turn verbatim (+ an observation),
    a step of the same episode whose prompt is not (a truncated context), and another episode."""
    p1, r = generation.prompt_ids, generation.response_ids
    lp = generation.logprobs
    obs = p1[-6:]
    p2 = p1 + r[:6] + obs
    p3 = p2 + r[6:12] + obs
    return [Sample(p1, r[:6], lp[:6], 1.0, 1.0, episode=0),
            Sample(p2, r[6:12], [x - 0.2 for x in lp[6:12]], -0.5, 0.0, episode=0,
                   token_advantages=[0.3, -0.1, 0.0, 0.2, -0.4, 0.1]),
            Sample(p3, r[12:16], lp[12:16], 0.7, 0.0, episode=0),
            Sample(p1[3:], r[:5], lp[:5], 0.4, 0.0, episode=0),
            Sample(p1, r[2:9], lp[2:9], -1.0, 0.0, episode=1)]


def test_packing_an_episode_gives_the_per_step_gradient(generation):
    samples = _episode(generation)
    rows = pack(samples)
    assert len(rows) == 3 and sum(s.num_tokens for s in rows) == sum(s.num_tokens for s in samples)
    packed = next(s for s in rows if s.mask is not None)
    assert packed.prompt_ids == samples[0].prompt_ids and sum(packed.mask) == 16
    grads = []
    for on in (False, True):
        learner = Learner(HFPolicy("tiny", seed=0), _cfg(**{"train.pack": on, "train.micro_batch_size": 2}))
        learner.optimizer.step = lambda: None          # keep the weights: compare the gradients only
        metrics = learner.step(Batch([copy.copy(s) for s in samples]), progress=False)
        assert metrics["train/rows"] == (3 if on else 5)
        grads.append(torch.cat([p.grad.flatten() for p in learner.model.parameters() if p.grad is not None]))
    assert grads[0].abs().max() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_packing_refuses_a_loss_mode_it_would_change():
    with pytest.raises(ValueError, match="train.pack=false"):
        _cfg(**{"train.loss_agg_mode": "seq-mean-token-mean"})
    assert not _cfg(**{"train.loss_agg_mode": "seq-mean-token-mean", "train.pack": "false"}).train.pack


def _traj(group, sample, outcome, votes, status="finished", role="agent"):
    steps = [Step(role=role, index=i, prompt_ids=[1, 2, 3], response_ids=[4, 5], logprobs=[-1.0, -1.0],
                  text="x", action=None, next_state={"valid": True}, observation=f"obs{i}", votes=[1],
                  vote_mean=v) for i, v in enumerate(votes)]
    return Trajectory(task_id=group, group_id=group, sample=sample, family="terminal", steps=steps,
                      outcome=outcome, status=status)


def test_build_batch_excludes_aborted_episodes_and_other_roles():
    cfg = _cfg(**{"advantage.drop_constant": "true"})
    trajs = [_traj("g", 0, 1.0, [1.0, 0.0]), _traj("g", 1, 0.0, [0.0, None]),
             _traj("g", 2, None, [1.0, 1.0, 1.0], status="aborted"), _traj("g", 3, 1.0, [1.0], role="planner")]
    batch = build_batch(trajs, cfg.advantage, weight=1.0, role="agent")
    m = batch.metrics
    assert m["aborted"] == 1 and m["episodes"] == 4
    # rows in episode order; buckets (g,0): R=[2, 0], (g,1): R=[1, 0]; no planner or aborted steps
    assert [s.advantage for s in batch.samples] == pytest.approx([1, 1, -1, -1], abs=1e-5)
    assert m["batch/samples"] == 4 and m["batch/dropped_samples"] == 0 and m["batch/untrainable_steps"] == 1
    assert m["outcome/mean"] == pytest.approx(2 / 3)


def test_build_batch_trajectory_key_centres_votes_per_episode():
    cfg = _cfg(**{"advantage.key": "trajectory"})
    trajs = [_traj("g", 0, 1.0, [1.0, 0.0, None]), _traj("g", 1, 0.0, [0.5])]
    batch = build_batch(trajs, cfg.advantage, weight=1.0, role="agent")
    h = 0.5 / (0.5 + 1e-6)   # outcomes [1, 0], one per episode
    assert [s.advantage for s in batch.samples] == pytest.approx([h + 0.5, h - 0.5, h, -h], abs=1e-6)
