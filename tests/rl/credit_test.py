"""Credit assignment against hand-computed advantages; which rewards reach the gradient."""

import numpy as np
import pytest

from pau_jax.rl import credit

# Two GRPO groups; group "a" has two episodes, group "b" two, listed interleaved.
REWARDS = [[1.0, 0.0, 2.0], [4.0, 4.0], [0.0, 1.0], [1.0, 5.0, 0.0, 2.0]]
GROUPS = ["a", "b", "a", "b"]


def close(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def test_discounted_returns():
    np.testing.assert_allclose(credit.discounted_returns([1.0, 0.0, 2.0]), [3.0, 2.0, 2.0])
    # G2 = 2, G1 = 0 + 0.5 * 2, G0 = 1 + 0.5 * 1.
    np.testing.assert_allclose(credit.discounted_returns([1.0, 0.0, 2.0], 0.5), [1.5, 1.0, 2.0])


def test_return_to_go_pooled_table():
    # Group a returns: [3, 2, 2] and [1, 1]; pooled mean 1.8, sample variance 2.8 / 4.
    # Group b returns: [8, 4] and [8, 7, 2, 2]; pooled mean 31 / 6, deviations below.
    std_a = np.sqrt(2.8 / 4)
    mean_b = 31 / 6
    dev_b = np.array([8, 4, 8, 7, 2, 2]) - mean_b
    std_b = np.sqrt(np.sum(dev_b**2) / 5)
    expected = [
        np.array([1.2, 0.2, 0.2]) / std_a,
        dev_b[:2] / std_b,
        np.array([-0.8, -0.8]) / std_a,
        dev_b[2:] / std_b,
    ]
    pooled = dict(gamma=1.0, normalize="pooled")
    close(credit.return_to_go(REWARDS, GROUPS, eps=0.0, **pooled), expected)
    # eps enters the denominator.
    close(
        credit.return_to_go(REWARDS, GROUPS, eps=0.5, **pooled),
        [e * s / (s + 0.5) for e, s in zip(expected, [std_a, std_b, std_a, std_b])],
    )
    # Population std (ddof=0): variance 2.8 / 5 for group a.
    got = credit.return_to_go(REWARDS, GROUPS, eps=0.0, ddof=0, **pooled)
    np.testing.assert_allclose(got[0], np.array([1.2, 0.2, 0.2]) / np.sqrt(2.8 / 5), rtol=1e-5)


def test_return_to_go_per_position_table():
    # gamma = 1. Group a returns [3, 2, 2] and [1, 1]: positions 0 and 1 each hold two values
    # (3 vs 1, 2 vs 1), position 2 only episode 0's (nothing to compare: 0).
    s = 1 / np.sqrt(2)  # two values standardise to +-1/sqrt(2) with ddof 1
    # Group b returns [8, 4] and [8, 7, 2, 2]: position 0 ties (8, 8) -> 0; position 1: 4 vs 7.
    expected = [np.array([s, s, 0.0]), np.array([0.0, -s]), np.array([-s, -s]), [0, s, 0, 0]]
    close(credit.return_to_go(REWARDS, GROUPS, gamma=1.0, eps=0.0), expected)
    # Three episodes at one position: the mean and std of that column only.
    got = credit.return_to_go([[1.0, 9.0], [2.0], [6.0, 0.0]], "ggg", gamma=0.0, eps=0.0)
    col0 = np.array([1.0, 2.0, 6.0])
    z0 = (col0 - col0.mean()) / col0.std(ddof=1)
    close(got, [[z0[0], s], [z0[1]], [z0[2], -s]])


def test_return_to_go_defaults_to_each_steps_own_reward():
    # gamma = 0: the return of a step is its own reward.
    np.testing.assert_allclose(credit.discounted_returns([1.0, 0.0, 2.0], 0.0), [1.0, 0.0, 2.0])
    rewards = [[1.0, 5.0, 0.0], [3.0, 5.0, 4.0]]
    s = 1 / np.sqrt(2)
    close(credit.return_to_go(rewards, "gg", eps=0.0), [[-s, 0, -s], [s, 0, s]])
    with pytest.raises(ValueError, match="gamma"):
        credit.return_to_go(rewards, "gg", gamma=1.5)
    with pytest.raises(ValueError, match="normalize"):
        credit.return_to_go(rewards, "gg", normalize="episode")


def test_return_to_go_with_discount():
    # Group a with gamma 0.5, pooled: [1.5, 1, 2] and [0.5, 1]; pooled mean 1.2.
    dev = np.array([0.3, -0.2, 0.8, -0.7, -0.2])
    std = np.sqrt(np.sum(dev**2) / 4)
    got = credit.return_to_go(REWARDS[::2], ["a", "a"], gamma=0.5, eps=0.0, normalize="pooled")
    close(got, [dev[:3] / std, dev[3:] / std])


def test_final_only_table():
    # Group a: sparse rewards [0, 0, 2], [0, 1] -> returns [2, 2, 2], [1, 1] (gamma 1).
    # Per position: 2 vs 1 at positions 0 and 1; position 2 alone.
    s = 1 / np.sqrt(2)
    got = credit.final_only(REWARDS[::2], ["a", "a"], eps=0.0)
    close(got, [[s, s, 0.0], [-s, -s]])
    # Pooled: mean 1.6, var 1.2 / 4.
    std = np.sqrt(1.2 / 4)
    got = credit.final_only(REWARDS[::2], ["a", "a"], eps=0.0, normalize="pooled")
    close(got, [np.full(3, 0.4) / std, np.full(2, -0.6) / std])


def test_last_step_broadcast_table():
    # Group a finals 2 and 1: mean 1.5, sample std sqrt(0.5); group b finals 4 and 2: same.
    s = 0.5 / np.sqrt(0.5)
    got = credit.last_step_broadcast(REWARDS, GROUPS, eps=0.0)
    close(got, [np.full(3, s), np.full(2, s), np.full(2, -s), np.full(4, -s)])


@pytest.mark.parametrize("fn", [credit.return_to_go, credit.final_only, credit.last_step_broadcast])
def test_singleton_and_constant_groups_get_zero(fn):
    got = fn([[1.0, 2.0], [3.0], [3.0]], ["solo", "same", "same"])
    assert not np.any(got[0]) and not np.any(got[1]) and not np.any(got[2])


@pytest.mark.parametrize("fn", [credit.return_to_go, credit.final_only, credit.last_step_broadcast])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_a_group_of_identical_episodes_gets_zero_everywhere(fn, gamma):
    # Four copies of one episode: nothing distinguishes them, so no step may be pushed up or down
    # (pooling all positions used to give [-0.68, -0.68, +1.35] here).
    rewards = [[0.0, -0.5, -1.5]] * 4
    kwargs = {} if fn is credit.last_step_broadcast else {"gamma": gamma}
    for advantages in fn(rewards, "gggg", **kwargs):
        np.testing.assert_array_equal(advantages, np.zeros(3, np.float32))


def test_an_intermediate_reward_reaches_only_return_to_go():
    changed = [list(r) for r in REWARDS]
    changed[0][1] = 7.0  # a middle step of episode 0 (its last step is unchanged)
    before = credit.return_to_go(REWARDS, GROUPS)
    after = credit.return_to_go(changed, GROUPS)
    assert not np.allclose(before[0], after[0])
    assert after[0][1] > before[0][1]
    assert not np.allclose(before[2], after[2])  # the group's statistics moved
    for fn in (credit.final_only, credit.last_step_broadcast):
        for a, b in zip(fn(REWARDS, GROUPS), fn(changed, GROUPS)):
            np.testing.assert_array_equal(a, b)
    # With gamma = 1 the final reward reaches earlier steps of all three (its own position 2 has
    # no other episode to compare with, so only earlier positions can move).
    three = [[1.0, 0.0, 2.0], [0.0, 1.0], [3.0]]
    final_changed = [[1.0, 0.0, 7.0], [0.0, 1.0], [3.0]]
    for fn, kwargs in (
        (credit.return_to_go, {"gamma": 1.0}),
        (credit.final_only, {}),
        (credit.last_step_broadcast, {}),
    ):
        before, after = fn(three, "aaa", **kwargs)[0], fn(final_changed, "aaa", **kwargs)[0]
        assert not np.allclose(before, after)
    # With gamma = 0 it reaches only its own step, and a step alone at its position gets 0.
    np.testing.assert_array_equal(
        credit.return_to_go(three, "aaa")[0], credit.return_to_go(final_changed, "aaa")[0]
    )


def test_bad_inputs_fail_loudly():
    with pytest.raises(ValueError, match="group ids"):
        credit.return_to_go([[1.0]], ["a", "b"])
    with pytest.raises(ValueError, match="no steps"):
        credit.last_step_broadcast([[1.0], []], ["a", "a"])


def _early_correct_stop_and_long_wrong_episode():
    """Rewards of two episodes of one group under the paper's schedule (docs/reproducing.md)."""
    from pau_jax.env.episode import Phase
    from pau_jax.rl import rewards
    from pau_jax.rl.rewards import EpisodeRecord, StepRecord

    def step(phase, score=None):
        call_ok = True if phase is Phase.GENERATE else None
        return StepRecord(phase=phase, output="short reply", parse_ok=True, call_ok=call_ok,
                          input_text="(1, 2)" if phase is Phase.GENERATE else "", score=score)  # fmt: skip

    c, g, r = Phase.CONCEPTUALIZE, Phase.GENERATE, Phase.REVISE
    correct = EpisodeRecord(steps=(step(c, 0.8), step(g), step(r, 0.9)), done=True, timed_out=False)
    cycle = (step(c, 0.2), step(g), step(r, 0.1))
    wrong = EpisodeRecord(steps=cycle * 13 + (step(c, 0.2),), done=False, timed_out=True)
    config = rewards.RewardConfig()
    return [rewards.episode_rewards(e, config) for e in (correct, wrong)]


def test_an_early_correct_stop_is_not_ranked_below_a_long_wrong_episode():
    rewards = _early_correct_stop_and_long_wrong_episode()
    np.testing.assert_allclose(rewards[0], [0.8, 0.025, 3.8])
    assert len(rewards[1]) == 40 and sum(rewards[1]) == pytest.approx(30.725)
    correct, wrong = credit.return_to_go(rewards, ["g", "g"])
    # Positions 0 and 2 favour the correct episode; position 1 (a clean input in both) ties.
    assert correct[0] > 0 > wrong[0] and correct[2] > 0 > wrong[2]
    assert correct[1] == 0 == wrong[1]
    assert not np.any(wrong[3:])  # alone at its later positions: nothing to compare with
    # Summing later rewards (gamma = 1) ranks the correct episode below the long wrong one.
    correct, wrong = credit.return_to_go(rewards, ["g", "g"], gamma=1.0)
    assert np.all(correct < 0) and np.all(wrong[:3] > 0)
