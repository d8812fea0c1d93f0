"""The LoRA train step: only adapters move, the shared base stays bit-identical, one compile."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rl_testlib as lib
from flax import nnx

from pau_jax.rl import learner
from pau_jax.rl.grpo import GRPOConfig
from pau_jax.rl.learner import Batch, LearnerConfig

# Sampler log-probs away from the policy, clipped as staleness ("none"), as the NumPy reference.
GRPO = GRPOConfig(beta=0.05, temperature=0.9, eps_low=0.2, eps_high=0.28, sampler_correction="none")
# A large learning rate so that every adapter visibly moves in a few steps.
CONFIG = LearnerConfig(learning_rate=1e-2, micro_batch_size=2, grpo=GRPO)


@nnx.jit
def _logits(model, ids, mask):
    return model(ids, mask)


@pytest.fixture(scope="module")
def case():
    """Arrays of the batch, with sampler log-probs near the policy's, and NumPy expectations."""
    arrays = lib.batch_arrays(seed=4)
    ids, mask = arrays["input_ids"], arrays["attention_mask"]
    policy_logits = np.asarray(_logits(lib.tiny_model(), ids, mask))
    # The reference is an independent model without any adapter (same base seed).
    base_logits = np.asarray(_logits(lib.tiny_model(with_lora=False), ids, mask))
    policy = lib.next_token_logprobs(policy_logits, ids, GRPO.temperature)
    reference = lib.next_token_logprobs(base_logits, ids, GRPO.temperature)
    rng = np.random.default_rng(7)
    sampler = (policy + rng.uniform(-0.35, 0.35, policy.shape)).astype(np.float32)
    arrays["sampler_logprobs"] = sampler
    real = arrays["loss_mask"][:, 1:] > 0
    d = (reference - policy)[:, 1:][real]
    expected = {
        "train/loss": lib.grpo_loss(
            policy,
            sampler,
            reference,
            arrays["advantages"],
            arrays["loss_mask"],
            eps_low=GRPO.eps_low,
            eps_high=GRPO.eps_high,
            beta=GRPO.beta,
            mode="token-mean",
        ),
        "grpo/kl": float(np.mean(np.exp(d) - d - 1)),
        "train/tokens": float(real.sum()),
    }
    return arrays, expected


def make_batch(arrays) -> Batch:
    return Batch(**{name: jnp.asarray(value) for name, value in arrays.items()})


def _base_leaves(model):
    return jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))


@pytest.fixture(scope="module")
def run(case):
    """Three micro-batched steps on a fresh model, with what they touched recorded."""
    arrays, _ = case
    model = lib.tiny_model()
    out = {
        "model": model,
        "base_before": [np.array(x) for x in _base_leaves(model)],
        "model_lora_before": [
            np.array(x) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))
        ],
    }
    train_step = learner.make_train_step(model, CONFIG)
    out["shares_base"] = all(
        a is b for a, b in zip(jax.tree.leaves(train_step.base), _base_leaves(model))
    )
    state = learner.init_state(model, CONFIG)
    out["initial_lora"] = [np.array(x) for x in jax.tree.leaves(state.lora)]
    batches = [make_batch(arrays) for _ in range(3)]
    compiles, history, donated = [], [], []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for i, batch in enumerate(batches):
            old = state
            state, metrics = train_step(state, batch)
            history.append(metrics)
            donated.append(all(x.is_deleted() for x in jax.tree.leaves(old.lora)))
            if i == 0:
                out["first_lora"] = [np.array(x) for x in jax.tree.leaves(state.lora)]
        jax.block_until_ready(state)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    out.update(
        compiles=len(compiles),
        donated=donated,
        history=jax.device_get(history),
        state=state,
    )
    return out


def test_one_compile_over_several_steps_and_the_state_is_donated(run):
    assert run["compiles"] == 1, f"{run['compiles']} compiles over 3 steps"
    assert run["donated"] == [True, True, True]
    assert int(run["state"].step) == 3


def test_first_step_metrics_match_numpy_with_the_adapter_free_model_as_reference(case, run):
    _, expected = case
    first = run["history"][0]
    for name, value in expected.items():
        assert float(first[name]) == pytest.approx(value, rel=2e-4, abs=1e-6), name
    assert 0 < float(first["grpo/clip_fraction"]) < 1
    # The policy moves towards its advantages: the loss on the same batch goes down.
    losses = [float(m["train/loss"]) for m in run["history"]]
    assert losses[2] < losses[0]


def test_only_adapters_change_and_the_shared_base_stays_bit_identical(run):
    model, state = run["model"], run["state"]
    # The step reads the model's own base arrays: no copy for the reference or the critic.
    assert run["shares_base"]
    for before, after in zip(run["initial_lora"], jax.tree.leaves(state.lora)):
        assert not np.allclose(before, np.asarray(after))
    for before, after in zip(run["base_before"], _base_leaves(model)):
        np.testing.assert_array_equal(before, np.asarray(after))
    # The model keeps its own adapters until synced (init_state copied them).
    model_lora = jax.tree.leaves(nnx.state(model, nnx.LoRAParam))
    for before, now in zip(run["model_lora_before"], model_lora):
        np.testing.assert_array_equal(before, np.asarray(now))
    learner.sync_model(model, state)
    for ours, theirs in zip(
        jax.tree.leaves(nnx.state(model, nnx.LoRAParam)), jax.tree.leaves(state.lora)
    ):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_micro_batches_give_the_full_batch_update(case, run):
    arrays, _ = case
    config = LearnerConfig(learning_rate=1e-2, micro_batch_size=None, grpo=GRPO)
    model = lib.tiny_model()
    state, metrics = learner.make_train_step(model, config)(
        learner.init_state(model, config), make_batch(arrays)
    )
    full, micro = jax.device_get(metrics), run["history"][0]
    for name in ("train/loss", "grpo/kl", "grpo/entropy", "train/grad_norm", "train/tokens"):
        assert float(micro[name]) == pytest.approx(float(full[name]), rel=1e-5), name
    for name in ("grpo/ratio_min", "grpo/ratio_max", "grpo/clip_fraction"):
        assert float(micro[name]) == pytest.approx(float(full[name]), rel=1e-6), name
    for a, b in zip(run["first_lora"], jax.tree.leaves(state.lora)):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-7)


def test_misuse_fails_loudly(case):
    arrays, _ = case
    with pytest.raises(ValueError, match="no LoRA adapters"):
        learner.make_train_step(lib.tiny_model(with_lora=False), CONFIG)
    with pytest.raises(ValueError, match="micro_batch_size"):
        LearnerConfig(micro_batch_size=0)
    model = lib.tiny_model()
    config = LearnerConfig(micro_batch_size=3)
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size=3"):
        learner.make_train_step(model, config)(
            learner.init_state(model, config), make_batch(arrays)
        )
