"""Prefix reuse across calls (`generate(..., prefix_cache=...)`) against plain calls and transformers.

The prompts imitate an episode: each phase's prompt shares a long prefix with the previous
phase's prompt and reply, then differs (a new observation, another instruction).
"""

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from pau_jax.sampling import generate, prefix_cache, sampler

RNG = np.random.default_rng(7)
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
    cache = prefix_cache.PrefixCache(min_reuse=8)
    before = sampler.call_counts().get("reused_tokens", 0)
    reused = _phases(tiny_model, cache)
    assert sampler.call_counts()["reused_tokens"] > before  # later phases reused prefixes
    assert cache.stats["hits"] >= 4 and len(cache) >= 2
    for a, b in zip(plain, reused, strict=True):
        assert a.tokens == b.tokens
        for x, y in zip(a.plain_logprobs, b.plain_logprobs, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-5)


def test_sampled_logprobs_on_a_reused_prefix_equal_the_full_forward(tiny_model, torch_model):
    cache = prefix_cache.PrefixCache(min_reuse=8)
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
    cache = prefix_cache.PrefixCache(min_reuse=8)
    _phases(tiny_model, cache, rounds=2)
    fresh = prefix_cache.PrefixCache(min_reuse=8)
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
    cache = prefix_cache.PrefixCache(min_reuse=8)
    generate(tiny_model, [EPISODES[0]], max_new_tokens=4, prefix_cache=cache)
    assert len(cache) == 1
    generate(tiny_model, [EPISODES[0] + [5]], max_new_tokens=4, prefix_cache=cache)
    assert cache.stats["hits"] == 1 and cache.stats["invalidations"] == 0
    graphdef, state = nnx.split(tiny_model)
    updated = nnx.merge(graphdef, jax.tree.map(lambda x: x + 0, state))  # new arrays
    generate(updated, [EPISODES[0] + [5, 6]], max_new_tokens=4, prefix_cache=cache)
    assert cache.stats["invalidations"] == 1 and cache.stats["hits"] == 1


def test_match_limits_budget_and_superseded_entries():
    cache = prefix_cache.PrefixCache(max_bytes=10_000, min_reuse=2)

    def kv(n):
        return np.zeros((1, 1, n, 4), np.float32), np.zeros((1, 1, 4, n), np.float32)

    cache.add([1, 2, 3], *kv(3))
    cache.add([1, 2, 3, 4, 5], *kv(5))  # extends the first: it replaces it
    assert len(cache) == 1
    entry, n = cache.match([1, 2, 3, 4, 5])
    assert n == 4  # never the prompt's last token
    assert cache.match([1, 9]) == (None, 0)  # shorter than min_reuse
    cache.add([7] * 100, *kv(100))  # 100 * 32 + 400 bytes
    cache.add([8] * 100, *kv(100))
    cache.add([9] * 100, *kv(100))
    assert cache.nbytes <= 10_000 and cache.stats["evictions"] >= 1
    assert cache.match([1, 2, 3, 4, 6]) == (None, 0)  # the oldest went first
    with pytest.raises(ValueError, match="tokens but keys"):
        cache.add([1, 2], *kv(3))


def test_rows_beyond_the_budget_are_not_stored(tiny_model):
    config = tiny_model.config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    # Room for one row of the two (prompt + reply, with the token ids), not both.
    budget = (len(EPISODES[1]) + NEW + 2) * (per_token + 4)
    cache = prefix_cache.PrefixCache(max_bytes=budget, min_reuse=8)
    generate(tiny_model, EPISODES, max_new_tokens=NEW, prefix_cache=cache)
    assert len(cache) == 1 and cache.nbytes <= budget
    _, n = cache.match(EPISODES[0] + [1])
    assert n == len(EPISODES[0])  # the first row was kept
