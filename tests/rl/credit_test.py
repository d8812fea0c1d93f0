"""Credit assignment against hand-computed advantages; which rewards reach the gradient."""

import dataclasses
import functools

import numpy as np
import pytest

from pau_jax.env.episode import Phase
from pau_jax.rl import credit, rewards
from pau_jax.rl.rewards import EpisodeRecord, RewardConfig, StepRecord

# The default credit rule (gin/aac.gin binds it; tests/variants_test.py checks the binding).
DEFAULT = credit.final_plus_mean
RULES = [
    credit.final_plus_mean,
    credit.process_grpo,
    credit.return_to_go,
    credit.final_only,
    credit.last_step_broadcast,
]

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
    # Only the final step carries a reward: group a's finals 2 and 1 are normalised over the
    # group's episodes (mean 1.5, sample std sqrt(0.5)) and every step gets its episode's value,
    # the sum of the normalised rewards from it on.
    s = 0.5 / np.sqrt(0.5)
    got = credit.final_only(REWARDS[::2], ["a", "a"], eps=0.0)
    close(got, [[s, s, s], [-s, -s]])


def test_last_step_broadcast_table():
    # Group a finals 2 and 1: mean 1.5, sample std sqrt(0.5); group b finals 4 and 2: same.
    s = 0.5 / np.sqrt(0.5)
    got = credit.last_step_broadcast(REWARDS, GROUPS, eps=0.0)
    close(got, [np.full(3, s), np.full(2, s), np.full(2, -s), np.full(4, -s)])


def test_process_grpo_table():
    # Group a: step rewards [1, 0, 2] and [0, 1] pooled: mean 0.8, sample variance 2.8 / 4.
    # Normalised: [0.2, -0.8, 1.2] and [-0.8, 0.2] / std; each step sums them from itself on.
    std_a = np.sqrt(0.7)
    # Group b: [4, 4] and [1, 5, 0, 2] pooled: mean 8/3, deviations in thirds below.
    dev_b = np.array([4, 4, -5, 7, -8, -2]) / 3
    std_b = np.sqrt(np.sum(dev_b**2) / 5)
    expected = [
        np.array([0.6, 0.4, 1.2]) / std_a,
        np.array([8 / 3, 4 / 3]) / std_b,
        np.array([-0.6, 0.2]) / std_a,
        np.array([-8 / 3, -1, -10 / 3, -2 / 3]) / std_b,
    ]
    close(credit.process_grpo(REWARDS, GROUPS, eps=0.0), expected)
    # eps enters the denominator; ddof=0 is the population std.
    close(
        credit.process_grpo(REWARDS, GROUPS, eps=0.5),
        [e * s / (s + 0.5) for e, s in zip(expected, [std_a, std_b, std_a, std_b])],
    )
    got = credit.process_grpo(REWARDS[::2], "aa", eps=0.0, ddof=0)
    np.testing.assert_allclose(got[1], np.array([-0.6, 0.2]) / np.sqrt(2.8 / 5), rtol=1e-5)


@pytest.mark.parametrize("fn", RULES)
def test_singleton_and_constant_groups_get_zero(fn):
    got = fn([[1.0, 2.0], [3.0], [3.0]], ["solo", "same", "same"])
    assert not np.any(got[0]) and not np.any(got[1]) and not np.any(got[2])


# Per group size, an episode whose every reward is one of the non-dyadic values whose n copies
# have a computed sample std that is not 0 (e.g. three copies of 0.7 give 1.1e-16).
IDENTICAL = {
    3: [0.7, 0.025, 3.55],
    5: [1.694, -0.902, 3.546],
    6: [0.7, 2.2, 1.694],
    7: [0.1, -1.8, 1.1],
}


@pytest.mark.parametrize("size", sorted(IDENTICAL))
@pytest.mark.parametrize(
    "fn, kwargs",
    [
        (credit.return_to_go, {"gamma": 0.0}),
        (credit.return_to_go, {"gamma": 0.5}),
        (credit.return_to_go, {"gamma": 1.0}),
        (credit.final_only, {}),
        (credit.last_step_broadcast, {}),
    ],
)
def test_identical_episodes_get_exact_zeros(size, fn, kwargs):
    # Nothing distinguishes the episodes, so no step may be pushed up or down: exactly 0, not
    # the ~1e-10 that (x - mean) / (std + eps) gives when rounding leaves std at ~1e-16.
    for advantages in fn([IDENTICAL[size]] * size, ["g"] * size, **kwargs):
        np.testing.assert_array_equal(advantages, np.zeros(3, np.float32))


@pytest.mark.parametrize("fn", [credit.final_plus_mean, credit.process_grpo])
@pytest.mark.parametrize("size", sorted(IDENTICAL))
def test_pooled_step_rules_on_identical_episodes(size, fn):
    # The default and process supervision compare every step with the group's mean step reward,
    # so identical episodes get identical advantages, not zero where an episode's rewards vary
    # (docs/reproducing.md); a group whose step rewards are all equal gets exactly 0.
    got = fn([IDENTICAL[size]] * size, ["g"] * size)
    for advantages in got[1:]:
        np.testing.assert_array_equal(advantages, got[0])
    assert np.any(got[0])
    flat = [[IDENTICAL[size][0]] * 3] * size
    for advantages in fn(flat, ["g"] * size):
        np.testing.assert_array_equal(advantages, np.zeros(3, np.float32))


def test_an_intermediate_reward_reaches_the_step_reward_rules_only():
    changed = [list(r) for r in REWARDS]
    changed[0][1] = 7.0  # a middle step of episode 0 (its last step is unchanged)
    for fn in (credit.final_plus_mean, credit.process_grpo, credit.return_to_go):
        before, after = fn(REWARDS, GROUPS), fn(changed, GROUPS)
        assert not np.allclose(before[0], after[0])
        assert after[0][1] > before[0][1]
        assert not np.allclose(before[2], after[2])  # the group's statistics moved
    for fn in (credit.final_only, credit.last_step_broadcast):
        for a, b in zip(fn(REWARDS, GROUPS), fn(changed, GROUPS)):
            np.testing.assert_array_equal(a, b)
    # The final reward reaches earlier steps under every rule but the per-position gamma = 0
    # one (its own position 2 has no other episode to compare with, so nothing moves there).
    three = [[1.0, 0.0, 2.0], [0.0, 1.0], [3.0]]
    final_changed = [[1.0, 0.0, 7.0], [0.0, 1.0], [3.0]]
    for fn, kwargs in (
        (credit.final_plus_mean, {}),
        (credit.process_grpo, {}),
        (credit.return_to_go, {"gamma": 1.0}),
        (credit.final_only, {}),
        (credit.last_step_broadcast, {}),
    ):
        before, after = fn(three, "aaa", **kwargs)[0], fn(final_changed, "aaa", **kwargs)[0]
        assert not np.allclose(before[:2], after[:2]), fn.__name__
    np.testing.assert_array_equal(
        credit.return_to_go(three, "aaa")[0], credit.return_to_go(final_changed, "aaa")[0]
    )


@pytest.mark.parametrize("fn", RULES)
def test_bad_inputs_fail_loudly(fn):
    with pytest.raises(ValueError, match="group ids"):
        fn([[1.0]], ["a", "b"])
    with pytest.raises(ValueError, match="no steps"):
        fn([[1.0], []], ["a", "a"])


# Episodes built from the paper's reward schedule.
C, G, R = Phase.CONCEPTUALIZE, Phase.GENERATE, Phase.REVISE
PAPER = RewardConfig()


def step(phase, score=None, *, words=2, call_ok=True):
    text = " ".join(["w"] * words)
    if phase is G:
        return StepRecord(
            phase=G, output=f"```\n{text}\n```", parse_ok=True, input_text=text, call_ok=call_ok
        )
    return StepRecord(phase=phase, output=text, parse_ok=True, score=score)


def stopped(*steps):
    return EpisodeRecord(steps=steps, done=True, timed_out=False)


def timed_out(*steps):
    assert len(steps) == PAPER.max_steps
    return EpisodeRecord(steps=steps, done=False, timed_out=True)


def cycles(n, plan=0.2, hypothesis=0.1):
    return (step(C, plan), step(G), step(R, hypothesis)) * n


def _group():
    """One GRPO group: an early correct STOP, a STOP after two cycles, a timeout at T_max = 40."""
    return [
        stopped(step(C, 0.8), step(G), step(R, 0.9)),
        stopped(
            step(C, 0.4, words=150),
            step(G, call_ok=False),
            step(R, 0.5),
            step(C, 0.6),
            step(G, words=35),
            step(R, 0.8, words=130),
        ),
        timed_out(*cycles(13), step(C, 0.3)),
    ]


def _rewards(records, config=PAPER):
    return [rewards.episode_rewards(r, config) for r in records]


def _replace_steps(records, index, fn):
    record = records[index]
    return (
        records[:index]
        + [dataclasses.replace(record, steps=fn(record.steps))]
        + records[index + 1 :]
    )


def _set(steps, i, **changes):
    return steps[:i] + (dataclasses.replace(steps[i], **changes),) + steps[i + 1 :]


def _unscored(phase):
    """Drops the critic's scores of every step of ``phase`` in every record."""

    def drop(records):
        return [
            dataclasses.replace(
                r,
                steps=tuple(
                    dataclasses.replace(s, score=None) if s.phase is phase else s for s in r.steps
                ),
            )
            for r in records
        ]

    return drop


# Each term of the paper's schedule, and how to drop or neutralise it: (records, config) -> same.
TERMS = {
    "reasoning critic score": lambda rs, c: (_unscored(C)(rs), c),
    "input parse/exception penalty": lambda rs, c: (rs, dataclasses.replace(c, failure_reward=0.0)),
    "clean input reward": lambda rs, c: (rs, dataclasses.replace(c, max_steps=10**9)),
    "reasoning r_len": lambda rs, c: (rs, dataclasses.replace(c, reasoning_alpha=0.0)),
    "input r_len": lambda rs, c: (rs, dataclasses.replace(c, input_alpha=0.0)),
    "reflection r_len": lambda rs, c: (rs, dataclasses.replace(c, reflection_alpha=0.0)),
    "hypothesis score s": lambda rs, c: (
        _replace_steps(rs, 0, lambda s: _set(s, 2, score=0.95)),
        c,
    ),
    "b_term": lambda rs, c: (
        rs,
        dataclasses.replace(
            c, correct_stop_bonus=0.0, premature_stop_bonus=0.0, correct_continue_bonus=0.0
        ),
    ),
    "lambda_H(s + b_term)": lambda rs, c: (_unscored(R)(rs), c),
    "timeout": lambda rs, c: (rs, dataclasses.replace(c, timeout_reward=0.0)),
}


@pytest.mark.parametrize("fn", [DEFAULT, credit.process_grpo])
@pytest.mark.parametrize("term", sorted(TERMS))
def test_every_reward_term_reaches_the_default_advantages(term, fn):
    records = _group()
    before = fn(_rewards(records), "ggg")
    changed, config = TERMS[term](records, PAPER)
    after = fn(_rewards(changed, config), "ggg")
    assert not all(np.allclose(a, b) for a, b in zip(before, after)), term


@pytest.mark.parametrize("fn", [DEFAULT, credit.process_grpo])
def test_a_minus_one_and_a_minus_fifty_timeout_give_different_advantages(fn):
    records = _group()[::2]  # the early correct STOP and the timeout
    mild = fn(_rewards(records), "gg")
    harsh = fn(_rewards(records, dataclasses.replace(PAPER, timeout_reward=-50.0)), "gg")
    assert not np.allclose(mild[1], harsh[1]) and not np.allclose(mild[0], harsh[0])
    for adv in (mild, harsh):
        assert np.all(adv[1][:3] < 0) and np.all(adv[0] > 0)


def test_the_per_position_rule_does_not_see_the_timeout():
    # Why it is not the default: only timed-out episodes reach the last positions, so whatever
    # the penalty, the per-position comparison there has nothing to compare it with.
    records = _group()[::2]
    mild = credit.return_to_go(_rewards(records), "gg")
    harsh = credit.return_to_go(
        _rewards(records, dataclasses.replace(PAPER, timeout_reward=-50.0)), "gg"
    )
    for a, b in zip(mild, harsh):
        np.testing.assert_array_equal(a, b)


def test_a_later_hypothesis_gain_reaches_the_input_that_produced_it():
    # Two episodes alike but for the hypothesis the call led to: the input step of the one that
    # led to the better hypothesis gets the larger advantage (under gamma = 0 per position both
    # input steps got 0: an input step learned only its format).
    better = stopped(step(C, 0.5), step(G), step(R, 0.3), step(C, 0.5), step(G), step(R, 0.9))
    worse = stopped(step(C, 0.5), step(G), step(R, 0.3), step(C, 0.5), step(G), step(R, 0.75))
    third = stopped(step(C, 0.4), step(G), step(R, 0.8))
    adv = DEFAULT(_rewards([better, worse, third]), "ggg")
    assert adv[0][4] > adv[1][4]
    assert adv[0][1] > adv[1][1]  # and the earlier input too, through the sum


def test_stop_with_no_call_left_is_not_ranked_below_a_futile_continue():
    # At the last reflection of T_max = 40 no call is left: a CONTINUE can only run into the
    # limit. Two episodes alike until then; one STOPs, one CONTINUEs (and reasons once more).
    prefix = cycles(12, plan=0.5, hypothesis=0.5) + (step(C, 0.5), step(G))
    for s in (0.1, 0.5, 0.9):
        stop = stopped(*prefix, step(R, s))
        more = timed_out(*prefix, step(R, s), step(C, 0.9))
        r_stop, r_more = _rewards([stop, more])
        assert sum(r_more[38:]) <= r_stop[38] + PAPER.timeout_reward, s
        a_stop, a_more = DEFAULT([r_stop, r_more], "gg")
        assert a_stop[38] > a_more[38], s
        # Per position the two decisions now earn the same there (the timeout lands on a
        # position only the CONTINUE reaches): not ranked below, no longer 4 above.
        a_stop, a_more = credit.return_to_go([r_stop, r_more], "gg")
        assert a_stop[38] >= a_more[38], s


def test_final_only_is_the_default_rule_on_the_final_reward_alone():
    # FINAL differs from AAC only in sparsity: the default rule where only each episode's last
    # step carries a reward. Process supervision over one rewarded step per episode normalises
    # the finals over the group and sums them from each step on: every step gets its episode's.
    rewards_ = _rewards(_group()) + [[0.3, -0.2, 1.7]]
    groups = ["g", "g", "g", "h"]
    finals = DEFAULT([[r[-1]] for r in rewards_], groups)
    expected = [np.full(len(r), f[0], np.float32) for r, f in zip(rewards_, finals)]
    close(credit.final_only(rewards_, groups), expected)
    close(credit.last_step_broadcast(rewards_, groups), expected)


def test_each_rule_says_what_it_is():
    assert "DeepSeekMath" in credit.describe(credit.process_grpo)
    for fn in RULES:
        label = credit.describe(fn)
        assert label.startswith(fn.__name__ + ":") and "\n" not in label
        assert "pau_jax's reading" in label or "released code" in label, label
        assert "(paper" not in label
    assert "gamma=1.0" in credit.describe(functools.partial(credit.return_to_go, gamma=1.0))
    assert "credit_test" in credit.describe(test_each_rule_says_what_it_is)  # any other function
    assert "(paper default)" not in credit.__doc__


def test_an_early_correct_stop_is_not_ranked_below_a_long_wrong_episode():
    correct = stopped(step(C, 0.8), step(G), step(R, 0.9))
    wrong = timed_out(*cycles(13), step(C, 0.2))
    rewards_ = _rewards([correct, wrong])
    np.testing.assert_allclose(rewards_[0], [0.8, 0.025, 3.8])
    # 12 cycles of CONTINUE on a bad hypothesis (0.2 + 0.025 + 2 * (0.1 + 1)); the 13th, with no
    # call left, is scored as the end it is (2 * (0.1 - 1)); the 40th step, a plan no call can
    # follow, gets no critic reward, only the timeout.
    assert len(rewards_[1]) == 40
    assert rewards_[1][-5:] == pytest.approx([2.2, 0.2, 0.025, -1.8, -1.0])
    for fn in (DEFAULT, credit.return_to_go):
        correct_adv, wrong_adv = fn(rewards_, ["g", "g"])
        assert correct_adv[0] > 0 > wrong_adv[0] and correct_adv[2] > wrong_adv[2], fn.__name__
    # Summing raw later rewards (gamma = 1 per position) ranks the correct episode below.
    correct_adv, wrong_adv = credit.return_to_go(rewards_, ["g", "g"], gamma=1.0)
    assert np.all(correct_adv < 0) and np.all(wrong_adv[:3] > 0)


def test_process_grpo_can_rank_a_long_run_of_continues_above_an_early_correct_stop():
    # Why it is no longer the default (docs/reproducing.md): each CONTINUE on a bad hypothesis
    # earns 2 * (s + 1), above a mediocre group's mean step reward, so 12 of them outweigh one
    # early correct STOP at step 0 once the rest of the group stops prematurely.
    correct = stopped(step(C, 0.8), step(G), step(R, 0.9))
    wrong = timed_out(*cycles(13), step(C, 0.2))
    mediocre = stopped(*cycles(2, plan=0.5, hypothesis=0.5), step(C, 0.5), step(G), step(R, 0.6))
    group = _rewards([correct, wrong] + [mediocre] * 4)
    adv = credit.process_grpo(group, "g" * 6)
    np.testing.assert_allclose([adv[0][0], adv[1][0]], [3.21, 5.46], atol=0.01)
    adv = DEFAULT(group, "g" * 6)
    assert adv[0][0] > adv[1][0] and adv[0][2] > adv[1][2]
    # Per position the early STOP still wins step 0 (and the timeout is invisible).
    adv = credit.return_to_go(_rewards([correct, wrong] + [mediocre] * 4), "g" * 6)
    assert adv[0][0] > adv[1][0]
