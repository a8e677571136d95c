"""Step rewards and bucket normalization against hand-computed vectors."""

import math

import numpy as np
import pytest

from nextstate.train.advantage import (EPS, GROUPINGS, StepRows, advantage_keys, bucket_codes, compute_advantages,
                                      register_estimator, register_grouping, step_rewards)

NAN = float("nan")

# Two task groups. Group g1 has steps 0..2 (the third step only in one episode),
# g2 only step 0.
ROWS = StepRows(
    group=["g1", "g1", "g1", "g1", "g1", "g2", "g2", "g2"],
    step=[0, 0, 1, 1, 2, 0, 0, 0],
    outcome=[1, 0, 1, 0, 1, 1, 0, 0],
    vote_mean=[NAN, 1.0, 0.5, 0.0, NAN, 0.0, 1.0, 0.0],
)


def test_step_rewards_add_weighted_votes_and_ignore_missing_ones():
    assert step_rewards(ROWS.outcome, ROWS.vote_mean, 1.0).tolist() == [1, 1, 1.5, 0, 1, 1, 1, 0]
    assert step_rewards(ROWS.outcome, ROWS.vote_mean, 0.5).tolist() == [1, 0.5, 1.25, 0, 1, 1, 0.5, 0]


def test_step_index_buckets_by_hand():
    a = compute_advantages(ROWS)
    # (g1,0): R=[1,1] constant -> dropped, advantage 0
    # (g1,1): R=[1.5,0], mean .75, std .75
    # (g1,2): R=[1] singleton -> keeps its raw reward
    # (g2,0): R=[1,1,0], mean 2/3, std sqrt(2/9)
    s = math.sqrt(2 / 9)
    expected = [0, 0, 0.75 / (0.75 + EPS), -0.75 / (0.75 + EPS), 1.0,
                (1 / 3) / (s + EPS), (1 / 3) / (s + EPS), (-2 / 3) / (s + EPS)]
    np.testing.assert_allclose(a.advantages, expected, rtol=1e-12, atol=1e-12)
    assert a.keep.tolist() == [False, False, True, True, True, True, True, True]
    assert (a.buckets, a.singleton_buckets, a.constant_buckets, a.dropped) == (4, 1, 1, 2)


def test_constant_buckets_kept_with_zero_advantage_when_not_dropping():
    a = compute_advantages(ROWS, drop_constant=False)
    assert a.keep.all() and a.dropped == 0
    assert a.advantages[:2].tolist() == [0.0, 0.0]
    assert a.constant_buckets == 1


def test_weight_c_changes_rewards_and_buckets():
    a = compute_advantages(ROWS, c=0.0)
    # c=0: R=o. (g1,0)=[1,0] -> +-1/(0.5+eps)*0.5; (g1,1)=[1,0] same; (g1,2) singleton 1; (g2,0)=[1,0,0]
    half = 0.5 / (0.5 + EPS)
    s = math.sqrt(2 / 9)
    np.testing.assert_allclose(a.advantages, [half, -half, half, -half, 1.0, (2 / 3) / (s + EPS),
                                              (-1 / 3) / (s + EPS), (-1 / 3) / (s + EPS)], rtol=1e-12)
    assert a.keep.all()


def test_outcome_key_is_plain_grpo_over_the_group():
    a = compute_advantages(ROWS, key="outcome")
    # g1: o=[1,0,1,0,1] mean .6 std sqrt(.24); g2: o=[1,0,0]
    s1, s2 = math.sqrt(0.24), math.sqrt(2 / 9)
    expected = [0.4 / (s1 + EPS), -0.6 / (s1 + EPS), 0.4 / (s1 + EPS), -0.6 / (s1 + EPS), 0.4 / (s1 + EPS),
                (2 / 3) / (s2 + EPS), (-1 / 3) / (s2 + EPS), (-1 / 3) / (s2 + EPS)]
    np.testing.assert_allclose(a.advantages, expected, rtol=1e-12)
    assert a.rewards.tolist() == ROWS.outcome.tolist()
    assert a.buckets == 2


def test_state_key_groups_identical_observations_across_steps():
    rows = StepRows(group=["g"] * 4, step=[0, 1, 0, 2], outcome=[1, 1, 0, 0], vote_mean=[0, 0, 0, 1],
                    state=[7, 9, 7, 9])
    a = compute_advantages(rows, key="state")
    # state 7: R=[1,0]; state 9 (steps 1 and 2 of different episodes): R=[1,1] constant
    half = 0.5 / (0.5 + EPS)
    np.testing.assert_allclose(a.advantages, [half, 0, -half, 0])
    assert a.keep.tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="state"):
        compute_advantages(ROWS, key="state")


def test_roles_never_share_a_bucket():
    rows = StepRows(group=["g"] * 4, step=[0] * 4, outcome=[1, 0, 1, 0], vote_mean=[NAN] * 4,
                    role=["a", "a", "b", "b"])
    a = compute_advantages(rows)
    assert a.buckets == 2
    half = 0.5 / (0.5 + EPS)
    np.testing.assert_allclose(a.advantages, [half, -half, half, -half])


def test_unknown_key_and_custom_registration():
    with pytest.raises(ValueError, match="unknown advantage grouping"):
        compute_advantages(ROWS, key="nope")

    @register_grouping("everything")
    def _all(rows, c):
        return np.zeros(len(rows), dtype=np.int64), rows.outcome

    try:
        a = compute_advantages(ROWS, key="everything")
        assert a.buckets == 1 and abs(a.advantages.mean()) < 1e-12
    finally:
        GROUPINGS.pop("everything")


def test_empty_batch_and_constant_equal_floats():
    assert len(compute_advantages(StepRows([], [], [], [])).advantages) == 0
    # 0.1 * 3 summed is not exactly representable: the constant test must still be exact
    rows = StepRows(group=[1, 1, 1], step=[0, 0, 0], outcome=[0.1, 0.1, 0.1], vote_mean=[NAN] * 3)
    assert compute_advantages(rows).constant_buckets == 1


def test_bucket_codes_matches_tuples_for_wide_and_string_keys():
    rng = np.random.default_rng(0)
    g = rng.integers(0, 10**12, 500)           # wide integers take the sorting path
    s = rng.integers(0, 3, 500)
    names = np.array([f"t{x % 7}" for x in range(500)])
    codes = bucket_codes(g, s, names)
    tuples = list(zip(g.tolist(), s.tolist(), names.tolist()))
    seen: dict = {}
    for code, t in zip(codes.tolist(), tuples):
        assert seen.setdefault(t, code) == code
    assert len(set(codes.tolist())) == len(set(tuples))


def test_registering_a_taken_key_raises_and_names_it():
    for register, key in ((register_grouping, "step_index"), (register_estimator, "outcome"),
                          (register_grouping, "trajectory")):
        with pytest.raises(ValueError, match=repr(key)):
            register(key)(lambda rows, c: None)
    assert advantage_keys() == ["outcome", "state", "step_index", "trajectory"]


# g1: e0 (votes 1, -1, none) succeeded, e1 (1, 1) failed; g2: e2 (1, 0) and e3 (0) both succeeded
# (a constant outcome); g3: one episode, e4 (0.5).
TRAJ = StepRows(group=["g1"] * 5 + ["g2"] * 3 + ["g3"], step=[0, 1, 2, 0, 1, 0, 1, 0, 0],
                outcome=[1, 1, 1, 0, 0, 1, 1, 1, 1], vote_mean=[1, -1, NAN, 1, 1, 1, 0, 0, 0.5],
                episode=["e0", "e0", "e0", "e1", "e1", "e2", "e2", "e3", "e4"])


@pytest.mark.parametrize("c", [1.0, 2.0])
def test_trajectory_estimator_by_hand(c):
    h = 0.5 / (0.5 + EPS)   # g1's outcomes [1, 0], one per episode, normalized
    a = compute_advantages(TRAJ, "trajectory", c=c)
    # e0: h + c * (v - 0); e1: -h + c * (1 - 1); g2: outcome constant, e2: c * (v - 0.5), e3: 0 (dropped);
    # g3: one episode keeps its raw outcome 1, its vote equals its own mean
    np.testing.assert_allclose(a.advantages, [h + c, h - c, h, -h, -h, 0.5 * c, -0.5 * c, 0, 1], atol=1e-12)
    assert a.keep.tolist() == [True] * 7 + [False, True]
    assert (a.buckets, a.singleton_buckets, a.constant_buckets) == (3, 1, 1)
    np.testing.assert_allclose(a.rewards, step_rewards(TRAJ.outcome, TRAJ.vote_mean, c))
    # each episode's process terms sum to 0: its summed advantage is length * A_o
    assert compute_advantages(TRAJ, "trajectory", c=c, drop_constant=False).keep.all()


def test_trajectory_estimator_keeps_roles_apart_and_needs_episodes():
    rows = StepRows(group=["g"] * 4, step=[0, 1, 0, 1], outcome=[1, 1, 0, 0], vote_mean=[1, 0, 1, 0],
                    episode=[0, 0, 1, 1], role=[0, 1, 0, 1])
    a = compute_advantages(rows, "trajectory")
    h = 0.5 / (0.5 + EPS)   # each role's two episode-role units: outcomes [1, 0]; one vote each
    np.testing.assert_allclose(a.advantages, [h, h, -h, -h], atol=1e-12)
    assert a.buckets == 2
    with pytest.raises(ValueError, match="StepRows.episode"):
        compute_advantages(StepRows(group=[0], step=[0], outcome=[1], vote_mean=[1]), "trajectory")
