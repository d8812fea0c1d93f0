"""Transitions of the episode state machine, driven by scripted outputs."""

import dataclasses

import pytest

from pau_jax.env import episode
from pau_jax.env.episode import EpisodeConfig, Phase
from pau_jax.env.prompts import Observation


@dataclasses.dataclass
class FakeResult:
    ok: bool
    value: object = None
    error_type: str = ""
    error_message: str = ""


def make_task(n_params=2):
    return episode.Task(
        task_id="t0",
        header="def test_func(arg0, arg1):" if n_params == 2 else "def test_func(arg0):",
        n_params=n_params,
        examples=(Observation(call="test_func(1, 2)", result="3"),),
    )


def run_query(state, config, args_text, result, revision):
    state = episode.on_conceptualize(state, "try small numbers", config)
    assert state.phase is Phase.GENERATE
    state, args = episode.on_generate(state, f"```\n{args_text}\n```", config)
    if args is not None:
        state = episode.on_result(state, result(args), config)
    assert state.phase in (Phase.REVISE, Phase.DONE)
    if state.phase is Phase.REVISE:
        state = episode.on_revise(state, revision, config)
    return state


def add(args):
    return FakeResult(ok=True, value=args[0] + args[1])


def test_stop_ends_episode_with_hypothesis():
    config = EpisodeConfig()
    state = episode.start(make_task(), config)
    state = run_query(state, config, "(2, 5)", add, "Hypothesis: adds\nDecision: CONTINUE")
    assert state.phase is Phase.CONCEPTUALIZE and state.n_calls == 1
    state = run_query(
        state, config, "('a', 'b')", add, "Hypothesis: adds or concatenates\nDecision: STOP"
    )
    assert state.phase is Phase.DONE
    assert state.finish_reason == "stop" and state.stopped_by_agent
    assert state.prediction == "adds or concatenates"
    assert [o.result for o in state.observations] == ["7", "'ab'"]
    assert state.observations[1].call == "test_func('a', 'b')"
    assert len(state.steps) == 6


def test_budget_ends_episode():
    config = EpisodeConfig(call_budget=2)
    state = episode.start(make_task(), config)
    for _ in range(2):
        state = run_query(state, config, "(1, 1)", add, "Hypothesis: adds\nDecision: CONTINUE")
    assert state.phase is Phase.DONE and state.finish_reason == "budget"
    assert not state.stopped_by_agent


def test_max_steps_counts_phases():
    config = EpisodeConfig(max_steps=4)
    state = episode.start(make_task(), config)
    state = run_query(state, config, "(1, 1)", add, "Hypothesis: adds\nDecision: CONTINUE")
    assert state.phase is Phase.CONCEPTUALIZE
    state = episode.on_conceptualize(state, "more", config)
    assert state.phase is Phase.DONE and state.finish_reason == "max_steps"
    assert len(state.steps) == 4


def test_parse_failure_uses_a_call_and_is_shown():
    config = EpisodeConfig()
    state = episode.start(make_task(), config)
    state = episode.on_conceptualize(state, "plan", config)
    state, args = episode.on_generate(state, "```\nimport os\n```", config)
    assert args is None and state.phase is Phase.REVISE and state.n_calls == 1
    assert state.observations[-1].result.startswith("InputParseError: ")
    assert not state.steps[-1].parse_ok


def test_wrong_arity_is_a_parse_failure():
    config = EpisodeConfig()
    state = episode.on_conceptualize(episode.start(make_task(), config), "plan", config)
    state, args = episode.on_generate(state, "```\n(1, 2, 3)\n```", config)
    assert args is None
    assert "InputParseError" in state.observations[-1].result


def test_single_list_argument_is_not_spread():
    config = EpisodeConfig()
    state = episode.on_conceptualize(episode.start(make_task(n_params=1), config), "p", config)
    state, args = episode.on_generate(state, "```\n[1, 2, 3]\n```", config)
    assert args == ([1, 2, 3],)
    assert state.pending_call == "test_func([1, 2, 3])"


def test_errors_and_types_displayed_by_mode():
    for mode, want_err, want_val in (("repr", "TypeError: bad", "'5'"), ("str", "bad", "5")):
        config = EpisodeConfig(display_mode=mode)
        state = episode.on_conceptualize(episode.start(make_task(), config), "p", config)
        state, args = episode.on_generate(state, "(1, 2)", config)
        err = episode.on_result(
            state, FakeResult(ok=False, error_type="TypeError", error_message="bad"), config
        )
        ok = episode.on_result(state, FakeResult(ok=True, value="5"), config)
        assert err.observations[-1].result == want_err
        assert ok.observations[-1].result == want_val


def test_reflection_sees_newest_and_window():
    def revise_prompt(config):
        state = episode.start(make_task(), config)
        for i in range(3):
            state = episode.on_conceptualize(state, "p", config)
            state, args = episode.on_generate(state, f"({i}, 100)", config)
            state = episode.on_result(state, add(args), config)
            if i < 2:
                state = episode.on_revise(state, "Hypothesis: adds\nDecision: CONTINUE", config)
        return episode.messages(state, config)[-1]["content"]

    paper = revise_prompt(EpisodeConfig())
    assert "test_func(2, 100) -> 102" in paper and "test_func(0, 100) -> 100" in paper
    released = revise_prompt(EpisodeConfig(reflection_sees_newest=False))
    assert "test_func(2, 100) -> 102" not in released and "test_func(1, 100) -> 101" in released
    windowed = revise_prompt(EpisodeConfig(history_window=1))
    assert "test_func(2, 100) -> 102" in windowed and "test_func(1, 100)" not in windowed


def test_wrong_phase_raises():
    config = EpisodeConfig()
    state = episode.start(make_task(), config)
    with pytest.raises(ValueError, match="phase conceptualize"):
        episode.on_revise(state, "Decision: STOP", config)


def test_bad_config_raises():
    with pytest.raises(ValueError, match="display_mode"):
        EpisodeConfig(display_mode="json")
    with pytest.raises(ValueError, match="call_budget"):
        EpisodeConfig(call_budget=0)
