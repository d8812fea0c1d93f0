"""Incremental decoding with a KV cache reproduces the full forward at every position."""

import checkpoints
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwen3_testlib as lib
from flax import nnx

from pau_jax.models import kv_cache, qwen3

PROMPT = 6
STEPS = 4
MAX_LEN = 16


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path, _ = checkpoints.make_tiny_qwen3(tmp_path_factory.mktemp("decode"), seed=4)
    return qwen3.load_hf(path)


@pytest.fixture(scope="module")
def sequences(loaded):
    """Left-padded prompts of width PROMPT followed by STEPS real tokens, and full-forward logits."""
    model, config = loaded
    prompt_ids, prompt_mask = lib.left_padded(config.vocab_size, [6, 3, 1], seed=8)
    rng = np.random.default_rng(9)
    tail = rng.integers(0, config.vocab_size, (3, STEPS)).astype(np.int32)
    ids = np.concatenate([prompt_ids, tail], axis=1)
    mask = np.concatenate([prompt_mask, np.ones_like(tail)], axis=1)
    return ids, mask, lib.positions(mask), lib.ours(model, ids, mask)


def _assert_real_close(logits, reference, mask):
    assert lib.max_real_diff(np.asarray(logits), reference, mask) < lib.TOL


def test_prefill_chunk_and_single_token_steps_match_the_full_forward(loaded, sequences):
    model, config = loaded
    ids, mask, positions, reference = sequences
    graphdef, state = nnx.split(model)
    traces = []

    @jax.jit
    def step(state, cache, ids, positions, index, mask):
        traces.append(ids.shape)
        decoder = nnx.merge(graphdef, state)
        return decoder.decode(
            ids, positions=positions, cache=cache, cache_index=index, attention_mask=mask
        )

    cache = kv_cache.init_cache(config, 3, MAX_LEN)
    logits, cache = step(state, cache, ids[:, :PROMPT], positions[:, :PROMPT], 0, mask[:, :PROMPT])
    assert logits.shape == (3, PROMPT, config.vocab_size) and logits.dtype == jnp.float32
    _assert_real_close(logits, reference[:, :PROMPT], mask[:, :PROMPT])
    np.testing.assert_array_equal(np.asarray(cache.mask[:, :PROMPT]), mask[:, :PROMPT] == 1)
    assert not np.asarray(cache.mask[:, PROMPT:]).any()
    # A two-token chunk, then single tokens, at traced cache indices.
    t = PROMPT
    logits, cache = step(
        state, cache, ids[:, t : t + 2], positions[:, t : t + 2], t, mask[:, t : t + 2]
    )
    _assert_real_close(logits, reference[:, t : t + 2], mask[:, t : t + 2])
    for t in range(PROMPT + 2, PROMPT + STEPS):
        sl = slice(t, t + 1)
        logits, cache = step(state, cache, ids[:, sl], positions[:, sl], jnp.int32(t), mask[:, sl])
        _assert_real_close(logits, reference[:, sl], mask[:, sl])
    assert traces == [(3, PROMPT), (3, 2), (3, 1)]  # one trace per shape, not per index


def test_last_only_prefill_then_decode_inside_a_while_loop(loaded, sequences):
    model, config = loaded
    ids, mask, positions, reference = sequences
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, ids, positions, mask):
        decoder = nnx.merge(graphdef, state)
        cache = kv_cache.init_cache(config, ids.shape[0], MAX_LEN)
        prefill, cache = decoder.decode(
            ids[:, :PROMPT],
            positions=positions[:, :PROMPT],
            cache=cache,
            cache_index=0,
            attention_mask=mask[:, :PROMPT],
            last_only=True,
        )
        out = jnp.zeros((ids.shape[0], STEPS, config.vocab_size), jnp.float32)

        def body(i, carry):
            cache, out = carry
            index = PROMPT + i
            token = jax.lax.dynamic_slice_in_dim(ids, index, 1, axis=1)
            pos = jax.lax.dynamic_slice_in_dim(positions, index, 1, axis=1)
            logits, cache = nnx.merge(graphdef, state).decode(
                token, positions=pos, cache=cache, cache_index=index
            )
            return cache, jax.lax.dynamic_update_slice_in_dim(out, logits, i, axis=1)

        _, out = jax.lax.fori_loop(0, STEPS, body, (cache, out))
        return prefill, out

    prefill, steps = run(state, ids, positions, mask)
    assert prefill.shape == (3, 1, config.vocab_size)
    np.testing.assert_allclose(np.asarray(prefill[:, 0]), reference[:, PROMPT - 1], atol=lib.TOL)
    np.testing.assert_allclose(np.asarray(steps), reference[:, PROMPT:], atol=lib.TOL)


def test_init_cache_shapes(loaded):
    _, config = loaded
    cache = kv_cache.init_cache(config, 2, 8, dtype=jnp.bfloat16)
    assert len(cache.k) == len(cache.v) == config.num_hidden_layers
    heads, head_dim = config.num_key_value_heads, config.head_dim
    assert cache.k[0].shape == (2, heads, 8, head_dim)
    assert cache.v[0].shape == (2, heads, head_dim, 8)
    assert cache.k[0].dtype == jnp.bfloat16 and cache.mask.dtype == jnp.bool_
    assert cache.max_len == 8 and not np.asarray(cache.mask).any()
    assert len(jax.tree.leaves(cache)) == 2 * config.num_hidden_layers + 1
    grown = kv_cache.grow(cache, 12)
    assert grown.k[0].shape == (2, heads, 12, head_dim) and grown.v[0].shape[-1] == 12
    assert grown.mask.shape == (2, 12) and not np.asarray(grown.mask).any()
    with pytest.raises(ValueError, match="shrink"):
        kv_cache.grow(grown, 8)
