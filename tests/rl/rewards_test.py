"""The reward schedule against hand-computed tables (paper and released length penalties)."""

import dataclasses

import pytest

from pau_jax.env import episode
from pau_jax.env.episode import EpisodeConfig, Phase
from pau_jax.env.prompts import Observation
from pau_jax.rl import rewards
from pau_jax.rl.rewards import EpisodeRecord, RewardConfig, StepRecord

PAPER = RewardConfig()
RELEASED = RewardConfig(length_penalty="released")


def words(n: int) -> str:
    return " ".join(["w"] * n)


def reasoning(n, score):
    return StepRecord(phase=Phase.CONCEPTUALIZE, output=words(n), parse_ok=True, score=score)


def inputs(n, *, parse_ok=True, call_ok=True):
    # The reply wraps the n-word input in prose: only the input's words are counted.
    output = f"I will try this input now.\n```\n{words(n)}\n```"
    return StepRecord(
        phase=Phase.GENERATE,
        output=output,
        parse_ok=parse_ok,
        input_text=words(n),
        call_ok=call_ok,
    )


def reflection(n, score, *, parse_ok=True):
    return StepRecord(phase=Phase.REVISE, output=words(n), parse_ok=parse_ok, score=score)


def test_defaults_are_the_papers_constants():
    assert PAPER.clean_input_reward == pytest.approx(0.025)
    assert (PAPER.lambda_h, PAPER.max_steps, PAPER.failure_reward) == (2.0, 40, -0.5)
    assert (PAPER.reasoning_tau, PAPER.reasoning_alpha) == (100, 0.05)
    assert (PAPER.input_tau, PAPER.input_alpha) == (30, 0.5)
    assert PAPER.timeout_reward == -1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        PAPER.lambda_h = 1.0
    with pytest.raises(TypeError):
        RewardConfig(2.0)
    with pytest.raises(ValueError, match="length_penalty"):
        RewardConfig(length_penalty="min")


@pytest.mark.parametrize(
    "n, tau, alpha, paper, released",
    [
        (0, 100, 0.05, 0.0, 0.0),
        (100, 100, 0.05, 0.0, 0.0),
        (101, 100, 0.05, -0.05, -1.0),  # released: -max(1, 1/200)
        (110, 100, 0.05, -0.5, -1.0),
        (120, 100, 0.05, -1.0, -1.0),
        (140, 100, 0.05, -1.0, -1.0),  # paper caps at 1
        (500, 100, 0.05, -1.0, -2.0),  # released: -max(1, 400/200)
        (31, 30, 0.5, -0.5, -1.0),
        (33, 30, 0.5, -1.0, -1.0),
        (150, 30, 0.5, -1.0, -2.0),  # released: (150-30)/60
    ],
)
def test_length_penalty_table(n, tau, alpha, paper, released):
    assert rewards.length_penalty(n, tau=tau, alpha=alpha, mode="paper") == pytest.approx(paper)
    assert rewards.length_penalty(n, tau=tau, alpha=alpha, mode="released") == pytest.approx(
        released
    )


@pytest.mark.parametrize(
    "done, score, expected",
    [
        (True, 0.9, 1.0),
        (True, 0.71, 1.0),
        (True, 0.7, -1.0),  # s <= 0.7 is a premature stop
        (True, 0.1, -1.0),
        (False, 0.29, 1.0),
        (False, 0.3, 0.0),  # s < 0.3 needed
        (False, 0.9, 0.0),
    ],
)
def test_termination_bonus_table(done, score, expected):
    assert rewards.termination_bonus(done, score, PAPER) == expected


def test_stopped_episode_table():
    record = EpisodeRecord(
        steps=(
            reasoning(104, 0.5),  # 0.5 - 0.05 * 4 = 0.3
            inputs(10),  # clean: 2 / 80 = 0.025
            reflection(20, 0.2),  # not done, s < 0.3: 2 * (0.2 + 1) = 2.4
            reasoning(50, None),  # no critic reward, no length penalty: 0
            inputs(32, call_ok=False),  # raised: -0.5, 2 words over 30: -min(1, 1.0) = -1.5
            reflection(101, 0.8),  # done, s > 0.7: 2 * (0.8 + 1) - 0.05 = 3.55
        ),
        done=True,
        timed_out=False,
    )
    assert rewards.episode_rewards(record, PAPER) == pytest.approx(
        [0.3, 0.025, 2.4, 0.0, -1.5, 3.55]
    )
    # Released length penalty: -1 for any step over its tau.
    assert rewards.episode_rewards(record, RELEASED) == pytest.approx(
        [0.5 - 1.0, 0.025, 2.4, 0.0, -0.5 - 1.0, 3.6 - 1.0]
    )


def test_timed_out_episode_and_failures_table():
    record = EpisodeRecord(
        steps=(
            reasoning(5, 0.4),  # 0.4
            inputs(3, parse_ok=False, call_ok=False),  # parse failure: -0.5
            reflection(5, None, parse_ok=False),  # parse failure, no score: -0.5
            reasoning(5, 1.0),  # 1.0
            inputs(3),  # 0.025
            # CONTINUE with no call left (only a reasoning step follows): scored as the end it
            # is, 2 * (0.5 - 1).
            reflection(5, 0.5),
            reasoning(5, 1.0),  # a plan no call can follow: no critic reward; the timeout -1.0
        ),
        done=False,
        timed_out=True,
    )
    assert rewards.episode_rewards(record, PAPER) == pytest.approx(
        [0.4, -0.5, -0.5, 1.0, 0.025, -1.0, -1.0]
    )
    terms = rewards.episode_terms(record, PAPER)
    assert terms[-1]["timeout"] == -1.0 and all(t["timeout"] == 0 for t in terms[:-1])
    assert terms[5] == {
        "critic": 1.0,
        "termination": -2.0,
        "execution": 0.0,
        "length": 0.0,
        "timeout": 0.0,
    }
    assert terms[6] == dict.fromkeys(rewards.TERMS, 0.0) | {"timeout": -1.0}


def test_premature_stop_and_parse_failed_reflection_with_a_score():
    record = EpisodeRecord(
        steps=(reflection(5, 0.3, parse_ok=False), reflection(5, 0.7)),
        done=True,
        timed_out=False,
    )
    # Step 0: -0.5 + 2 * (0.3 + 0) (not done, s not < 0.3); step 1: 2 * (0.7 - 1).
    assert rewards.episode_rewards(record, PAPER) == pytest.approx([0.1, -0.6])


def test_constants_are_configurable():
    config = RewardConfig(lambda_h=1.0, max_steps=10, timeout_reward=-3.0, failure_reward=-2.0)
    record = EpisodeRecord(
        steps=(inputs(1), inputs(1, call_ok=False), reflection(1, 0.1)),
        done=False,
        timed_out=True,
    )
    # The last reflection's CONTINUE has no call left: 1 * (0.1 - 1), and the timeout -3.
    assert rewards.episode_rewards(record, config) == pytest.approx([0.05, -2.0, -0.9 - 3.0])


def test_input_length_counts_the_parsed_input_not_the_reply():
    # 40 words of explanation around a 3-word input: no penalty (the input is under tau = 30).
    chatty = StepRecord(
        phase=Phase.GENERATE,
        output=words(40) + "\n```\n(1, 2, 3)\n```",
        parse_ok=True,
        input_text="(1, 2, 3)",
        call_ok=True,
    )
    assert rewards.counted_words(chatty) == 3
    record = EpisodeRecord(steps=(chatty,), done=False, timed_out=False)
    assert rewards.episode_rewards(record, PAPER) == pytest.approx([0.025])
    # A 32-word input costs 2 words over tau: -min(1, 0.5 * 2) = -1.
    long_input = dataclasses.replace(chatty, input_text=words(32))
    record = EpisodeRecord(steps=(long_input,), done=False, timed_out=False)
    assert rewards.episode_rewards(record, PAPER) == pytest.approx([0.025 - 1.0])
    # Nothing extracted: no input to count, the failure term alone.
    failed = dataclasses.replace(chatty, parse_ok=False, call_ok=False, input_text="")
    record = EpisodeRecord(steps=(failed,), done=False, timed_out=False)
    assert rewards.episode_rewards(record, PAPER) == pytest.approx([-0.5])


def test_thinking_is_not_counted_in_reasoning_and_reflection_length():
    thought = f"<think>{words(300)}</think>"
    plan = StepRecord(
        phase=Phase.CONCEPTUALIZE, output=f"{thought}\n{words(10)}", parse_ok=True, score=0.5
    )
    hyp = StepRecord(
        phase=Phase.REVISE,
        output=f"{thought}\nHypothesis: adds\nDecision: CONTINUE",
        parse_ok=True,
        score=0.5,
    )
    assert rewards.counted_words(plan) == 10 and rewards.counted_words(hyp) == 4
    record = EpisodeRecord(steps=(plan, hyp), done=False, timed_out=False)
    assert rewards.episode_rewards(record, PAPER) == pytest.approx([0.5, 1.0])
    # The visible answer still counts: 110 words over tau = 100 cost 0.5.
    long_plan = dataclasses.replace(plan, output=f"{thought}\n{words(110)}")
    record = EpisodeRecord(steps=(long_plan,), done=False, timed_out=False)
    assert rewards.episode_rewards(record, PAPER) == pytest.approx([0.0])


def test_timeout_rule_add_or_replace():
    record = EpisodeRecord(
        steps=(reasoning(5, 0.4), inputs(3), reflection(5, 0.1), reasoning(120, 0.9)),
        done=False,
        timed_out=True,
    )
    # Paper ('add'): the CONTINUE that ran into the limit (no call left after it) is scored as
    # the end it is, 2 * (0.1 - 1); the last plan keeps its length penalty (-1.0) only, and
    # the timeout is added to it.
    assert rewards.episode_rewards(record, PAPER) == pytest.approx([0.4, 0.025, -1.8, -2.0])
    # Released: the step that hits the limit is not scored; its reward is the timeout alone.
    replace = RewardConfig(timeout_rule="replace")
    assert rewards.episode_rewards(record, replace) == pytest.approx([0.4, 0.025, -1.8, -1.0])
    terms = rewards.episode_terms(record, replace)[-1]
    assert terms == dict.fromkeys(rewards.TERMS, 0.0) | {"timeout": -1.0}
    # The formulas read literally (the released code): b_term +1 for that CONTINUE, the timeout
    # on the last step's own terms ('add') or as its whole reward ('replace').
    literal = RewardConfig(futile_continue="literal")
    assert rewards.episode_rewards(record, literal) == pytest.approx([0.4, 0.025, 2.2, -1.1])
    released = RewardConfig(futile_continue="literal", timeout_rule="replace")
    assert rewards.episode_rewards(record, released) == pytest.approx([0.4, 0.025, 2.2, -1.0])
    with pytest.raises(ValueError, match="timeout_rule"):
        RewardConfig(timeout_rule="drop")
    with pytest.raises(ValueError, match="futile_continue"):
        RewardConfig(futile_continue="bonus")


def _at_the_limit(decision_score, *, done, then=()):
    """T_max = 40: 12 cycles, a plan, a call, the last reflection (no call left after it)."""
    cycle = (reasoning(5, 0.5), inputs(3), reflection(5, 0.5))
    steps = cycle * 12 + (reasoning(5, 0.5), inputs(3), reflection(5, decision_score)) + then
    return EpisodeRecord(steps=steps, done=done, timed_out=not done)


@pytest.mark.parametrize("score", [0.1, 0.29, 0.5, 0.9])
def test_a_continue_with_no_call_left_pays_no_more_than_stop(score):
    # With no call left a CONTINUE explores nothing: it can only run into T_max. It used to earn
    # b_term +1 for s < 0.3 (4 more than STOP) while nothing charged the step it bought.
    stop = rewards.episode_rewards(_at_the_limit(score, done=True), PAPER)
    more = rewards.episode_rewards(
        _at_the_limit(score, done=False, then=(reasoning(5, 1.0),)), PAPER
    )
    assert len(stop) == 39 and len(more) == 40 and stop[:38] == more[:38]
    assert more[38] <= stop[38]
    assert sum(more[38:]) <= stop[38] + PAPER.timeout_reward


def test_a_continue_when_the_budget_is_spent_is_scored_as_the_end_it_is():
    steps = (reasoning(5, 0.5), inputs(3), reflection(5, 0.1))
    spent = EpisodeRecord(steps=steps, done=False, timed_out=False, budget_spent=True)
    stop = EpisodeRecord(steps=steps, done=True, timed_out=False)
    assert rewards.episode_rewards(spent, PAPER) == rewards.episode_rewards(stop, PAPER)
    assert rewards.episode_rewards(spent, PAPER)[-1] == pytest.approx(2 * (0.1 - 1))
    # An episode cut off for another reason (a prompt too long) had calls left: +1 stands.
    cut = EpisodeRecord(steps=steps, done=False, timed_out=False)
    assert rewards.episode_rewards(cut, PAPER)[-1] == pytest.approx(2 * (0.1 + 1))


@pytest.mark.parametrize("n_words", [117, 120, 500])
def test_a_long_correct_stop_outranks_a_short_continue(n_words):
    # Near the thresholds a correct STOP earns 2 * (0.7 + 1) and a CONTINUE on a bad hypothesis
    # 2 * (0.3 + 1): a gap of 0.8, which a length penalty capped at 1 used to overturn.
    stop = EpisodeRecord(steps=(reflection(n_words, 0.7 + 1e-9),), done=True, timed_out=False)
    more = EpisodeRecord(steps=(reflection(2, 0.3 - 1e-9),), done=False, timed_out=False)
    assert rewards.episode_rewards(stop, PAPER)[0] > rewards.episode_rewards(more, PAPER)[0]
    gap = PAPER.lambda_h * (PAPER.stop_threshold - PAPER.continue_threshold)
    assert PAPER.reflection_length_cap < gap
    # The reasoning and input steps keep the paper's cap of 1.
    assert rewards.length_penalty(500, tau=100, alpha=0.05) == -1.0
    assert rewards.length_penalty(500, tau=100, alpha=0.05, cap=0.5) == -0.5


def test_invalid_records_fail_loudly():
    with pytest.raises(ValueError, match="ends one way"):
        rewards.episode_rewards(
            EpisodeRecord(steps=(reflection(1, 0.9),), done=True, timed_out=True), PAPER
        )
    with pytest.raises(ValueError, match="REVISE"):
        rewards.episode_rewards(
            EpisodeRecord(steps=(inputs(1),), done=True, timed_out=False), PAPER
        )
    with pytest.raises(ValueError, match="critic score"):
        bad = dataclasses.replace(inputs(1), score=0.5)
        rewards.episode_rewards(EpisodeRecord(steps=(bad,), done=False, timed_out=False), PAPER)
    with pytest.raises(ValueError, match="call_ok"):
        bad = inputs(1, call_ok=None)
        rewards.episode_rewards(EpisodeRecord(steps=(bad,), done=False, timed_out=False), PAPER)


@dataclasses.dataclass
class FakeResult:
    ok: bool
    value: object = None
    error_type: str = ""
    error_message: str = ""


def _task():
    return episode.Task(
        task_id="t",
        header="def test_func(arg0, arg1):",
        n_params=2,
        examples=(Observation(call="test_func(1, 2)", result="3"),),
    )


def test_records_from_real_episodes():
    config = EpisodeConfig()
    state = episode.start(_task(), config)
    state = episode.on_conceptualize(state, "try two small numbers", config)
    state, args = episode.on_generate(state, "```\n(2, 5)\n```", config)
    state = episode.on_result(state, FakeResult(ok=True, value=7), config)
    state = episode.on_revise(state, "Hypothesis: adds\nDecision: CONTINUE", config)
    state = episode.on_conceptualize(state, "try strings", config)
    state, args = episode.on_generate(state, "```\n('a', 1)\n```", config)
    state = episode.on_result(
        state, FakeResult(ok=False, error_type="TypeError", error_message="no"), config
    )
    state = episode.on_revise(state, "Hypothesis: adds numbers\nDecision: STOP", config)
    record = rewards.record_from_state(state, [0.5, None, 0.2, 0.6, None, 0.9])
    assert record.done and not record.timed_out
    assert [s.call_ok for s in record.steps] == [None, True, None, None, False, None]
    assert [s.input_text for s in record.steps] == ["", "(2, 5)", "", "", "('a', 1)", ""]
    # 0.5 | 0.025 | 2 * (0.2 + 1) | 0.6 | -0.5 | 2 * (0.9 + 1)
    assert rewards.episode_rewards(record, PAPER) == pytest.approx(
        [0.5, 0.025, 2.4, 0.6, -0.5, 3.8]
    )
    with pytest.raises(ValueError, match="one score"):
        rewards.record_from_state(state, [0.5])

    short = EpisodeConfig(max_steps=2)
    state = episode.start(_task(), short)
    state = episode.on_conceptualize(state, "think", short)
    state, _ = episode.on_generate(state, "```\n(1, 1)\n```", short)
    state = episode.on_result(state, FakeResult(ok=True, value=2), short)
    record = rewards.record_from_state(state, [0.0, None])
    assert record.timed_out and not record.done
    assert rewards.episode_rewards(record, PAPER) == pytest.approx([0.0, 0.025 - 1.0])
