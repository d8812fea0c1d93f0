"""The default credit rule: an early correct STOP against a long run of bad-hypothesis CONTINUEs.

The groups are those of benchmarks/credit_ranking.py (seeded), whose counts docs/reproducing.md
reports; the rule's own table is computed by hand.
"""

import dataclasses
import importlib.util
import pathlib

import numpy as np
import pytest

from pau_jax.env.episode import Phase
from pau_jax.rl import credit, rewards
from pau_jax.rl.rewards import EpisodeRecord, RewardConfig, StepRecord

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT = credit.final_plus_mean  # gin/aac.gin binds it (tests/variants_test.py)


def _load():
    spec = importlib.util.spec_from_file_location(
        "credit_ranking", ROOT / "benchmarks" / "credit_ranking.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_final_plus_mean_table():
    # Group a: step rewards [1, 0, 2] and [0, 1] pooled: mean 0.8, sample std sqrt(0.7);
    # normalised [0.2, -0.8, 1.2] and [-0.8, 0.2] / std. Step t gets the last one plus the mean
    # of those from t up to the last: [1.2 + (0.2 - 0.8) / 2, 1.2 - 0.8, 1.2] and [0.2 - 0.8, 0.2].
    std = np.sqrt(0.7)
    got = DEFAULT([[1.0, 0.0, 2.0], [7.0], [0.0, 1.0]], ["a", "solo", "a"], eps=0.0)
    expected = [np.array([0.9, 0.4, 1.2]) / std, [0.0], np.array([-0.6, 0.2]) / std]
    for a, e in zip(got, expected):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    # eps enters the denominator.
    eps = DEFAULT([[1.0, 0.0, 2.0], [0.0, 1.0]], "aa", eps=0.5)
    np.testing.assert_allclose(eps[0], np.array([0.9, 0.4, 1.2]) / (std + 0.5), rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_default_never_ranks_an_early_correct_stop_below_a_long_bad_run(seed):
    stop, step0 = bench.stop_groups(seed, 300), bench.step0_groups(seed, 300)
    assert bench.ranked_below(DEFAULT, stop, at="stop") == 0
    assert bench.ranked_below(DEFAULT, step0, at="step0") == 0
    # DeepSeekMath's sum ranks it below in the same groups: the length of the run outweighs.
    assert bench.ranked_below(credit.process_grpo, stop, at="stop") > 30
    assert bench.ranked_below(credit.process_grpo, step0, at="step0") > 30


def test_a_mean_from_each_step_on_ranks_step_0_of_two_episodes_as_the_sum_does():
    # Why the default keeps the last reward at full weight: with two episodes the normalised
    # rewards sum to 0 over the group, so the sign of an episode's sum is that of its mean step
    # reward against the group's, and dividing by the length changes no order at step 0.
    for group in bench.step0_groups(0, 100):
        summed = credit.process_grpo(group, "gg")
        averaged = bench.mean_to_go(group, "gg")
        assert (summed[0][0] < summed[1][0]) == (averaged[0][0] < averaged[1][0])
    assert bench.ranked_below(bench.mean_to_go, bench.step0_groups(0, 300), at="step0") > 30


C, G, R = Phase.CONCEPTUALIZE, Phase.GENERATE, Phase.REVISE


def _cycle(plan, hypothesis, *, worst):
    """(reasoning, input, reflection); ``worst``: long replies and an input that raised."""
    text = " ".join(["w"] * 200) if worst else "w"
    arguments = " ".join(["w"] * (40 if worst else 1))
    return (
        StepRecord(phase=C, output=text, parse_ok=True, score=plan),
        StepRecord(
            phase=G, output=arguments, parse_ok=True, input_text=arguments, call_ok=not worst
        ),
        StepRecord(phase=R, output=text, parse_ok=True, score=hypothesis),
    )


def _extremes(config):
    """The worst early correct STOP for the rule, the best long bad run, and the worst others."""
    steps = _cycle(0.0, 0.3, worst=True) * 3 + _cycle(0.0, np.nextafter(0.7, 1.0), worst=True)
    correct = EpisodeRecord(steps=steps, done=True, timed_out=False)
    plan = (StepRecord(phase=C, output="w", parse_ok=True, score=1.0),)
    steps = _cycle(1.0, np.nextafter(0.3, 0.0), worst=False) * 13 + plan
    long_run = EpisodeRecord(steps=steps, done=False, timed_out=True)
    premature = EpisodeRecord(steps=_cycle(0.0, 0.0, worst=True), done=True, timed_out=False)
    steps = _cycle(0.0, 0.3, worst=True) * 13 + (dataclasses.replace(plan[0], score=0.0),)
    lost = EpisodeRecord(steps=steps, done=False, timed_out=True)
    return [rewards.episode_rewards(r, config) for r in (correct, long_run, premature, lost)]


@pytest.mark.parametrize(
    "config",
    [RewardConfig(), RewardConfig(timeout_reward=-50.0), RewardConfig(futile_continue="literal")],
)
@pytest.mark.parametrize("others", [(), (2,), (3,), (2, 2, 2, 3, 3, 3)])
def test_the_default_holds_at_the_extremes_of_the_paper_schedule(config, others):
    # The correct episode at its lowest (three CONTINUEs on hypotheses rated 0.3, every length
    # penalty, every call raised, a STOP on 0.7+), the long run at its highest (plans rated 1,
    # hypotheses just under 0.3, clean and short), beside the group's worst other episodes.
    records = _extremes(config)
    group = records[:2] + [records[i] for i in others]
    correct, long_run = DEFAULT(group, [0] * len(group))[:2]
    assert correct[-1] > long_run[len(correct) - 1] and correct[0] > long_run[0]
    if config.timeout_reward == -1.0:  # the sum ranks it below at both positions here
        correct, long_run = credit.process_grpo(group, [0] * len(group))[:2]
        assert correct[-1] < long_run[len(correct) - 1] and correct[0] < long_run[0]
