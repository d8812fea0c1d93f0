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


def test_return_to_go_table():
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
    close(credit.return_to_go(REWARDS, GROUPS, eps=0.0), expected)
    # eps enters the denominator.
    close(
        credit.return_to_go(REWARDS, GROUPS, eps=0.5),
        [e * s / (s + 0.5) for e, s in zip(expected, [std_a, std_b, std_a, std_b])],
    )
    # Population std (ddof=0): variance 2.8 / 5 for group a.
    got = credit.return_to_go(REWARDS, GROUPS, eps=0.0, ddof=0)
    np.testing.assert_allclose(got[0], np.array([1.2, 0.2, 0.2]) / np.sqrt(2.8 / 5), rtol=1e-5)


def test_return_to_go_with_discount():
    # Group a with gamma 0.5: [1.5, 1, 2] and [0.5, 1]; pooled mean 1.2.
    dev = np.array([0.3, -0.2, 0.8, -0.7, -0.2])
    std = np.sqrt(np.sum(dev**2) / 4)
    got = credit.return_to_go(REWARDS[::2], ["a", "a"], gamma=0.5, eps=0.0)
    close(got, [dev[:3] / std, dev[3:] / std])


def test_final_only_table():
    # Group a: sparse rewards [0, 0, 2], [0, 1] -> returns [2, 2, 2], [1, 1]; mean 1.6, var 1.2 / 4.
    std = np.sqrt(1.2 / 4)
    got = credit.final_only(REWARDS[::2], ["a", "a"], eps=0.0)
    close(got, [np.full(3, 0.4) / std, np.full(2, -0.6) / std])


def test_last_step_broadcast_table():
    # Group a finals 2 and 1: mean 1.5, sample std sqrt(0.5); group b finals 4 and 2: same.
    s = 0.5 / np.sqrt(0.5)
    got = credit.last_step_broadcast(REWARDS, GROUPS, eps=0.0)
    close(got, [np.full(3, s), np.full(2, s), np.full(2, -s), np.full(4, -s)])


@pytest.mark.parametrize("fn", [credit.return_to_go, credit.final_only, credit.last_step_broadcast])
def test_singleton_and_constant_groups_get_zero(fn):
    got = fn([[1.0, 2.0], [3.0], [3.0]], ["solo", "same", "same"])
    assert not np.any(got[1]) and not np.any(got[2])
    if fn is not credit.return_to_go:
        assert not np.any(got[0])


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
    # The final reward reaches all three (a group of three: two values always normalise to +-s).
    three = [[1.0, 0.0, 2.0], [0.0, 1.0], [3.0]]
    final_changed = [[1.0, 0.0, 7.0], [0.0, 1.0], [3.0]]
    for fn in (credit.return_to_go, credit.final_only, credit.last_step_broadcast):
        assert not np.allclose(fn(three, "aaa")[0], fn(final_changed, "aaa")[0])


def test_bad_inputs_fail_loudly():
    with pytest.raises(ValueError, match="group ids"):
        credit.return_to_go([[1.0]], ["a", "b"])
    with pytest.raises(ValueError, match="no steps"):
        credit.last_step_broadcast([[1.0], []], ["a", "a"])
