"""`layers.attend` against a NumPy softmax over the cached slots and the new tokens together."""

import jax.numpy as jnp
import numpy as np
import pytest

from pau_jax.models import layers

B, N, K, H, S = 2, 6, 2, 8, 13


def _reference(q, k, v, mask, cache_k, cache_v, cache_mask):
    """One softmax over [cached slots, new tokens], in float64 with repeated key/value heads."""
    b, t, n, h = q.shape
    group = n // k.shape[1]
    keys = np.concatenate([cache_k, k], axis=2).repeat(group, axis=1)  # [B, N, S + T, H]
    values = np.concatenate([cache_v, v], axis=3).repeat(group, axis=1)  # [B, N, H, S + T]
    allowed = np.concatenate(
        [np.broadcast_to(cache_mask[:, None, :], (b, t, cache_mask.shape[1])), mask], axis=-1
    )  # [B, T, S + T]
    scores = np.einsum("btnh,bnsh->bnts", q, keys) / np.sqrt(h)
    scores = np.where(allowed[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bnts,bnhs->btnh", weights, values)


@pytest.mark.parametrize("t", [1, 5])
def test_attention_over_a_cache_is_one_softmax(t):
    rng = np.random.default_rng(t)
    q = rng.standard_normal((B, t, N, H))
    k = rng.standard_normal((B, K, t, H))
    v = rng.standard_normal((B, K, H, t))
    cache_k = rng.standard_normal((B, K, S, H)) * 3  # large scores: the shift matters
    cache_v = rng.standard_normal((B, K, H, S))
    cache_mask = rng.random((B, S)) < 0.6
    cache_mask[1] = False  # a row with no cached slot at all
    mask = np.tril(np.ones((t, t), bool))[None].repeat(B, 0)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    out = layers.attend(
        f32(q), f32(k), f32(v), jnp.asarray(mask),
        cache=(f32(cache_k), f32(cache_v)), cache_mask=jnp.asarray(cache_mask),
    )  # fmt: skip
    expected = _reference(q, k, v, mask, cache_k, cache_v, cache_mask)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)


def test_attention_without_a_cache_is_causal_softmax():
    rng = np.random.default_rng(0)
    t = 7
    q, k, v = (rng.standard_normal(s) for s in ((B, t, N, H), (B, K, t, H), (B, K, H, t)))
    mask = np.tril(np.ones((t, t), bool))[None].repeat(B, 0)
    out = layers.attend(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), jnp.asarray(mask))
    empty = np.zeros((B, 0), bool)
    expected = _reference(q, k, v, mask, np.zeros((B, K, 0, H)), np.zeros((B, K, H, 0)), empty)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
