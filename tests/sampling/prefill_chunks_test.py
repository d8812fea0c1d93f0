"""Prefill in row chunks (`prefill.chunk_rows`): bounded attention scores, no padding-only chunks.

A call's distinct prompts are padded to a row bucket (5 prompts -> 8 rows). With a small
`SCORE_POSITIONS` the rows are prefilled in chunks of 2, the last chunk (padding only) is
not computed, and every sample equals the one-program prefill's, with and without a
reused prefix, with several samples per prompt.
"""

import numpy as np
import pytest

from pau_jax.sampling import generate, prefill, prefix_cache, sampler

RNG = np.random.default_rng(5)
HEAD = RNG.integers(1, 128, 40).tolist()
PROMPTS = [HEAD + RNG.integers(1, 128, n).tolist() for n in (3, 9, 14, 20, 30)]


def test_chunk_rows_bounds_the_scores_and_the_padding():
    assert prefill.chunk_rows(8, 8, 64, 64) == 8  # small and full: one program
    assert prefill.chunk_rows(64, 64, 1536, 1536) == 2  # 2 x 1536^2 <= 2^23 < 4 x 1536^2
    assert prefill.chunk_rows(128, 128, 4096, 4096) == 1  # one row exceeds it: one row
    assert prefill.chunk_rows(192, 192, 16, 16) == 32  # 32 x 16 queries: MIN_CHUNK_QUERIES
    # 9 prompts in 16 rows: chunks of 2 compute 10 rows, not 16.
    assert prefill.chunk_rows(16, 9, 512, 512) == 2
    # ... unless a chunk would then hold fewer than MIN_CHUNK_QUERIES positions.
    assert prefill.chunk_rows(16, 9, 64, 512) == 8
    for height in (1, 2, 8, 64, 128, 192):
        for real in {1, max(1, height // 2 + 1), height}:
            for width in (32, 512, 1536, 4096):
                rows = prefill.chunk_rows(height, real, width, width)
                assert height % rows == 0
                assert rows in (1, height) or rows * width * width <= prefill.SCORE_POSITIONS


def _run(model, cache=None, **kwargs):
    out = generate(model, PROMPTS, max_new_tokens=6, prefix_cache=cache, **kwargs)
    return out, [np.asarray(x) for x in out.plain_logprobs]


@pytest.mark.parametrize("reuse", [False, True])
def test_chunked_prefill_samples_what_one_program_samples(tiny_model, monkeypatch, reuse):
    settings = dict(n_samples=2, temperature=0.9, seed=4)
    make_cache = (
        (lambda: prefix_cache.PrefixCache(1 << 30, min_reuse=8)) if reuse else (lambda: None)
    )
    whole, whole_logp = _run(tiny_model, make_cache(), **settings)
    widths = {}
    original = prefill.chunk_rows

    def small(height, num_real, queries, keys):
        widths[height] = (num_real, queries, keys)
        return min(2, height)

    monkeypatch.setattr(prefill, "chunk_rows", small)
    before = sampler.call_counts().get("prefill_rows", 0)
    chunked, chunked_logp = _run(tiny_model, make_cache(), **settings)
    rows = sampler.call_counts()["prefill_rows"] - before
    assert 8 in widths  # 5 prompts padded to 8 rows
    # 3 chunks of 2 rows hold the 5 prompts; the 4th (padding only) is not computed. With
    # reuse the shared head's own prefill (1 row) is counted too.
    assert rows == (6 + 1 if reuse else 6)
    assert chunked.tokens == whole.tokens
    for x, y in zip(chunked_logp, whole_logp, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)
    assert original(8, 5, 64, 64) == 8
