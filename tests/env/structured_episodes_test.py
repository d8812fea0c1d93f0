"""Structured decoding through the episode runner: a random model over the real Qwen vocabulary
writes inputs every phase parses, with the arity of each task, only when the switch is on."""

import dataclasses

import checkpoints
import pytest
from flax import nnx

from pau_jax.env import episode, parse, runner
from pau_jax.env.answer_shape import AnswerShape, answer_shape
from pau_jax.env.episode import EpisodeConfig, Phase
from pau_jax.models import qwen3
from pau_jax.policy.backends import Seat
from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.local import LocalPolicy
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.sandbox import Executor, parse_call_args
from pau_jax.tasks import demo as demo_tasks

CONFIG = EpisodeConfig(call_budget=2, max_steps=6)


@pytest.fixture(scope="module")
def setup():
    from pau_jax.tokenizer import load_tokenizer

    config = checkpoints.tiny_qwen3_config(max_position_embeddings=4096)
    model = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(1))
    with Executor(workers=2) as executor:
        yield model, load_tokenizer("qwen3-offline"), executor


def _run(setup, structured):
    model, tokenizer, executor = setup
    sampling = SamplingConfig(max_new_tokens=48, temperature=1.0, seed=3, structured=structured)
    policy = Seat("agent", LocalPolicy(model, tokenizer, sampling))
    specs = demo_tasks.demo_specs(executor, CONFIG)
    finished = runner.run_episode_states(specs, policy, executor, CONFIG, progress=False)
    return [(f.spec.task, s) for f in finished for s in f.state.steps]


def test_constrained_inputs_all_parse_with_the_task_arity(setup):
    steps = _run(setup, "constrain_inputs")
    inputs = [(n, s) for n, s in steps if s.phase is Phase.GENERATE]
    assert len(inputs) >= 8  # 4 tasks, budget 2: every input call is made
    bad = [(t.n_params, s.output, s.parse_error) for t, s in inputs if not s.parse_ok]
    assert not bad, bad[:3]
    assert {t.n_params for t, _ in inputs} == {1, 2}
    # The same random model without the switch writes no parsable input.
    plain = [s for _, s in _run(setup, "off") if s.phase is Phase.GENERATE]
    assert plain and not any(s.parse_ok for s in plain)


def test_typed_inputs_give_each_argument_the_type_of_the_shown_examples(setup):
    steps = _run(setup, "typed_inputs")
    inputs = [(t, s) for t, s in steps if s.phase is Phase.GENERATE]
    assert len(inputs) >= 8 and all(s.parse_ok for _, s in inputs), [s.output for _, s in inputs]
    for task, s in inputs:
        types = {tuple(type(v) for v in args) for args in task.shown_args}
        args = parse_call_args(s.input_text, task.n_params)
        assert tuple(type(v) for v in args) in types, (s.output, types)


def test_an_input_that_repeats_a_seen_call_is_redrawn(setup):
    model, tokenizer, _ = setup
    conversation = [[{"role": "user", "content": "Write the arguments of test_func(arg0)."}]]
    greedy = SamplingConfig(max_new_tokens=40, structured="constrain_inputs")
    first = LocalPolicy(model, tokenizer, greedy).complete(
        conversation, answers=[AnswerShape("input", 1)]
    )[0]
    _, args, _ = parse.read_input(first.text, 1, "lenient")
    assert args is not None
    seen = AnswerShape("input", 1, seen=frozenset({repr(tuple(args))}))
    assert seen.repeats(first.text) and not AnswerShape("input", 1).repeats(first.text)
    # Without redraws the greedy reply repeats the seen call; with them it does not.
    same = LocalPolicy(model, tokenizer, greedy).complete(conversation, answers=[seen])[0]
    assert same.text == first.text
    policy = LocalPolicy(model, tokenizer, dataclasses.replace(greedy, resample_repeats=3))
    redrawn = policy.complete(conversation, answers=[seen])[0]
    assert policy.last_stats["redrawn"] >= 1
    assert not seen.repeats(redrawn.text), redrawn.text
    _, new_args, _ = parse.read_input(redrawn.text, 1, "lenient")
    assert new_args is not None  # still a parsed input: the redraw keeps the mask


def test_the_seen_arguments_are_the_shown_examples_and_the_inputs_read(setup):
    _, _, executor = setup
    spec = demo_tasks.demo_specs(executor, CONFIG)[0]  # affine: shown (2, 3), (0, 5)
    state = episode.start(spec.task, CONFIG)
    state = episode.on_conceptualize(state, "try (7, 8)", CONFIG)
    shape = answer_shape(state, CONFIG)
    assert shape.seen == {"(2, 3)", "(0, 5)"} and shape.repeats("```\n(0, 5)\n```")
    state, _ = episode.on_generate(state, "```\n(7, 8)\n```", CONFIG)
    state = episode.on_result(state, executor.call(spec.code, (7, 8), timeout_s=2.0), CONFIG)
    state = episode.on_revise(state, "Hypothesis: x\nDecision: CONTINUE", CONFIG)
    state = episode.on_conceptualize(state, "again", CONFIG)
    assert answer_shape(state, CONFIG).repeats("Input: (7, 8)")


def test_the_switch_is_checked_and_redraws_stay_out_of_rollouts():
    with pytest.raises(ValueError, match="structured must be one of"):
        SamplingConfig(structured="on")
    with pytest.raises(ValueError, match="does not read thinking"):
        SamplingConfig(structured="end_at_answer", enable_thinking=True)
    # Masked rollouts are allowed: the learner scores each token under its mask
    # (rl/masked_learner_test.py).
    for mode in ("constrain_inputs", "typed_inputs"):
        RolloutConfig(sampling=SamplingConfig(temperature=1.0, structured=mode))
    with pytest.raises(ValueError, match="resample_repeats is for evaluation only"):
        RolloutConfig(sampling=SamplingConfig(temperature=1.0, resample_repeats=1))
    with pytest.raises(ValueError, match="resample_repeats must be >= 0"):
        SamplingConfig(resample_repeats=-1)
    RolloutConfig(sampling=SamplingConfig(temperature=1.0, structured="end_at_answer"))
