"""The optional start of an episode from an earlier one: hypothesis, prior calls, critique."""

import dataclasses
import hashlib
import json

from pau_jax.env import episode, prompts
from pau_jax.env.episode import EpisodeConfig, Phase
from pau_jax.env.prompts import Observation


@dataclasses.dataclass
class FakeResult:
    ok: bool
    value: object = None
    error_type: str = ""
    error_message: str = ""


TASK = episode.Task(
    task_id="t0",
    header="def test_func(arg0, arg1):",
    n_params=2,
    examples=(
        Observation(call="test_func(1, 2)", result="3"),
        Observation(call="test_func('a', 'b')", result="'ab'"),
    ),
)
PRIOR = (
    Observation(call="test_func(5, 5)", result="10"),
    Observation(call="test_func([], [])", result="[]"),
)
CONFIGS = (
    EpisodeConfig(),
    EpisodeConfig(
        call_budget=20,
        history_window=3,
        window_includes_examples=True,
        reflection_sees_newest=False,
        display_mode="str",
    ),
    EpisodeConfig(max_steps=40, history_window=2),
)
QUERIES = (
    ("(2, 5)", FakeResult(True, 7)),
    ("(x", None),
    ("('c', 'd')", FakeResult(False, None, "TypeError", "bad")),
    ("(0, 0)", FakeResult(True, 0)),
)


def _all_prompts(task, config):
    """Every prompt of four scripted queries (a parse failure and an error among them)."""
    out, state = [], episode.start(task, config)
    for i, (args, result) in enumerate(QUERIES):
        out.append(episode.messages(state, config))
        state = episode.on_conceptualize(state, f"plan {i}", config)
        out.append(episode.messages(state, config))
        state, parsed = episode.on_generate(state, f"```\n{args}\n```", config)
        if parsed is not None:
            state = episode.on_result(state, result, config)
        out.append(episode.messages(state, config))
        state = episode.on_revise(state, f"Hypothesis: h{i}\nDecision: CONTINUE", config)
    return out


def test_default_fields_keep_todays_prompts_byte_identical():
    # The digest of every prompt of the three protocols and the in-context prompt (prompts
    # pau-v2), taken from the code without the optional fields set.
    out = [p for config in CONFIGS for p in _all_prompts(TASK, config)]
    out.append(
        prompts.in_context_messages(prompts.EpisodeView(header=TASK.header, examples=TASK.examples))
    )
    digest = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()
    assert len(out) == 37
    assert digest == "7f8204324c73e94399cfc8ec617ca11f656413ade62107a4ee502f2a6640fa0d"


def test_initial_hypothesis_prior_calls_and_critique_are_shown_where_they_belong():
    task = dataclasses.replace(
        TASK, initial_hypothesis="adds its arguments", prior_observations=PRIOR, critique="try []"
    )
    config = EpisodeConfig()
    state = episode.start(task, config)
    assert state.hypothesis == "adds its arguments" and state.n_calls == 0
    first = episode.messages(state, config)[-1]["content"]
    assert "Current hypothesis:\nadds its arguments" in first
    assert (
        "earlier attempt on this function:\ntest_func(5, 5) -> 10\ntest_func([], []) -> []" in first
    )
    assert "Lessons from your earlier explorations of similar functions:\ntry []" in first
    # The prior calls come before the examples; the episode's own calls start empty.
    assert first.index("earlier attempt") < first.index("Examples given to you")
    assert "Your calls so far:\n(none yet)" in first
    state = episode.on_conceptualize(state, "plan", config)
    generate = episode.messages(state, config)[-1]["content"]
    assert "test_func(5, 5) -> 10" in generate and "try []" not in generate
    state, args = episode.on_generate(state, "```\n(2, 2)\n```", config)
    state = episode.on_result(state, FakeResult(True, 4), config)
    revise = episode.messages(state, config)[-1]["content"]
    assert "test_func(5, 5) -> 10" in revise and "try []" not in revise
    assert state.n_calls == 1 and state.observations[-1].call == "test_func(2, 2)"
    # A revision without a hypothesis keeps the initial one as the prediction.
    state = episode.on_revise(state, "Decision: CONTINUE", config)
    assert state.prediction == "adds its arguments"
    state = episode.on_conceptualize(state, "again", config)
    assert state.phase is Phase.GENERATE


def test_a_window_over_examples_runs_over_the_prior_calls_too():
    task = dataclasses.replace(TASK, prior_observations=PRIOR)
    config = EpisodeConfig(history_window=3, window_includes_examples=True)
    state = episode.start(task, config)
    view = episode.view(state, config)
    assert view.examples == TASK.examples[1:] and view.prior_observations == PRIOR
    state = episode.on_conceptualize(state, "plan", config)
    state, _ = episode.on_generate(state, "```\n(2, 2)\n```", config)
    state = episode.on_result(state, FakeResult(True, 4), config)
    view = episode.view(state, config)
    assert view.examples == () and view.prior_observations == PRIOR
    assert [o.call for o in view.observations] == ["test_func(2, 2)"]
    # Without the examples in the window, the prior calls stay in view like the examples.
    config = EpisodeConfig(history_window=1)
    view = episode.view(episode.start(task, config), config)
    assert view.prior_observations == PRIOR and view.examples == TASK.examples
