"""Next-token selection compared with Hugging Face's temperature/top-k/top-p logits warpers."""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.generation import logits_process

from pau_jax.sampling import logits as logits_lib

TRACES = collections.Counter()


@functools.partial(jax.jit, static_argnames="max_top_k")
def _sample(logits, seed, temperature, top_k, top_p, max_top_k=64):
    TRACES["sample"] += 1
    uniforms = jax.random.uniform(jax.random.key(seed), (len(logits), 2))
    return logits_lib.sample_tokens(
        logits, uniforms, temperature, top_k, top_p, max_top_k=max_top_k
    )


def _hf_logprobs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """log-probabilities of the distribution Hugging Face `generate` samples from."""
    scores = torch.from_numpy(logits.astype(np.float32))
    warpers = [logits_process.TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(logits_process.TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(logits_process.TopPLogitsWarper(top_p))
    for warper in warpers:
        scores = warper(None, scores)
    return torch.log_softmax(scores, dim=-1).numpy()


# Every call uses one shape, so the whole file compiles the sampler once.
ROWS, VOCAB = 2048, 256


def _run(logits, seed, temperature, top_k, top_p):
    """Samples rows of `logits` [n, VOCAB] (n <= ROWS), padding the batch to ROWS rows."""
    n = len(logits)
    pad = lambda x, v: np.concatenate([np.asarray(x), np.full(ROWS - n, v, np.asarray(x).dtype)])  # noqa: E731
    batch = np.concatenate([logits, np.zeros((ROWS - n, VOCAB), np.float32)])
    tokens, logprobs, plain = _sample(
        jnp.asarray(batch),
        seed,
        jnp.asarray(pad(np.float32(temperature), 0.0)),
        jnp.asarray(pad(np.int32(top_k), 0)),
        jnp.asarray(pad(np.float32(top_p), 1.0)),
    )
    return np.asarray(tokens)[:n], np.asarray(logprobs)[:n], np.asarray(plain)[:n]


def _draw(row_logits, n, *, temperature, top_k, top_p, seed=0):
    """n draws from one row of logits with the same settings."""
    return _run(
        np.repeat(row_logits[None], n, axis=0),
        seed,
        np.full(n, temperature, np.float32),
        np.full(n, top_k, np.int32),
        np.full(n, top_p, np.float32),
    )


def _random_logits(seed, scale=3.0):
    return np.random.default_rng(seed).normal(size=VOCAB).astype(np.float32) * scale


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 12, 0.6)],
)
def test_draws_follow_the_hugging_face_distribution(temperature, top_k, top_p):
    row = _random_logits(seed=1)
    expected = _hf_logprobs(row[None], temperature, top_k, top_p)[0]
    n = ROWS
    tokens, logprobs, plain = _draw(row, n, temperature=temperature, top_k=top_k, top_p=top_p)
    support = np.isfinite(expected)
    assert support[tokens].all(), "a token outside the filtered support was drawn"
    np.testing.assert_allclose(logprobs, expected[tokens], atol=1e-5)
    plain_expected = np.asarray(jax.nn.log_softmax(row / temperature))
    np.testing.assert_allclose(plain, plain_expected[tokens], atol=1e-5)
    freq = np.bincount(tokens, minlength=len(row)) / n
    p = np.exp(expected)
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 2e-3)


def test_nucleus_larger_than_the_candidate_set_uses_the_exact_threshold():
    # A flat distribution: the 64 candidates hold less than top_p, so the bisection runs.
    row = _random_logits(seed=2, scale=0.3)
    top_p = 0.5
    probs = np.exp(np.asarray(jax.nn.log_softmax(row)))
    assert np.sort(probs)[-64:].sum() < top_p
    expected = _hf_logprobs(row[None], 1.0, 0, top_p)[0]
    tokens, logprobs, _ = _draw(row, ROWS, temperature=1.0, top_k=0, top_p=top_p)
    support = np.isfinite(expected)
    assert 64 < support.sum() < len(row)
    assert support[tokens].all()
    np.testing.assert_allclose(logprobs, expected[tokens], atol=1e-5)
    # Most of the nucleus is reached, none of the rest.
    assert len(set(tokens.tolist())) > 0.8 * support.sum()


def test_nucleus_threshold_matches_a_sorted_cumulative_sum():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(16, 5000)).astype(np.float32) * rng.uniform(0.1, 4, (16, 1))
    top_p = rng.uniform(0.05, 0.99, 16).astype(np.float32)
    probs = jax.nn.softmax(jnp.asarray(logits), axis=-1)
    threshold = logits_lib.nucleus_threshold(probs, jnp.asarray(top_p))
    kept = np.asarray(probs >= threshold[:, None])
    for row in range(16):
        hf_support = np.isfinite(_hf_logprobs(logits[row : row + 1], 1.0, 0, top_p[row])[0])
        np.testing.assert_array_equal(kept[row], hf_support)


def test_greedy_and_top_k_one_rows_are_the_argmax_in_a_mixed_batch():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(6, VOCAB)).astype(np.float32) * 2
    temperature = [0.0, 1.0, 0.0, 0.8, 1.0, 2.0]
    top_k = [0, 1, 0, 1, 0, 0]
    top_p = [1.0, 1.0, 0.5, 1.0, 1.0, 0.9]
    tokens, logprobs, plain = _run(logits, 0, temperature, top_k, top_p)
    argmax = logits.argmax(-1)
    np.testing.assert_array_equal(tokens[:4], argmax[:4])
    np.testing.assert_allclose(logprobs[:4], 0.0, atol=1e-6)
    log_softmax = np.asarray(jax.nn.log_softmax(jnp.asarray(logits)))
    np.testing.assert_allclose(plain[0], log_softmax[0, argmax[0]], atol=1e-5)
    # The sampled rows are not forced to the argmax (row 4 samples from a full softmax).
    assert np.isfinite(logprobs[4]) and logprobs[4] < 0


def test_same_seed_same_tokens_and_settings_never_recompile():
    row = _random_logits(seed=5)
    a = _draw(row, 64, temperature=1.0, top_k=0, top_p=1.0, seed=7)[0]
    b = _draw(row, 64, temperature=1.0, top_k=0, top_p=1.0, seed=7)[0]
    c = _draw(row, 64, temperature=1.0, top_k=0, top_p=1.0, seed=8)[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    before = TRACES["sample"]
    for temperature, top_k, top_p in [(0.0, 0, 1.0), (0.5, 3, 0.9), (2.0, 0, 0.3)]:
        _draw(row, 64, temperature=temperature, top_k=top_k, top_p=top_p)
    assert TRACES["sample"] == before


def test_block_size_divides_the_vocabulary():
    for vocab in (128, 151936, 997, 50):
        size = logits_lib._block_size(vocab)
        assert vocab % size == 0 and size * size >= vocab


def test_first_argmax_is_argmax_with_ties_to_the_first_index():
    x = np.random.default_rng(0).normal(size=(5, 1000)).astype(np.float32)
    x[1, [7, 500, 999]] = 9.0
    x[2, :] = -3.0
    x[3, 999] = 50.0
    got = np.asarray(logits_lib.first_argmax(jnp.asarray(x)))
    np.testing.assert_array_equal(got, np.argmax(x, axis=-1))
    assert got[1] == 7 and got[2] == 0 and got.dtype == np.int32
