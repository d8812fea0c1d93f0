"""Prefix reuse across calls (`generate(..., prefix_cache=...)`) against plain calls and transformers.

The prompts imitate an episode: each phase's prompt shares a long prefix with the previous
phase's prompt and reply, then differs (a new observation, another instruction).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from pau_jax.models import kv_cache
from pau_jax.sampling import generate, prefix_cache, sampler

RNG = np.random.default_rng(7)
ROOMY = 1 << 30  # a budget no test's entries reach
SYSTEM = RNG.integers(1, 128, 40).tolist()
EPISODES = [SYSTEM + RNG.integers(1, 128, n).tolist() for n in (5, 19)]
NEW = 10


def _phases(model, cache, rounds=3, **kwargs):
    """Runs `rounds` phases of two episodes; each prompt extends the last one with its
    reply's first half and a few new tokens. Returns the outputs of every phase."""
    prompts = [list(p) for p in EPISODES]
    outs = []
    for r in range(rounds):
        out = generate(model, prompts, max_new_tokens=NEW, prefix_cache=cache, seed=r, **kwargs)
        outs.append(out)
        prompts = [
            p + list(t[: len(t) // 2]) + RNG.integers(1, 128, 3 + r).tolist()
            for p, t in zip(prompts, out.tokens, strict=True)
        ]
    return outs


def _full_logprobs(torch_model, prompt, tokens, temperature):
    with torch.no_grad():
        logits = torch_model(torch.tensor([list(prompt) + list(tokens)])).logits[0].double()
    logp = torch.log_softmax(logits / temperature, -1).numpy()
    positions = np.arange(len(prompt) - 1, len(prompt) - 1 + len(tokens))
    return logp[positions, tokens]


def test_greedy_phases_are_token_identical_with_and_without_reuse(tiny_model):
    global RNG
    RNG = np.random.default_rng(11)
    plain = _phases(tiny_model, None)
    RNG = np.random.default_rng(11)
    cache = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    before = sampler.call_counts().get("reused_tokens", 0)
    reused = _phases(tiny_model, cache)
    assert sampler.call_counts()["reused_tokens"] > before  # later phases reused prefixes
    assert cache.stats["hits"] >= 4 and len(cache) >= 2
    for a, b in zip(plain, reused, strict=True):
        assert a.tokens == b.tokens
        for x, y in zip(a.plain_logprobs, b.plain_logprobs, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-5)


def test_sampled_logprobs_on_a_reused_prefix_equal_the_full_forward(tiny_model, torch_model):
    cache = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    outs = _phases(tiny_model, cache, rounds=2, temperature=0.8)
    assert cache.stats["hits"] >= 2
    # Phase 2's prompts: rebuild them from the cache's entries (prompt + reply prefix).
    last = outs[-1]
    for tokens, logprobs in zip(last.tokens, last.plain_logprobs, strict=True):
        entry = next(
            e for e in cache._entries.values() if list(e.tokens[-len(tokens) + 1 :]) == tokens[:-1]
        )
        prompt = entry.tokens[: len(entry.tokens) - len(tokens) + 1].tolist()
        expected = _full_logprobs(torch_model, prompt, tokens, 0.8)
        np.testing.assert_allclose(logprobs, expected, atol=1e-4)


def test_cached_keys_equal_a_fresh_prefill_of_the_same_tokens(tiny_model):
    cache = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    _phases(tiny_model, cache, rounds=2)
    fresh = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    for entry in list(cache._entries.values()):
        # A one-token reply after the entry's tokens and one more stores the keys of both.
        generate(tiny_model, [entry.tokens.tolist() + [1]], max_new_tokens=1, prefix_cache=fresh)
        twin, m = fresh.match(entry.tokens.tolist() + [1, 2])
        n = len(entry.tokens)
        assert m == n + 1
        np.testing.assert_allclose(twin.keys[:, :, :n], entry.keys, atol=2e-5)
        np.testing.assert_allclose(twin.values[:, :, :, :n], entry.values, atol=2e-5)
        fresh.clear()


def test_new_weights_empty_the_cache(tiny_model):
    cache = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    generate(tiny_model, [EPISODES[0]], max_new_tokens=4, prefix_cache=cache)
    assert len(cache) == 1
    generate(tiny_model, [EPISODES[0] + [5]], max_new_tokens=4, prefix_cache=cache)
    assert cache.stats["hits"] == 1 and cache.stats["invalidations"] == 0
    graphdef, state = nnx.split(tiny_model)
    updated = nnx.merge(graphdef, jax.tree.map(lambda x: x + 0, state))  # new arrays
    generate(updated, [EPISODES[0] + [5, 6]], max_new_tokens=4, prefix_cache=cache)
    assert cache.stats["invalidations"] == 1 and cache.stats["hits"] == 1


def _block(rows, slots, heads=1, head_dim=4, layers=1):
    keys = jnp.zeros((rows, heads, slots, head_dim), jnp.float32)
    values = jnp.zeros((rows, heads, head_dim, slots), jnp.float32)
    return prefix_cache.Block((keys,) * layers, (values,) * layers)


def test_match_limits_budget_and_superseded_entries():
    cache = prefix_cache.PrefixCache(max_bytes=10_000, min_reuse=2)
    small = _block(1, 8)  # 256 bytes
    assert cache.add([1, 2, 3], small, 0, 0)
    assert cache.add([1, 2, 3, 4, 5], small, 0, 2)  # extends the first: it replaces it
    assert len(cache) == 1 and cache.nbytes == small.nbytes + 5 * 4
    entry, n = cache.match([1, 2, 3, 4, 5])
    assert n == 4 and entry.start == 2  # never the prompt's last token
    assert cache.match([1, 9]) == (None, 0)  # shorter than min_reuse
    big = [_block(2, 128) for _ in range(3)]  # 8,192 bytes each, counted once for two rows
    cache.add([7] * 100, big[0], 0, 0)
    cache.add([6] * 100, big[0], 1, 0)
    assert cache.nbytes == small.nbytes + big[0].nbytes + 205 * 4
    cache.add([8] * 100, big[1], 0, 0)
    cache.add([9] * 100, big[2], 0, 0)
    assert cache.nbytes <= 10_000 and cache.stats["evictions"] >= 1
    assert cache.match([1, 2, 3, 4, 6]) == (None, 0)  # the oldest went first
    assert not cache.add([1] * 10, _block(1, 4000), 0, 0)  # alone beyond the budget
    with pytest.raises(ValueError, match="do not fit"):
        cache.add([1, 2], small, 0, 7)
    with pytest.raises(ValueError, match="do not fit"):
        cache.add([1, 2], small, 1, 0)


def test_rows_beyond_the_budget_are_not_stored(tiny_model):
    roomy = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    generate(tiny_model, EPISODES, max_new_tokens=NEW, prefix_cache=roomy)
    block = next(iter(roomy._entries.values())).block
    assert len(roomy) == 2 and block.num_rows == 2
    # Room for one row of the block (and its token ids), not both.
    budget = block.nbytes // 2 + 4 * (len(EPISODES[0]) + NEW)
    cache = prefix_cache.PrefixCache(max_bytes=budget, min_reuse=8)
    generate(tiny_model, EPISODES, max_new_tokens=NEW, prefix_cache=cache)
    assert len(cache) == 1 and cache.nbytes <= budget
    entry, n = cache.match(EPISODES[0] + [1])
    assert n == len(EPISODES[0]) and entry.block.num_rows == 1  # the first row was kept
    twin, _ = roomy.match(EPISODES[0] + [1])
    np.testing.assert_array_equal(entry.keys, twin.keys)


def test_a_reusing_call_has_the_cache_layout_of_a_plain_call(tiny_model):
    """Reuse changes which tokens are computed, not where they sit: every row's run
    starts and ends at the slots of a plain call, in a decode cache of the same size."""
    cache = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    outs = _phases(tiny_model, cache, rounds=2)
    assert cache.stats["hits"] >= 2 and outs[-1].reused_tokens > 0
    last = list(cache._entries.values())[-1].block  # the last call's rows
    entries = sorted((e for e in cache._entries.values() if e.block is last), key=lambda e: e.row)
    assert [e.row for e in entries] == [0, 1]
    prompts = [
        e.tokens[: len(e.tokens) - len(t) + 1].tolist()
        for e, t in zip(entries, outs[-1].tokens, strict=True)
    ]
    # Empty and not sharing within the call: the same prompts prefilled whole.
    plain = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8, share_within_call=False)
    generate(tiny_model, prompts, max_new_tokens=NEW, prefix_cache=plain, seed=1)
    twins = sorted(plain._entries.values(), key=lambda e: e.row)
    assert plain.stats["hits"] == 0
    for entry, twin in zip(entries, twins, strict=True):
        np.testing.assert_array_equal(entry.tokens, twin.tokens)
        assert (entry.start, entry.block.k[0].shape) == (twin.start, twin.block.k[0].shape)


def test_overlay_writes_only_real_new_tokens(tiny_model):
    """A left-padded block of new tokens laid over the end of a cached prefix gives the
    cache and logits of a plain prefill; without the overlay the padding would overwrite
    the prefix's last slots."""
    config = tiny_model.config
    seq = jnp.asarray([RNG.integers(1, 128, 50).tolist()], jnp.int32)
    width, reused, block = 64, 30, 32  # the block's 12 padding slots cover reused ones
    first = width - 50
    ids = jnp.zeros((1, width), jnp.int32).at[:, first:].set(seq)
    real = jnp.zeros((1, width), jnp.int32).at[:, first:].set(1)
    plain_logits, plain = tiny_model.decode(
        ids, positions=jnp.maximum(jnp.cumsum(real, -1) - 1, 0),
        cache=kv_cache.init_cache(config, 1, width), cache_index=jnp.int32(0),
        attention_mask=real, last_only=True, cache_is_empty=True,
    )  # fmt: skip
    kept = (jnp.arange(width) >= first) & (jnp.arange(width) < first + reused)
    prefix = kv_cache.KVCache(
        k=tuple(jnp.where(kept[None, None, :, None], k, 0.0) for k in plain.k),
        v=tuple(jnp.where(kept[None, None, None, :], v, 0.0) for v in plain.v),
        mask=kept[None, :],
    )
    suffix = seq[:, reused:]
    block_ids = jnp.zeros((1, block), jnp.int32).at[:, block - 20 :].set(suffix)
    block_mask = jnp.zeros((1, block), jnp.int32).at[:, block - 20 :].set(1)
    logits, out = tiny_model.decode(
        block_ids, positions=reused + jnp.maximum(jnp.cumsum(block_mask, -1) - 1, 0),
        cache=prefix, cache_index=jnp.int32(width - block), attention_mask=block_mask,
        last_only=True, overlay=True,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(out.mask), np.asarray(plain.mask))
    np.testing.assert_allclose(logits, plain_logits, atol=1e-4)
    used = slice(first, width)  # the plain prefill also writes (junk) keys of its padding
    for a, b in zip(out.k, plain.k, strict=True):
        np.testing.assert_allclose(a[:, :, used], b[:, :, used], atol=1e-5)
    for a, b in zip(out.v, plain.v, strict=True):
        np.testing.assert_allclose(a[..., used], b[..., used], atol=1e-5)


def test_prompts_reusing_runs_of_different_calls(tiny_model):
    """Two prompts whose prefixes were computed by two earlier calls (two blocks) are
    gathered into one prefill, and sample what plain calls sample."""
    cache = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    first = generate(tiny_model, [EPISODES[0]], max_new_tokens=NEW, prefix_cache=cache)
    second = generate(tiny_model, [EPISODES[1]], max_new_tokens=NEW, prefix_cache=cache)
    assert len({id(e.block) for e in cache._entries.values()}) == 2
    prompts = [
        EPISODES[0] + first.tokens[0] + [3, 4, 5],
        EPISODES[1] + second.tokens[0] + [6, 7],
    ]
    reused = generate(tiny_model, prompts, max_new_tokens=NEW, prefix_cache=cache)
    plain = generate(tiny_model, prompts, max_new_tokens=NEW)
    assert reused.reused_tokens == sum(len(p) - 3 for p in prompts) - 1
    assert reused.tokens == plain.tokens
    for x, y in zip(reused.plain_logprobs, plain.plain_logprobs, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_reuse_with_samples_a_penalty_and_an_unmatched_prompt(tiny_model):
    """Two samples per prompt (decode rows copied from their prompt's), a repetition
    penalty, three prompts (a padded batch bucket) of which one matches nothing (its
    whole prompt in the new-token block): what plain calls sample."""
    settings = dict(max_new_tokens=NEW, n_samples=2, repetition_penalty=1.3)
    cache = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    starts = [EPISODES[0], EPISODES[1], SYSTEM[::-1] + [9] * 5]
    first = generate(tiny_model, starts, prefix_cache=cache, **settings)
    assert len(cache) >= 3  # the two samples of a prompt are the same greedy sequence
    prompts = [
        starts[0] + first.tokens[0] + [3, 4],
        RNG.integers(1, 128, 70).tolist(),  # longer than any entry, shares nothing
        starts[2] + first.tokens[4] + [5],
    ]
    reused = generate(tiny_model, prompts, prefix_cache=cache, **settings)
    plain = generate(tiny_model, prompts, **settings)
    assert 0 < reused.reused_tokens and reused.prefill_tokens >= len(prompts[1]) - 1
    assert reused.tokens == plain.tokens
    for x, y in zip(reused.plain_logprobs, plain.plain_logprobs, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_eviction_frees_a_whole_block():
    block, other = _block(2, 128), _block(1, 64)  # 8,192 and 2,048 bytes
    cache = prefix_cache.PrefixCache(max_bytes=block.nbytes + other.nbytes + 160, min_reuse=2)
    cache.add([1] * 10, block, 0, 0)
    cache.add([2] * 10, other, 0, 0)
    cache.add([3] * 10, block, 1, 0)
    assert len(cache) == 3 and cache.stats["evictions"] == 0
    cache.add([4] * 10, _block(1, 64), 0, 0)  # over budget: block's two entries go together
    assert cache.stats["evictions"] == 1 and len(cache) == 2
    assert cache.match([2] * 11)[1] == 10 and cache.match([3] * 11) == (None, 0)


def test_shared_prefixes_are_the_longest_per_branch():
    a = list(range(1, 41))
    prompts = [
        a + [50, 51, 52, 7],  # with the next one: a + [50, 51, 52] (43 tokens)
        a + [50, 51, 52, 8, 9],
        a + [60] * 5,  # shares only `a` with the others: covered by the 43-token prefix
        [99] * 30,  # shares nothing
        a[:10] + [3] * 40,  # shares 10 tokens: below min_len
    ]
    found = prefix_cache.shared_prefixes(prompts, min_len=16)
    assert found == [(a + [50, 51, 52], 7)]
    # Two separate branches each give their own prefix, sorted longest first.
    b = [77] * 20
    found = prefix_cache.shared_prefixes([a + [1, 2], a + [1, 3], b + [4, 5], b + [4, 6]], 16)
    assert found == [(a + [1], 2), (b + [4], 5)]
    # A prompt that is a prefix of another stops one token before its own end.
    assert prefix_cache.shared_prefixes([a, a + [5, 6]], 16) == [(a[:-1], a[-1])]
    assert prefix_cache.shared_prefixes([a], 16) == []


def test_prompts_of_one_call_prefill_their_shared_prefix_once(tiny_model):
    """Four prompts sharing a 60-token head: with sharing, the head is prefilled once and
    each prompt reuses it, and every row samples what a call without any cache samples."""
    head = RNG.integers(1, 128, 60).tolist()
    prompts = [head + RNG.integers(1, 128, n).tolist() for n in (3, 7, 12, 20)]
    settings = dict(max_new_tokens=NEW, n_samples=2, temperature=0.7, seed=3)
    plain = generate(tiny_model, prompts, **settings)
    shared = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    alone = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8, share_within_call=False)
    with_sharing = generate(tiny_model, prompts, prefix_cache=shared, **settings)
    without = generate(tiny_model, prompts, prefix_cache=alone, **settings)
    whole = sum(len(p) - 1 for p in prompts)
    assert without.prefill_tokens == whole and without.reused_tokens == 0
    assert with_sharing.reused_tokens == 4 * 60
    assert with_sharing.prefill_tokens == whole - 3 * 60  # the head once, then the rest
    assert shared.stats["shared_prefixes"] == 1
    for out in (with_sharing, without):
        assert out.tokens == plain.tokens
        for x, y in zip(out.plain_logprobs, plain.plain_logprobs, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-5)
    # The head's entry is superseded by the rows that extend it (no orphan block kept).
    assert all(len(e.tokens) > 60 for e in shared._entries.values())
    # A second call with the same head finds it cached: nothing is prefilled twice.
    again = generate(tiny_model, [head + [5] * 9, head + [6] * 4], prefix_cache=shared, **settings)
    assert shared.stats["shared_prefixes"] == 1 and again.reused_tokens == 2 * 60


def test_branches_of_a_shared_head_prefill_the_head_once(tiny_model):
    """Two branches that share a head: the head is prefilled once, then each branch."""
    head, a, b = (RNG.integers(1, 128, n).tolist() for n in (50, 20, 20))
    prompts = [head + a + [1, 2], head + a + [3, 4, 5], head + b + [6], head + b + [7, 8]]
    cache = prefix_cache.PrefixCache(max_bytes=ROOMY, min_reuse=8)
    out = generate(tiny_model, prompts, max_new_tokens=4, prefix_cache=cache)
    plain = generate(tiny_model, prompts, max_new_tokens=4)
    suffixes = sum(len(p) - 1 - 70 for p in prompts)
    assert out.prefill_tokens == 50 + 2 * 20 + suffixes
    assert cache.stats["shared_prefixes"] == 3  # the head, then the two branches
    assert out.tokens == plain.tokens
