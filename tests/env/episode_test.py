"""Transitions of the episode state machine, driven by scripted outputs."""

import dataclasses

import pytest

from pau_jax.env import episode
from pau_jax.env.display import literal_call, render_call
from pau_jax.env.episode import EpisodeConfig, Phase
from pau_jax.env.prompts import Observation
from pau_jax.sandbox import parse_call_args


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
    with pytest.raises(ValueError, match="example_style"):
        EpisodeConfig(example_style="hints")


def test_the_placeholder_style_shows_a_form_and_values_stay_the_default():
    import dataclasses

    task = dataclasses.replace(make_task(), shown_args=((1, 2),))
    prompts = {}
    for style in ("values", "placeholders"):
        config = EpisodeConfig(example_style=style)
        state = episode.on_conceptualize(episode.start(task, config), "try zero", config)
        prompts[style] = episode.messages(state, config)[-1]["content"]
    assert "For example:\n```\n(4, 5)\n```" in prompts["values"]
    assert "The form to fill in:\n```\n(<int>, <int>)\n```" in prompts["placeholders"]
    # The form says that a shown example needs no call (its result is on the page).
    assert "calling the function with one of them teaches you nothing" in prompts["placeholders"]
    assert "teaches you nothing" not in prompts["values"]
    assert EpisodeConfig().example_style == "values"


def _calls_left_in_prompt(state, config) -> int:
    content = episode.messages(state, config)[-1]["content"]
    return int(content.split("Calls left: ")[1].split()[0])


def test_prompts_show_the_calls_the_step_limit_still_allows():
    # T_max = 40 phases reach 13 calls, so a budget of 25 never shows as 25 - n.
    config = EpisodeConfig(call_budget=25, max_steps=40)
    state = episode.start(make_task(), config)
    shown, made = [], []
    while state.phase is not Phase.DONE:
        shown.append((state.phase, _calls_left_in_prompt(state, config)))
        made.append(state.n_calls)
        if state.phase is Phase.CONCEPTUALIZE:
            state = episode.on_conceptualize(state, "plan", config)
        elif state.phase is Phase.GENERATE:
            state, args = episode.on_generate(state, "(1, 2)", config)
            state = episode.on_result(state, add(args), config)
        else:
            state = episode.on_revise(state, "Hypothesis: adds\nDecision: CONTINUE", config)
    assert state.finish_reason == "max_steps" and state.n_calls == 13
    assert shown[0] == (Phase.CONCEPTUALIZE, 13)
    # Every prompt's count is exactly the calls still made after it (the current one included).
    for (phase, left), before in zip(shown, made):
        after = state.n_calls - before
        assert left == after, (phase, left, after)
    # At the boundary: the last reflection before the timeout and the final reasoning show 0.
    assert shown[-2] == (Phase.REVISE, 0) and shown[-1] == (Phase.CONCEPTUALIZE, 0)
    assert shown[-3] == (Phase.GENERATE, 1)


@pytest.mark.parametrize("max_steps", [1, 2, 3, 4, 5, 6, 7, 41, 42])
def test_calls_left_counts_reachable_generate_steps(max_steps):
    config = EpisodeConfig(call_budget=25, max_steps=max_steps)
    state = episode.start(make_task(), config)
    # From the start, the GENERATE phases at steps 2, 5, 8, ... (1-based) within max_steps.
    assert episode.calls_left(state, config) == len(range(2, max_steps + 1, 3))


def test_calls_left_is_the_budget_when_it_binds_first():
    config = EpisodeConfig(call_budget=2, max_steps=40)
    state = episode.start(make_task(), config)
    assert _calls_left_in_prompt(state, config) == 2
    state = run_query(state, config, "(1, 1)", add, "Hypothesis: adds\nDecision: CONTINUE")
    assert _calls_left_in_prompt(state, config) == 1
    unlimited = EpisodeConfig(call_budget=3)
    assert episode.calls_left(episode.start(make_task(), unlimited), unlimited) == 3


def _two_example_task():
    return episode.Task(
        task_id="t2",
        header="def test_func(arg0, arg1):",
        n_params=2,
        examples=(
            Observation(call="test_func(1, 2)", result="3"),
            Observation(call="test_func(4, 5)", result="9"),
        ),
    )


def _after_calls(config, n):
    state = episode.start(_two_example_task(), config)
    for i in range(n):
        state = run_query(state, config, f"({i}, 100)", add, "Hypothesis: adds\nDecision: CONTINUE")
    return state


def test_a_window_over_examples_and_calls_scrolls_the_examples_out():
    # Released evaluation: the last 10 of (2 examples + calls): after 8 calls both examples
    # are in view, after 9 the first is gone, after 10 both.
    config = EpisodeConfig(call_budget=20, history_window=10, window_includes_examples=True)
    for n, examples in ((8, 2), (9, 1), (10, 0), (12, 0)):
        v = episode.view(_after_calls(config, n), config)
        assert len(v.examples) == examples and len(v.examples) + len(v.observations) == 10
        assert v.observations[-1].call == f"test_func({n - 1}, 100)"
    prompt = episode.messages(_after_calls(config, 10), config)[-1]["content"]
    assert "test_func(1, 2) -> 3" not in prompt and "(no longer shown)" in prompt
    # Released training window of 5: examples scroll out after 3 calls.
    rl = EpisodeConfig(history_window=5, window_includes_examples=True)
    assert len(episode.view(_after_calls(rl, 3), rl).examples) == 2
    assert len(episode.view(_after_calls(rl, 4), rl).examples) == 1
    # Paper: the window (if any) covers the calls only; the examples stay.
    paper = EpisodeConfig(history_window=5)
    v = episode.view(_after_calls(paper, 9), paper)
    assert len(v.examples) == 2 and len(v.observations) == 5


def test_the_released_reflection_shows_the_newest_call_without_its_result():
    config = EpisodeConfig(reflection_sees_newest=False, failed_input_display="literal")
    state = _after_calls(config, 1)
    state = episode.on_conceptualize(state, "p", config)
    state, args = episode.on_generate(state, "```\n(7, 100)\n```", config)
    state = episode.on_result(state, add(args), config)
    prompt = episode.messages(state, config)[-1]["content"]
    assert "You just called:\ntest_func(7, 100)\n" in prompt
    assert "107" not in prompt and "test_func(0, 100) -> 100" in prompt
    # A parse failure is shown with its error, as the released harness shows it.
    state = episode.on_revise(state, "Hypothesis: adds\nDecision: CONTINUE", config)
    state = episode.on_conceptualize(state, "p", config)
    state, args = episode.on_generate(state, "```\n(1, 2, 3)\n```", config)
    prompt = episode.messages(state, config)[-1]["content"]
    assert "You just called:\ntest_func(1, 2, 3) -> InputParseError" in prompt
    # The paper's reflection shows the newest result with the others, and no extra line.
    paper = EpisodeConfig()
    state = _after_calls(paper, 1)
    state = episode.on_conceptualize(state, "p", paper)
    state, args = episode.on_generate(state, "(7, 100)", paper)
    state = episode.on_result(state, add(args), paper)
    prompt = episode.messages(state, paper)[-1]["content"]
    assert "test_func(7, 100) -> 107" in prompt and "You just called" not in prompt


def test_str_mode_shows_the_agents_literal_argument_text():
    config = EpisodeConfig(display_mode="str")
    task = episode.Task(task_id="t3", header="def test_func(a, b, c):", n_params=3, examples=())
    state = episode.on_conceptualize(episode.start(task, config), "p", config)
    state, args = episode.on_generate(state, "```\n('5', 5, 'a b')\n```", config)
    assert args == ("5", 5, "a b") and state.pending_call == "test_func('5', 5, 'a b')"
    state = episode.on_result(state, FakeResult(ok=True, value="5 5 a b"), config)
    assert state.observations[-1] == Observation(call="test_func('5', 5, 'a b')", result="5 5 a b")
    # As written, spacing included; a bare value is wrapped.
    assert literal_call("(1,'x')") == "test_func(1,'x')"
    assert literal_call(" [1, 2] ") == "test_func([1, 2])"
    assert render_call(("5", 5, "a b"), "str") == "test_func('5', 5, 'a b')"
    # repr mode renders from the parsed values.
    config = EpisodeConfig()
    state = episode.on_conceptualize(episode.start(task, config), "p", config)
    state, _ = episode.on_generate(state, "('5',5,'a b')", config)
    assert state.pending_call == "test_func('5', 5, 'a b')"


def test_a_prompt_too_long_ends_the_episode_without_a_step():
    config = EpisodeConfig()
    state = _after_calls(config, 1)
    ended = episode.on_prompt_too_long(state, config)
    assert ended.phase is Phase.DONE and ended.finish_reason == "prompt_length"
    assert ended.steps == state.steps and ended.n_calls == 1
    with pytest.raises(ValueError, match="already finished"):
        episode.on_prompt_too_long(ended, config)


def test_the_lenient_parser_reads_a_fenced_call_and_strict_does_not():
    text = "```python\ntest_func(4, 5)\n```"
    for fmt, expected in (("lenient", (4, 5)), ("strict", None)):
        config = EpisodeConfig(input_format=fmt)
        state = episode.on_conceptualize(episode.start(make_task(), config), "p", config)
        _, args = episode.on_generate(state, text, config)
        assert args == expected


def test_the_lenient_parser_takes_the_first_reading_with_the_right_arity():
    config = EpisodeConfig()
    state = episode.on_conceptualize(episode.start(make_task(), config), "p", config)
    text = "```\n(1, 2)\n```\nno, rather\n```\n(1, 2, 3)\n```"
    _, args = episode.on_generate(state, text, config)
    assert args == (1, 2)


def test_a_failed_input_shows_the_error_not_the_text_unless_released():
    text = "```python\ndef test_func(arg0, arg1):\n    return arg0\n```"
    shown = {}
    for display in ("error", "literal"):
        config = EpisodeConfig(failed_input_display=display, input_format="strict")
        state = episode.on_conceptualize(episode.start(make_task(), config), "p", config)
        state, args = episode.on_generate(state, text, config)
        assert args is None
        shown[display] = state.observations[-1].call
    assert shown["error"] == "test_func(?)"
    assert shown["literal"].startswith("test_func(def test_func")


def test_the_generation_prompt_example_has_the_function_arity():
    config = EpisodeConfig()
    for n_params, shown in ((1, (([1, 2],),)), (2, (("ab", 3),))):
        task = dataclasses.replace(make_task(n_params), shown_args=shown)
        state = episode.on_conceptualize(episode.start(task, config), "p", config)
        prompt = episode.messages(state, config)[-1]["content"]
        example = prompt.split("For example:\n```\n")[1].split("\n```")[0]
        assert len(parse_call_args(example, n_params)) == n_params
        assert f"exactly {n_params} literal" in prompt
        assert "(3, 'abc', [1, 2])" not in prompt


@pytest.mark.parametrize("field,value", [("input_format", "loose"), ("failed_input_display", "x")])
def test_bad_input_switches_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        EpisodeConfig(**{field: value})
