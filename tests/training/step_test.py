"""training.step with a loss written here: the seam a new algorithm plugs into.

The loss is neither GRPO nor SFT (a sequence-weighted REINFORCE with min/max
statistics), so these tests show that the shared step needs nothing from rl/ or
sft/: micro-batches give the full-batch update, statistics combine by name, only
the adapters move, and equal configs share one compiled program.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pau_jax.models import lora, qwen3
from pau_jax.training import step as step_lib
from pau_jax.training.logprobs import token_logprobs

CONFIG = qwen3.Qwen3Config(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
OPTIMIZER = step_lib.OptimizerConfig(learning_rate=1e-2)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightedBatch:
    input_ids: jax.Array
    attention_mask: jax.Array
    loss_mask: jax.Array
    weights: jax.Array  # [B]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightedReinforce:
    """-sum_rows w * sum_t logp over masked tokens, per row with tokens."""

    chunk_tokens: int = 16

    def __call__(self, model, batch):
        logp, _ = token_logprobs(
            model, batch.input_ids, batch.attention_mask, chunk_tokens=self.chunk_tokens
        )
        mask = batch.loss_mask * (jnp.arange(logp.shape[1]) > 0)
        per_row = jnp.sum(logp * mask, axis=1)
        real = mask > 0
        stats = {
            "tokens": jnp.sum(mask),
            "logp_min": jnp.min(jnp.where(real, logp, jnp.inf)),
            "logp_max": jnp.max(jnp.where(real, logp, -jnp.inf)),
        }
        return -jnp.sum(batch.weights * per_row), jnp.sum(jnp.sum(mask, axis=1) > 0), stats

    def metrics(self, loss_sum, denominator, stats):
        return {"train/loss": loss_sum / jnp.maximum(denominator, 1.0), **stats}


def _model():
    model = qwen3.Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(0))
    lora.apply_lora(model, rank=2, alpha=2.0, seed=1)
    rng = np.random.default_rng(2)
    for adapter in lora.adapters(model).values():  # Non-zero B: adapters change the outputs.
        adapter.lora_b.set_value(0.1 * rng.standard_normal(adapter.lora_b.shape, np.float32))
    return model


def _batch(rows: int = 4, length: int = 12) -> WeightedBatch:
    rng = np.random.default_rng(3)
    ids = rng.integers(1, CONFIG.vocab_size, (rows, length)).astype(np.int32)
    attention = np.ones((rows, length), np.int32)
    attention[1, :4] = 0  # left padding
    loss = np.zeros((rows, length), np.float32)
    loss[:, -5:] = 1.0
    loss[3] = 0.0  # a row without tokens
    return WeightedBatch(
        input_ids=jnp.asarray(ids),
        attention_mask=jnp.asarray(attention),
        loss_mask=jnp.asarray(loss),
        weights=jnp.asarray(rng.uniform(0.5, 2.0, rows).astype(np.float32)),
    )


def _numpy_expectation(model, batch):
    logits = np.asarray(model(batch.input_ids, batch.attention_mask), np.float64)
    shifted = logits[:, :-1] - logits[:, :-1].max(-1, keepdims=True)
    logp_all = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    ids = np.asarray(batch.input_ids)
    logp = np.take_along_axis(logp_all, ids[:, 1:, None], -1)[..., 0]
    mask = np.asarray(batch.loss_mask)[:, 1:]
    per_row = (logp * mask).sum(1)
    rows = (mask.sum(1) > 0).sum()
    return {
        "train/loss": -(np.asarray(batch.weights) * per_row).sum() / rows,
        "tokens": mask.sum(),
        "logp_min": logp[mask > 0].min(),
        "logp_max": logp[mask > 0].max(),
    }


def _run(micro_batch_size):
    model = _model()
    base_before = [np.array(x) for x in jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))]
    train_step = step_lib.make_train_step(
        WeightedReinforce(), OPTIMIZER, model=model, micro_batch_size=micro_batch_size
    )
    state = step_lib.init_state(model, OPTIMIZER)
    state, metrics = train_step(state, _batch())
    step_lib.sync_model(model, state)
    base_after = jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))
    return model, state, jax.device_get(metrics), base_before, base_after


def test_a_new_loss_runs_and_its_metrics_match_numpy():
    model = _model()
    expected = _numpy_expectation(model, _batch())
    _, state, metrics, base_before, base_after = _run(micro_batch_size=None)
    for name, value in expected.items():
        assert float(metrics[name]) == pytest.approx(value, rel=1e-4), name
    assert int(state.step) == 1 and float(metrics["train/grad_norm"]) > 0
    assert all(np.array_equal(a, b) for a, b in zip(base_before, base_after))


def test_micro_batches_give_the_full_batch_update_and_combine_statistics_by_name():
    _, whole, whole_metrics, _, _ = _run(micro_batch_size=None)
    _, split, split_metrics, _, _ = _run(micro_batch_size=1)
    for a, b in zip(jax.tree.leaves(whole.lora), jax.tree.leaves(split.lora)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    for name in ("train/loss", "tokens", "logp_min", "logp_max", "train/grad_norm"):
        assert float(split_metrics[name]) == pytest.approx(float(whole_metrics[name]), rel=1e-5)
    # The one-row micro-batch without tokens contributes +inf/-inf to min/max: combined away.
    assert np.isfinite(split_metrics["logp_min"]) and np.isfinite(split_metrics["logp_max"])


def test_equal_configs_share_one_compiled_program_and_bad_sizes_fail():
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    first, second = _model(), _model()
    batch = _batch()
    step_a = step_lib.make_train_step(WeightedReinforce(chunk_tokens=8), OPTIMIZER, model=first)
    step_b = step_lib.make_train_step(WeightedReinforce(chunk_tokens=8), OPTIMIZER, model=second)
    step_a(step_lib.init_state(first, OPTIMIZER), batch)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        step_b(step_lib.init_state(second, OPTIMIZER), batch)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == [], f"{len(compiles)} compiles for an equal loss, optimizer and model"
    bad = step_lib.make_train_step(WeightedReinforce(), OPTIMIZER, model=first, micro_batch_size=3)
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size=3"):
        bad(step_lib.init_state(first, OPTIMIZER), batch)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        step_lib.make_train_step(
            WeightedReinforce(), OPTIMIZER, model=qwen3.Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(0))
        )
