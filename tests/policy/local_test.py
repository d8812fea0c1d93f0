"""LocalPolicy.complete: prompt ids, sampled ids and log-probs at the sampling temperature."""

import sys

import checkpoints
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pau_jax.models import qwen3
from pau_jax.policy import local
from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.local import LocalPolicy
from pau_jax.sampling import generate, sampler

CONVERSATIONS = [
    [{"role": "user", "content": "What does test_func(3) return?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
]
CONFIG = checkpoints.tiny_qwen3_config(max_position_embeddings=2048)


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from pau_jax.tokenizer import load_tokenizer

    return qwen3.Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(0)), load_tokenizer("qwen3-offline")


@nnx.jit
def _logits(model, ids):
    return model(ids, jnp.ones_like(ids))


def _log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_complete_returns_prompt_tokens_and_logprobs_at_the_temperature(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    temperature = 0.7
    sampling = SamplingConfig(max_new_tokens=5, temperature=temperature, seed=3)
    completions = LocalPolicy(model, tokenizer, sampling).complete(CONVERSATIONS)
    for conversation, c in zip(CONVERSATIONS, completions):
        assert list(c.prompt_ids) == LocalPolicy(model, tokenizer).encode(conversation)
        assert len(c.token_ids) == len(c.logprobs) == c.completion_tokens > 0
        assert c.prompt_tokens == len(c.prompt_ids)
        assert c.text == tokenizer.decode(list(c.token_ids), skip_special_tokens=True)
        # Teacher-forced log_softmax(logits / T) of the same tokens (the learner's view).
        ids = np.asarray([list(c.prompt_ids) + list(c.token_ids)], np.int32)
        logits = np.asarray(_logits(model, ids))[0] / temperature
        lp = _log_softmax(logits)
        n = len(c.prompt_ids)
        expected = [lp[n - 1 + i, t] for i, t in enumerate(c.token_ids)]
        np.testing.assert_allclose(c.logprobs, expected, atol=2e-4)


def test_complete_matches_the_sampler_and_call_is_unchanged(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0, seed=5)
    completions = LocalPolicy(model, tokenizer, sampling).complete(CONVERSATIONS)
    policy = LocalPolicy(model, tokenizer, sampling)
    prompts = [policy.encode(c) for c in CONVERSATIONS]
    out = generate(
        model,
        prompts,
        max_new_tokens=4,
        temperature=1.0,
        stop_token_ids=policy.stop_token_ids,
        seed=5,
    )
    for c, tokens, plain in zip(completions, out.tokens, out.plain_logprobs):
        assert list(c.token_ids) == list(tokens)
        np.testing.assert_array_equal(np.asarray(c.logprobs, np.float32), plain)
    # __call__ still returns the texts (the same draws: call 0 of a fresh policy).
    assert LocalPolicy(model, tokenizer, sampling)(CONVERSATIONS) == [c.text for c in completions]


def test_greedy_logprobs_are_plain_log_softmax(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    (c,) = LocalPolicy(model, tokenizer, SamplingConfig(max_new_tokens=3)).complete(
        CONVERSATIONS[:1]
    )
    ids = np.asarray([list(c.prompt_ids) + list(c.token_ids)], np.int32)
    lp = _log_softmax(np.asarray(_logits(model, ids))[0])
    n = len(c.prompt_ids)
    # Greedy: each token is the argmax, and its log-prob is log_softmax at T = 1 (not 0).
    for i, t in enumerate(c.token_ids):
        assert t == int(np.argmax(lp[n - 1 + i]))
    np.testing.assert_allclose(
        c.logprobs, [lp[n - 1 + i, t] for i, t in enumerate(c.token_ids)], atol=2e-4
    )
    assert all(x < 0 for x in c.logprobs)


LONG = [{"role": "user", "content": "Describe test_func. " * 20}]


def test_too_long_prompts_are_not_sampled_and_the_rest_are_unaffected(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    conversations = [CONVERSATIONS[0], LONG, CONVERSATIONS[1]]
    limit = 30
    policy = LocalPolicy(
        model, tokenizer, SamplingConfig(max_new_tokens=4, max_prompt_tokens=limit)
    )
    long_prompt = policy.encode(LONG)
    assert len(long_prompt) > limit >= max(len(policy.encode(c)) for c in CONVERSATIONS)
    completions = policy.complete(conversations)
    skipped = completions[1]
    assert skipped.finish_reason == "prompt_length" and skipped.text == ""
    assert skipped.prompt_tokens == len(long_prompt) and skipped.completion_tokens == 0
    assert skipped.token_ids == () and skipped.logprobs == ()
    assert policy.last_stats["prompts_too_long"] == 1
    unlimited = LocalPolicy(model, tokenizer, SamplingConfig(max_new_tokens=4))
    expected = unlimited.complete(CONVERSATIONS)
    for got, want in zip([completions[0], completions[2]], expected):
        assert got.finish_reason == want.finish_reason != "prompt_length"
        assert got.token_ids == want.token_ids and got.text == want.text
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-6)
    # A prompt of exactly the limit is sampled.
    exact = LocalPolicy(
        model,
        tokenizer,
        SamplingConfig(max_new_tokens=4, max_prompt_tokens=len(policy.encode(CONVERSATIONS[0]))),
    )
    assert exact.complete(CONVERSATIONS[:1])[0].finish_reason != "prompt_length"


def test_all_prompts_too_long_make_no_sampler_call(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    policy = LocalPolicy(model, tokenizer, SamplingConfig(max_new_tokens=4, max_prompt_tokens=5))
    before = sampler.call_counts().get("decode", 0)
    completions = policy.complete(CONVERSATIONS)
    assert sampler.call_counts().get("decode", 0) == before
    assert [c.finish_reason for c in completions] == ["prompt_length"] * 2
    assert policy(CONVERSATIONS) == ["", ""]


def test_repetition_penalty_reaches_the_sampler(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    penalty = 2.0
    plain = LocalPolicy(model, tokenizer, SamplingConfig(max_new_tokens=6)).complete(CONVERSATIONS)
    policy = LocalPolicy(
        model, tokenizer, SamplingConfig(max_new_tokens=6, repetition_penalty=penalty)
    )
    penalised = policy.complete(CONVERSATIONS)
    out = generate(
        model,
        [policy.encode(c) for c in CONVERSATIONS],
        max_new_tokens=6,
        repetition_penalty=penalty,
        stop_token_ids=policy.stop_token_ids,
    )
    assert [list(c.token_ids) for c in penalised] == out.tokens
    assert [c.token_ids for c in penalised] != [c.token_ids for c in plain]
    # Per-conversation penalties override the config's, row by row, in one batch.
    mixed = policy.complete(CONVERSATIONS, repetition_penalties=[1.0, penalty])
    assert mixed[0].token_ids == plain[0].token_ids
    assert mixed[1].token_ids == penalised[1].token_ids
    # The recorded log-probs stay those of the raw logits (the learner's view).
    c = penalised[0]
    ids = np.asarray([list(c.prompt_ids) + list(c.token_ids)], np.int32)
    lp = _log_softmax(np.asarray(_logits(model, ids))[0])
    n = len(c.prompt_ids)
    np.testing.assert_allclose(
        c.logprobs, [lp[n - 1 + i, t] for i, t in enumerate(c.token_ids)], atol=2e-4
    )


def test_bad_sampling_settings_fail_with_a_clear_message(model_and_tokenizer):
    for value in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="repetition_penalty must be finite and > 0"):
            SamplingConfig(repetition_penalty=value)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        SamplingConfig(max_prompt_tokens=0)
    model, tokenizer = model_and_tokenizer
    with pytest.raises(ValueError, match="one per conversation"):
        LocalPolicy(model, tokenizer).complete(CONVERSATIONS, repetition_penalties=[1.2])


def test_masked_inputs_bound_their_tokens_so_every_reply_is_readable():
    # 512 tokens of at most 19 bytes and 8 digits: within the parser's 10,000 characters
    # and Python's 4,300 int digits.
    assert local._input_bounds(512) == {"max_piece_bytes": 19, "max_piece_digits": 8}
    for budget in (1, 48, 512, 4300):
        bounds = local._input_bounds(budget)
        assert budget * bounds["max_piece_bytes"] <= local.MAX_CHARS  # the parser's limit
        assert budget * bounds["max_piece_digits"] <= sys.get_int_max_str_digits()
    with pytest.raises(ValueError, match="structured inputs need max_new_tokens <= 4300"):
        local._input_bounds(4301)
