"""Structured decoding through the episode runner: a random model over the real Qwen vocabulary
writes inputs every phase parses, with the arity of each task, only when the switch is on."""

import checkpoints
import pytest
from flax import nnx

from pau_jax.env import runner
from pau_jax.env.episode import EpisodeConfig, Phase
from pau_jax.models import qwen3
from pau_jax.policy.backends import Seat
from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.local import LocalPolicy
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.sandbox import Executor
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
    finished = runner.run_episode_states(specs, policy.complete, executor, CONFIG, progress=False)
    return [(f.spec.task.n_params, s) for f in finished for s in f.state.steps]


def test_constrained_inputs_all_parse_with_the_task_arity(setup):
    steps = _run(setup, "constrain_inputs")
    inputs = [(n, s) for n, s in steps if s.phase is Phase.GENERATE]
    assert len(inputs) >= 8  # 4 tasks, budget 2: every input call is made
    bad = [(n, s.output, s.parse_error) for n, s in inputs if not s.parse_ok]
    assert not bad, bad[:3]
    assert {n for n, _ in inputs} == {1, 2}
    # The same random model without the switch writes no parsable input.
    plain = [s for _, s in _run(setup, "off") if s.phase is Phase.GENERATE]
    assert plain and not any(s.parse_ok for s in plain)


def test_the_switch_is_checked_and_masking_stays_out_of_rollouts():
    with pytest.raises(ValueError, match="structured must be one of"):
        SamplingConfig(structured="on")
    with pytest.raises(ValueError, match="does not read thinking"):
        SamplingConfig(structured="end_at_answer", enable_thinking=True)
    masked = SamplingConfig(temperature=1.0, structured="constrain_inputs")
    with pytest.raises(ValueError, match="for evaluation only"):
        RolloutConfig(sampling=masked)
    RolloutConfig(sampling=SamplingConfig(temperature=1.0, structured="end_at_answer"))
