"""generate(repetition_penalty=...) against transformers' RepetitionPenaltyLogitsProcessor."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.generation import logits_process

from pau_jax.sampling import generate, sampler
from pau_jax.sampling import logits as logits_lib

# Different lengths, batched with left padding (pad id 0); the last repeats two ids.
PROMPTS = [
    [3, 17, 42],
    [5, 9, 11, 60, 61, 62, 7],
    np.random.default_rng(1).integers(0, 128, 40).tolist(),
    [8] * 5 + [9] * 5,
]
NEW = 12


def _hf_greedy_alone(torch_model, prompt, penalty):
    """transformers' greedy generate of one unpadded prompt; returns the new ids."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = torch_model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW,
            do_sample=False,
            repetition_penalty=penalty,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def _hf_greedy_left_padded(torch_model, prompts, penalty):
    """transformers' greedy generate of a left-padded batch (pad id 0); new ids per row.

    transformers 5.24 excludes the left padding from the penalty (`prompt_ignore_length`
    from the attention mask), as pau_jax does.
    """
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    with torch.no_grad():
        out = torch_model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=NEW,
            do_sample=False,
            repetition_penalty=penalty,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[:, width:].tolist()


def _hf_penalised(logits, ids, penalty):
    """transformers' processor on [B, V] logits given the [B, L] ids seen so far."""
    processor = logits_process.RepetitionPenaltyLogitsProcessor(float(penalty))
    return processor(torch.tensor(ids), torch.from_numpy(logits.copy())).numpy()


def test_greedy_with_a_penalty_matches_transformers_prompt_by_prompt(tiny_model, torch_model):
    ours = generate(tiny_model, PROMPTS, max_new_tokens=NEW, repetition_penalty=1.2)
    plain = generate(tiny_model, PROMPTS, max_new_tokens=NEW)
    for row, prompt in enumerate(PROMPTS):
        assert ours.tokens[row] == _hf_greedy_alone(torch_model, prompt, 1.2), f"prompt {row}"
    assert ours.tokens == _hf_greedy_left_padded(torch_model, PROMPTS, 1.2)
    changed = [a != b for a, b in zip(ours.tokens, plain.tokens)]
    assert any(changed), "the penalty never changed the output; the test would prove nothing"
    # Greedy: `logprobs` stay 0; `plain_logprobs` are of the raw logits (checked below).
    for logprobs in ours.logprobs:
        np.testing.assert_array_equal(logprobs, 0.0)


def test_penalised_logits_equal_the_transformers_processor():
    rng = np.random.default_rng(0)
    batch, vocab, seen_len = 6, 97, 30
    scores = (rng.normal(size=(batch, vocab)) * 3).astype(np.float32)
    scores[:, :5] = 0.0  # exactly zero: unchanged either way
    ids = rng.integers(0, vocab, (batch, seen_len))
    ids[:, 1] = ids[:, 0]  # duplicates are penalised once
    ids[:, 2] = 3
    penalties = np.asarray([1.2, 1.3, 0.7, 1.0, 2.5, 1.2], np.float32)
    seen = logits_lib.seen_tokens(jnp.asarray(ids), jnp.ones((batch, seen_len)), vocab)
    ours = np.asarray(
        logits_lib.repetition_penalty_logits(jnp.asarray(scores), seen, jnp.asarray(penalties))
    )
    for row in range(batch):
        expected = _hf_penalised(scores[row : row + 1], ids[row : row + 1], penalties[row])
        # Bit for bit: a true float32 division, as PyTorch's.
        np.testing.assert_array_equal(ours[row], expected[0])
    assert (ours[3] == scores[3]).all(), "penalty 1 must leave the logits unchanged"
    assert (ours[0] != scores[0]).sum() > 10
    assert (ours[:, :5] == 0).all()


def test_seen_tokens_ignore_padding_and_marking_adds_tokens():
    ids = jnp.asarray([[0, 0, 7, 7, 2], [4, 5, 0, 6, 1]])
    mask = jnp.asarray([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    seen = logits_lib.seen_tokens(ids, mask, 10)
    expected = np.zeros((2, 10), bool)
    expected[0, [2, 7]] = True
    expected[1, [0, 1, 4, 5, 6]] = True
    np.testing.assert_array_equal(np.asarray(seen), expected)
    marked = logits_lib.mark_seen(seen, jnp.asarray([9, 4]))
    expected[0, 9] = True
    np.testing.assert_array_equal(np.asarray(marked), expected)


def test_rows_with_and_without_a_penalty_match_running_each_alone(tiny_model):
    penalties = [1.0, 1.3, 1.0, 1.3]
    mixed = generate(tiny_model, PROMPTS, max_new_tokens=NEW, repetition_penalty=penalties)
    for row, (prompt, penalty) in enumerate(zip(PROMPTS, penalties)):
        alone = generate(tiny_model, [prompt], max_new_tokens=NEW, repetition_penalty=penalty)
        assert mixed.tokens[row] == alone.tokens[0], f"row {row}"
        np.testing.assert_allclose(mixed.plain_logprobs[row], alone.plain_logprobs[0], atol=1e-5)
    unpenalised = generate(tiny_model, PROMPTS, max_new_tokens=NEW)
    assert [mixed.tokens[i] for i in (0, 2)] == [unpenalised.tokens[i] for i in (0, 2)]
    assert [mixed.tokens[i] for i in (1, 3)] != [unpenalised.tokens[i] for i in (1, 3)]


def test_group_rows_take_per_row_penalties(tiny_model):
    # One prompt, G = 2 rows prefilled once: row 0 unpenalised, row 1 penalised.
    out = generate(
        tiny_model, [PROMPTS[3]], max_new_tokens=NEW, n_samples=2, repetition_penalty=[1.0, 1.3]
    )
    assert out.num_prefilled == 1
    assert out.tokens[0] == generate(tiny_model, [PROMPTS[3]], max_new_tokens=NEW).tokens[0]
    penalised = generate(tiny_model, [PROMPTS[3]], max_new_tokens=NEW, repetition_penalty=1.3)
    assert out.tokens[1] == penalised.tokens[0] != out.tokens[0]


def test_sampled_logprobs_are_of_the_penalised_then_warped_distribution(tiny_model, torch_model):
    temperature, top_k, penalty = 0.8, 5, 1.3
    out = generate(
        tiny_model,
        PROMPTS,
        max_new_tokens=NEW,
        temperature=temperature,
        top_k=top_k,
        repetition_penalty=penalty,
        seed=2,
    )
    for row, prompt in enumerate(PROMPTS):
        tokens = out.tokens[row]
        sequence = list(prompt) + list(tokens)
        with torch.no_grad():
            raw = torch_model(torch.tensor([sequence])).logits[0].float().numpy()
        raw = raw[len(prompt) - 1 : len(sequence) - 1]
        drawn, plain = [], []
        for i, token in enumerate(tokens):
            scores = _hf_penalised(raw[i : i + 1], [sequence[: len(prompt) + i]], penalty)
            scores = torch.from_numpy(scores)
            scores = logits_process.TemperatureLogitsWarper(temperature)(None, scores)
            scores = logits_process.TopKLogitsWarper(top_k)(None, scores)
            drawn.append(torch.log_softmax(scores, -1)[0, token].item())
            plain.append(jax.nn.log_softmax(raw[i] / temperature)[token])
        assert np.isfinite(drawn).all(), f"row {row} drew a filtered-out token"
        np.testing.assert_allclose(out.logprobs[row], drawn, atol=2e-4)
        np.testing.assert_allclose(out.plain_logprobs[row], plain, atol=2e-4)
        assert not np.allclose(out.logprobs[row], out.plain_logprobs[row], atol=1e-3)


def test_no_penalty_uses_the_plain_decode_program(tiny_model):
    generate(tiny_model, PROMPTS, max_new_tokens=NEW)
    before = sampler.trace_counts()["decode"]
    generate(tiny_model, PROMPTS, max_new_tokens=NEW, repetition_penalty=[1.0] * len(PROMPTS))
    assert sampler.trace_counts()["decode"] == before
    generate(tiny_model, PROMPTS, max_new_tokens=NEW, repetition_penalty=1.2)
    with_penalty = sampler.trace_counts()["decode"]
    generate(tiny_model, PROMPTS, max_new_tokens=NEW, repetition_penalty=[1.1, 1.0, 2.0, 0.9])
    assert sampler.trace_counts()["decode"] == with_penalty  # values are traced


@pytest.mark.parametrize(
    "value,match",
    [
        (0.0, "repetition_penalty must be finite and > 0"),
        (-1.2, "repetition_penalty must be finite and > 0"),
        (float("nan"), "repetition_penalty must be finite and > 0"),
        (float("inf"), "repetition_penalty must be finite and > 0"),
        ([1.2, 1.0], "repetition_penalty must be a scalar or have 4 .per prompt."),
    ],
)
def test_bad_penalties_fail_with_a_clear_message(tiny_model, value, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny_model, PROMPTS, max_new_tokens=4, repetition_penalty=value)
