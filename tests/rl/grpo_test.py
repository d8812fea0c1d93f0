"""The GRPO loss and its gradient against a NumPy reference and finite differences."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rl_testlib as lib
from flax import nnx

from pau_jax.rl import grpo
from pau_jax.rl.grpo import GRPOConfig
from pau_jax.training import logprobs as logprobs_lib

MODES = grpo.AGGREGATIONS

# Jitted once per config: eager dispatch would compile every primitive separately.
policy_loss = jax.jit(grpo.policy_loss, static_argnames=("config",))


def random_case(seed=0, rows=3, length=6, vocab=5, per_token_adv=False):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((rows, length, vocab)).astype(np.float32)
    targets = rng.integers(0, vocab, (rows, length)).astype(np.int32)
    mask = (rng.random((rows, length)) < 0.7).astype(np.float32)
    mask[:, 0] = 1.0  # position 0 must be ignored whatever the mask says
    mask[-1] = 0.0  # a row without tokens
    shape = (rows, length) if per_token_adv else (rows,)
    adv = rng.standard_normal(shape).astype(np.float32)
    return logits, targets, mask, adv, rng


def np_logp(logits, targets, temperature):
    lp = lib.log_softmax(logits / temperature)
    return np.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]


def jax_objective(logits, targets, old, ref, adv, mask, config):
    logp, _ = logprobs_lib.logprobs_from_logits(logits, targets, config.temperature)
    loss_sum, denominator, _ = grpo.policy_loss(logp, old, adv, mask, config, ref_logp=ref)
    return loss_sum / denominator


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_loss_and_gradient_match_numpy_finite_differences(mode, per_token_adv):
    logits, targets, mask, adv, rng = random_case(per_token_adv=per_token_adv)
    config = GRPOConfig(
        beta=0.1, temperature=0.7, aggregation=mode, max_length=8, eps_low=0.2, eps_high=0.28,
        sampler_correction="none",
    )  # fmt: skip
    base = np_logp(logits, targets, config.temperature)
    # Sampler and reference log-probs nearby: some ratios leave [0.8, 1.28] (clipped tokens).
    old = (base + rng.uniform(-0.4, 0.4, base.shape)).astype(np.float32)
    ref = (base + rng.uniform(-0.4, 0.4, base.shape)).astype(np.float32)
    ratio = np.exp(base - old)[:, 1:][mask[:, 1:] > 0]
    assert np.any(ratio < 0.8) and np.any((ratio > 0.85) & (ratio < 1.25))

    def numpy_loss(x):
        return lib.grpo_loss(
            np_logp(x, targets, config.temperature),
            old,
            ref,
            adv,
            mask,
            eps_low=config.eps_low,
            eps_high=config.eps_high,
            beta=config.beta,
            mode=mode,
            max_length=config.max_length,
        )

    x64 = logits.astype(np.float64)
    expected_grad = np.zeros_like(x64)
    h = 1e-6
    for index in np.ndindex(x64.shape):
        up, down = x64.copy(), x64.copy()
        up[index] += h
        down[index] -= h
        expected_grad[index] = (numpy_loss(up) - numpy_loss(down)) / (2 * h)

    objective = jax.jit(jax.value_and_grad(functools.partial(jax_objective, config=config)))
    loss, grad = objective(logits, targets, old, ref, adv, mask)
    np.testing.assert_allclose(float(loss), numpy_loss(x64), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), expected_grad, rtol=1e-3, atol=2e-5)
    assert np.abs(expected_grad).max() > 1e-2
    assert not np.any(np.asarray(grad)[:, 0])  # position 0 never counts, though masked in
    assert not np.any(np.asarray(grad)[-1])  # the row without tokens


@pytest.mark.parametrize("mode", MODES)
def test_ratio_one_and_no_kl_gives_minus_mean_advantage(mode):
    rng = np.random.default_rng(3)
    mask = np.array(
        [[0, 1, 1, 1, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], np.float32
    )
    adv = np.array([0.5, -2.0, 7.0, 1.5], np.float32)
    logp = rng.standard_normal(mask.shape).astype(np.float32)
    config = GRPOConfig(beta=0.0, aggregation=mode, max_length=10)
    loss_sum, denominator, _ = policy_loss(logp, logp, adv, mask, config)
    # Token counts (position 0 excluded): 3, 1, 0, 4.
    expected = {
        "token-mean": -(0.5 * 3 - 2.0 * 1 + 1.5 * 4) / 8,
        "sequence-mean-token-mean": -(0.5 - 2.0 + 1.5) / 3,
        "sequence-mean-token-sum-norm": -(0.5 * 3 / 10 - 2.0 * 1 / 10 + 1.5 * 4 / 10) / 3,
    }[mode]
    assert float(loss_sum / denominator) == pytest.approx(expected, abs=1e-6)


def test_kl_clip_fraction_and_statistics_by_hand():
    # One row, tokens 1..4 in the loss; eps 0.2.
    logp = np.log(np.array([[1.0, 1.5, 0.5, 0.5, 1.0]], np.float32))
    old = np.zeros_like(logp)  # ratios 1.5, 0.5, 0.5, 1.0 at tokens 1..4
    adv = np.array([[0.0, 1.0, -1.0, 1.0, 2.0]], np.float32)
    mask = np.ones_like(logp)
    ref = logp + np.log(2.0)  # d = log 2 everywhere: k3 = 2 - log 2 - 1
    config = GRPOConfig(beta=0.5, sampler_correction="none")
    loss_sum, denominator, stats = policy_loss(
        logp, old, adv, mask, config, ref_logp=ref, entropy=np.full_like(logp, 3.0)
    )
    k3 = 1.0 - np.log(2.0)
    # Token losses: A=1, r=1.5 -> -1.2 (clipped); A=-1, r=0.5 -> 0.8 (clipped);
    # A=1, r=0.5 -> -0.5 (not clipped: the lower bound only binds for A < 0); A=2, r=1 -> -2.
    expected = (-1.2 + 0.8 - 0.5 - 2.0) / 4 + 0.5 * k3
    assert float(loss_sum / denominator) == pytest.approx(expected, rel=1e-5)
    m = grpo.metrics(loss_sum, denominator, stats)
    assert float(m["grpo/clip_fraction"]) == pytest.approx(0.5)
    assert float(m["grpo/kl"]) == pytest.approx(k3, rel=1e-5)
    assert float(m["grpo/ratio_min"]) == pytest.approx(0.5)
    assert float(m["grpo/ratio_max"]) == pytest.approx(1.5)
    assert float(m["grpo/entropy"]) == pytest.approx(3.0)
    assert float(m["grpo/logprob_gap_max"]) == pytest.approx(np.log(2.0), rel=1e-5)
    # Clipped tokens carry no policy gradient; the KL gradient is beta * (1 - e^d) / 4 each.
    grad = jax.jit(
        jax.grad(
            lambda lp: jnp.divide(*grpo.policy_loss(lp, old, adv, mask, config, ref_logp=ref)[:2])
        )
    )(logp)
    kl_grad = 0.5 * (1 - 2.0) / 4
    expected_grad = [0.0, kl_grad, kl_grad, -0.5 / 4 + kl_grad, -2.0 / 4 + kl_grad]
    np.testing.assert_allclose(np.asarray(grad)[0], expected_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_tis_is_the_plain_loss_when_the_sampler_is_the_learner(mode):
    rng = np.random.default_rng(11)
    logp = rng.uniform(-3.0, -0.1, (3, 7)).astype(np.float32)
    ref = (logp + rng.uniform(-0.3, 0.3, logp.shape)).astype(np.float32)
    mask = (rng.random(logp.shape) < 0.8).astype(np.float32)
    adv = rng.standard_normal((3, 7)).astype(np.float32)
    results = []
    for correction in grpo.SAMPLER_CORRECTIONS:
        config = GRPOConfig(beta=0.1, aggregation=mode, max_length=9, sampler_correction=correction)

        def loss(lp, config=config):
            return jnp.divide(*grpo.policy_loss(lp, logp, adv, mask, config, ref_logp=ref)[:2])

        results.append(jax.jit(jax.value_and_grad(loss))(logp))
    (loss_tis, grad_tis), (loss_none, grad_none) = results
    assert float(loss_tis) == pytest.approx(float(loss_none), abs=1e-6)
    np.testing.assert_allclose(np.asarray(grad_tis), np.asarray(grad_none), atol=1e-6)
    assert np.abs(np.asarray(grad_tis)).max() > 1e-2


def test_tis_weights_a_made_up_mismatch_capped_at_two():
    logp = np.log(np.array([[0.5, 0.5, 0.4, 0.3, 0.2]], np.float32))
    shift = np.array([[0.0, 0.3, -0.5, 1.5, 2.0]], np.float32)  # log pi_old - log pi_sampler
    sampler = logp - shift
    adv = np.array([[0.0, 1.0, -2.0, 1.0, 0.5]], np.float32)
    mask = np.ones_like(logp)
    config = GRPOConfig(beta=0.0)  # 'tis', cap 2, by default
    weights = np.minimum(np.exp(shift[0, 1:]), 2.0)  # e^0.3, e^-0.5, 2 (capped), 2 (capped)
    expected = float(np.sum(-adv[0, 1:] * weights) / 4)

    def loss(lp):
        return jnp.divide(*grpo.policy_loss(lp, sampler, adv, mask, config)[:2])

    value, grad = jax.jit(jax.value_and_grad(loss))(logp)
    assert float(value) == pytest.approx(expected, rel=1e-5)
    # No clipping against the sampler: every token's gradient is -A * w / tokens.
    np.testing.assert_allclose(
        np.asarray(grad)[0], [0.0, *(-adv[0, 1:] * weights / 4)], rtol=1e-5, atol=1e-7
    )
    m = grpo.metrics(*grpo.policy_loss(logp, sampler, adv, mask, config))
    assert float(m["grpo/tis_capped_fraction"]) == pytest.approx(0.5)
    assert float(m["grpo/tis_weight_mean"]) == pytest.approx(weights.mean(), rel=1e-5)
    assert float(m["grpo/logprob_gap_max"]) == pytest.approx(2.0, rel=1e-5)
    # The same mismatch under 'none' is clipped like staleness: a different loss.
    none = GRPOConfig(beta=0.0, sampler_correction="none")
    other = float(jnp.divide(*grpo.policy_loss(logp, sampler, adv, mask, none)[:2]))
    assert abs(other - expected) > 0.1


def test_beta_needs_reference_and_configs_validate():
    x = np.zeros((1, 3), np.float32)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo.policy_loss(x, x, x[:, 0], x, GRPOConfig(beta=0.1))
    with pytest.raises(ValueError, match="max_length"):
        GRPOConfig(aggregation="sequence-mean-token-sum-norm")
    with pytest.raises(ValueError, match="aggregation"):
        GRPOConfig(aggregation="mean")
    with pytest.raises(ValueError, match="temperature"):
        GRPOConfig(temperature=0.0)
    with pytest.raises(ValueError, match="sampler_correction"):
        GRPOConfig(sampler_correction="ppo")
    with pytest.raises(ValueError, match="tis_cap"):
        GRPOConfig(tis_cap=0.5)


def test_micro_batch_sums_give_the_full_batch_mean():
    logits, targets, mask, adv, rng = random_case(seed=5, rows=4)
    base = np_logp(logits, targets, 1.0)
    old = (base + rng.uniform(-0.3, 0.3, base.shape)).astype(np.float32)
    for mode in MODES:
        config = GRPOConfig(beta=0.0, aggregation=mode, max_length=6)
        full = policy_loss(base, old, adv, mask, config)
        parts = [
            policy_loss(base[s], old[s], adv[s], mask[s], config)
            for s in (slice(0, 2), slice(2, 4))
        ]
        total = sum(float(p[0]) for p in parts) / sum(float(p[1]) for p in parts)
        assert total == pytest.approx(float(full[0] / full[1]), rel=1e-6)


def test_chunked_logprobs_and_gradient_match_full_logits():
    model = lib.tiny_model()
    arrays = lib.batch_arrays()
    ids, mask = jnp.asarray(arrays["input_ids"]), jnp.asarray(arrays["attention_mask"])
    weights = jnp.asarray(arrays["loss_mask"]) * jnp.arange(1, 11)  # a position-weighted sum
    graphdef, lora_state, base = nnx.split(model, nnx.LoRAParam, ...)
    temperature = 0.8

    def chunked(lora_state):
        m = nnx.merge(graphdef, lora_state, base)
        # 36 positions in five chunks of 8, the last padded by 4.
        logp, entropy = logprobs_lib.token_logprobs(
            m, ids, mask, temperature=temperature, chunk_tokens=8
        )
        return jnp.sum(logp * weights), (logp, entropy)

    def full(lora_state):
        logits = nnx.merge(graphdef, lora_state, base)(ids, mask)
        lp = jax.nn.log_softmax(logits[:, :-1] / temperature, axis=-1)
        picked = jnp.take_along_axis(lp, ids[:, 1:, None], axis=-1)[..., 0]
        return jnp.sum(picked * weights[:, 1:]), logits

    (_, (logp, entropy)), ours = jax.jit(jax.value_and_grad(chunked, has_aux=True))(lora_state)
    (_, logits), theirs = jax.jit(jax.value_and_grad(full, has_aux=True))(lora_state)

    logits = np.asarray(logits)
    np.testing.assert_allclose(
        np.asarray(logp),
        lib.next_token_logprobs(logits, arrays["input_ids"], temperature),
        atol=2e-5,
    )
    lp = lib.log_softmax(logits / temperature)
    expected_entropy = np.pad(-(np.exp(lp) * lp).sum(-1)[:, :-1], ((0, 0), (1, 0)))
    np.testing.assert_allclose(np.asarray(entropy), expected_entropy, atol=2e-5)

    flat_ours, flat_theirs = jax.tree.leaves(ours), jax.tree.leaves(theirs)
    assert len(flat_ours) == 2 * 7
    for a, b in zip(flat_ours, flat_theirs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    assert max(float(jnp.abs(g).max()) for g in flat_theirs) > 1e-3
