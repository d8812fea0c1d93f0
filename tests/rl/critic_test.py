"""The critic: its prompts per privilege level, rating parsing, batched scoring, shared base arrays."""

import types

import checkpoints
import jax
import numpy as np
import pytest
import rl_testlib as lib
from flax import nnx

from pau_jax.env import episode, prompts
from pau_jax.env.episode import EpisodeConfig, Phase
from pau_jax.rl import critic
from pau_jax.rl.critic import CriticConfig
from pau_jax.tasks import TaskReference
from pau_jax.training import step as step_lib

CONFIG = EpisodeConfig(call_budget=5)
TASK = episode.Task(
    task_id="t/affine",
    header="def test_func(arg0, arg1):",
    n_params=2,
    examples=(prompts.Observation(call="test_func(2, 3)", result="7"),),
)
REFERENCES = {
    "t/affine": TaskReference(
        description="Returns the product of the two arguments plus one.",
        code="def test_func(arg0, arg1):\n    return arg0 * arg1 + 1\n",
    )
}


def _ok(value):
    return types.SimpleNamespace(ok=True, value=value, error_type="", error_message="")


def finished_state(queries=2, stop=True):
    """An episode of `queries` full queries (reasoning, input, revision), ending with STOP."""
    state = episode.start(TASK, CONFIG)
    for q in range(queries):
        state = episode.on_conceptualize(state, f"plan {q}: try ({q}, 4)", CONFIG)
        state, args = episode.on_generate(state, f"```\n({q}, 4)\n```", CONFIG)
        state = episode.on_result(state, _ok(q * 4 + 1), CONFIG)
        decision = "STOP" if stop and q == queries - 1 else "CONTINUE"
        state = episode.on_revise(state, f"Hypothesis: guess {q}\nDecision: {decision}", CONFIG)
    assert state.phase is Phase.DONE
    return state


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The plan is good.\nRating: 9", 1.0),
        ("Rating: 0", 0.0),
        ("**Rating:** 6/9", 6 / 9),
        ("rating = 4.5", 0.5),
        ("Rating: 3\nOn reflection... Rating: 6", 6 / 9),
        ("<think>Rating: 1</think>Rating: 8", 8 / 9),
        ("Rating: 12", 1.0),
        ("Rating: -2", 0.0),
        ("I would give it a seven.", None),
        ("Rating: X", None),
        ("", None),
    ],
)
def test_parse_score(text, expected):
    got = critic.parse_score(text)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_released_scores_are_not_clamped():
    assert critic.parse_score("Rating: 12", clamp=False) == pytest.approx(12 / 9)
    assert critic.parse_score("Rating: -2", clamp=False) == pytest.approx(-2 / 9)
    assert critic.parse_score("Rating: 4", clamp=False) == pytest.approx(4 / 9)


def test_prompts_show_the_step_and_only_the_chosen_privileged_information():
    state = finished_state()
    gold, code = REFERENCES["t/affine"].description, "return arg0 * arg1 + 1"
    kinds = [s.phase for s in state.steps]
    assert critic.step_messages(state, 1, REFERENCES["t/affine"], CriticConfig()) is None
    for privileged, show_source, shows_gold, shows_code in [
        ("description", False, True, False),
        ("description+source", False, True, True),
        ("description", True, True, True),  # the released critic: description and source
        ("none", False, False, False),
        ("none", True, False, False),  # SYM-INFO stays symmetric under the released overlay
    ]:
        config = CriticConfig(privileged=privileged, show_source=show_source)
        for i, phase in enumerate(kinds):
            messages = critic.step_messages(state, i, REFERENCES["t/affine"], config)
            if phase is Phase.GENERATE:
                assert messages is None
                continue
            text = messages[-1]["content"]
            assert (gold in text) is shows_gold and (code in text) is shows_code
            assert "Rating: X" in text and "test_func(2, 3) -> 7" in text
    # The second reasoning step sees the first call and the first hypothesis, not later ones.
    reasoning = critic.step_messages(state, 3, REFERENCES["t/affine"], CriticConfig())
    text = reasoning[-1]["content"]
    assert "plan 1: try (1, 4)" in text and "test_func(0, 4) -> 1" in text
    assert "guess 0" in text and "test_func(1, 4)" not in text
    # A reflection sees the result of its own call and rates its own hypothesis.
    reflection = critic.step_messages(state, 5, REFERENCES["t/affine"], CriticConfig())
    text = reflection[-1]["content"]
    assert "test_func(1, 4) -> 5" in text and "guess 1" in text and "correctly" in text


def test_privileged_critic_needs_references():
    with pytest.raises(ValueError, match="Reference"):
        critic.score_episodes(
            lambda c: ["Rating: 1"] * len(c), [finished_state()], {}, CriticConfig()
        )
    # SYM-INFO needs none.
    out = critic.score_episodes(
        lambda c: ["Rating: 9"] * len(c), [finished_state()], None, CriticConfig(privileged="none")
    )
    assert out.unparsed == 0 and out.requested == 4


class ScriptedCritic:
    """Rates reasoning steps by the plan number and hypotheses by their guess number."""

    def __init__(self):
        self.batch_sizes = []

    def __call__(self, conversations):
        self.batch_sizes.append(len(conversations))
        replies = []
        for conversation in conversations:
            text = conversation[-1]["content"]
            step = text.split("The agent's plan for its next input:\n")
            if len(step) == 2:
                replies.append(f"Fine.\nRating: {int(step[1].split(':')[0].split()[-1]) + 3}")
            elif "guess 1" in text.split("The agent's hypothesis:")[-1]:
                replies.append("no rating at all")
            else:
                replies.append("Rating: 9")
        return replies


def test_scores_all_steps_of_all_episodes_in_one_call_and_counts_unparsed():
    states = [finished_state(2), finished_state(1)]
    policy = ScriptedCritic()
    out = critic.score_episodes(policy, states, REFERENCES, CriticConfig())
    assert policy.batch_sizes == [6]
    assert out.requested == 6 and out.unparsed == 1
    assert out.scores[0] == [pytest.approx(3 / 9), None, 1.0, pytest.approx(4 / 9), None, None]
    assert out.scores[1] == [pytest.approx(3 / 9), None, 1.0]
    assert out.raw[0][5] == "no rating at all" and out.raw[0][4] == ""
    chunked = ScriptedCritic()
    again = critic.score_episodes(chunked, states, REFERENCES, CriticConfig(max_batch_size=4))
    assert chunked.batch_sizes == [4, 2] and again.scores == out.scores


def _base_leaves(model):
    return jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))


def test_the_frozen_critic_shares_the_base_arrays_and_ignores_the_adapters():
    actor = lib.tiny_model()
    frozen = step_lib.reference_model(actor)
    pairs = list(zip(_base_leaves(actor), _base_leaves(frozen), strict=True))
    assert pairs and all(a is b for a, b in pairs)
    assert all(a.unsafe_buffer_pointer() == b.unsafe_buffer_pointer() for a, b in pairs)
    ids = np.arange(1, 9, dtype=np.int32)[None]
    mask = np.ones_like(ids)
    plain = np.asarray(lib.tiny_model(with_lora=False)(ids, mask))
    np.testing.assert_allclose(np.asarray(frozen(ids, mask)), plain, atol=1e-6)
    assert np.abs(np.asarray(actor(ids, mask)) - plain).max() > 1e-3
    # Moving the actor's adapters (as sync_model does) leaves the critic where it was.
    lora_state = nnx.state(actor, nnx.LoRAParam)
    nnx.update(actor, jax.tree.map(lambda x: x + 0.5, lora_state))
    np.testing.assert_allclose(np.asarray(frozen(ids, mask)), plain, atol=1e-6)
    with pytest.raises(ValueError, match="LoRA"):
        step_lib.reference_model(lib.tiny_model(with_lora=False))


def test_local_critic_over_the_shared_base_scores_greedily():
    from pau_jax.models import lora, qwen3
    from pau_jax.policy.config import SamplingConfig
    from pau_jax.policy.local import LocalPolicy
    from pau_jax.tokenizer import load_tokenizer

    config = checkpoints.tiny_qwen3_config(max_position_embeddings=4096)
    actor = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    lora.apply_lora(actor, rank=2, alpha=2)
    tokenizer = load_tokenizer("qwen3-offline")
    frozen = step_lib.reference_model(actor)
    assert all(a is b for a, b in zip(_base_leaves(actor), _base_leaves(frozen), strict=True))
    policy = LocalPolicy(frozen, tokenizer, SamplingConfig(max_new_tokens=4, temperature=0.0))
    states = [finished_state(1), finished_state(1)]
    first = critic.score_episodes(policy, states, REFERENCES, CriticConfig())
    second = critic.score_episodes(policy, states, REFERENCES, CriticConfig())
    assert first.requested == 4
    # Greedy: the same answers every time (a random model rarely writes a rating).
    assert first.raw == second.raw and first.scores == second.scores
    assert first.unparsed == sum(s is None for e in first.scores for i, s in enumerate(e) if i != 1)
