"""generate() on a tiny random Qwen3 against transformers (PyTorch) and peft on the same weights.

Most calls share one set of bucketed shapes (3 prompts, the longest of 34 to 65 tokens, at
most 16 new tokens), so the file compiles the prefill and the decode loop only a few times.
"""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
from flax import nnx
from transformers.generation import logits_process

from pau_jax.models import lora, qwen3
from pau_jax.sampling import batching, generate, prefill, sampler

PROMPTS = [
    [3, 17, 42],
    [5, 9, 11, 60, 61, 62, 7],
    np.random.default_rng(1).integers(0, 128, 40).tolist(),  # pads the batch to 64 slots
]
NEW = 12


def _left_padded(prompts):
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def _hf_greedy(torch_model, prompts, max_new_tokens):
    """transformers' greedy generate on a left-padded batch; returns the new ids per row."""
    ids, mask = _left_padded(prompts)
    with torch.no_grad():
        out = torch_model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[:, ids.shape[1] :].tolist()


def _torch_logits(torch_model, sequence):
    """[len(sequence), V] float32 logits of a full forward pass."""
    with torch.no_grad():
        return torch_model(torch.tensor([sequence])).logits[0].float().numpy()


def _next_token_logits(torch_model, prompt, tokens):
    """[len(tokens), V] logits that predicted each of `tokens` after `prompt`."""
    logits = _torch_logits(torch_model, list(prompt) + list(tokens))
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]


def _log_softmax(x):
    return np.asarray(jax.nn.log_softmax(jnp.asarray(x), axis=-1))


@pytest.fixture(scope="module")
def greedy_reference(tiny_model):
    return generate(tiny_model, PROMPTS, max_new_tokens=NEW)


def test_greedy_matches_transformers_on_a_padded_batch(tiny_model, torch_model, greedy_reference):
    expected = _hf_greedy(torch_model, PROMPTS, NEW)
    assert greedy_reference.tokens == expected
    assert greedy_reference.finish_reasons == ["length"] * 3
    np.testing.assert_array_equal(greedy_reference.lengths, [NEW] * 3)


def test_a_prompt_gives_the_same_tokens_alone_and_in_a_padded_batch(tiny_model, greedy_reference):
    # Alone, prompt 0 sits in a 32-slot prefill; in the batch, in a 64-slot one.
    alone = generate(tiny_model, [PROMPTS[0]], max_new_tokens=NEW)
    assert alone.tokens[0] == greedy_reference.tokens[0]
    np.testing.assert_allclose(
        alone.plain_logprobs[0], greedy_reference.plain_logprobs[0], atol=1e-5
    )


def test_cached_decode_logits_match_the_full_forward_at_every_position(tiny_model, torch_model):
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, 128, size=n).tolist() for n in (16, 20, 60)]
    prompts = [seq[:k] for seq, k in zip(sequences, (2, 6, 45))]
    layout = batching.layout_batch(prompts, 1)
    buffer_len = batching.bucket_size(NEW, **batching.NEW_TOKENS_BUCKET)
    width = layout.input_ids.shape[1]
    graphdef, state = nnx.split(tiny_model)
    cache = prefill._prefill(
        graphdef,
        state,
        jnp.asarray(layout.input_ids),
        jnp.asarray(layout.mask),
        jnp.asarray(layout.row_source),
        cache_len=width + buffer_len,
        cache_dtype=jnp.dtype(jnp.float32),
    )

    @jax.jit
    def step(state, tokens, positions, cache, index):
        model = nnx.merge(graphdef, state)
        return model.decode(
            tokens[:, None], positions=positions[:, None], cache=cache, cache_index=index
        )

    full = [_torch_logits(torch_model, seq) for seq in sequences]
    fed = jnp.asarray(layout.last_tokens)
    for i in range(NEW):
        logits, cache = step(state, fed, jnp.asarray(layout.prompt_lens - 1 + i), cache, width + i)
        for row, prompt in enumerate(prompts):
            expected = full[row][len(prompt) - 1 + i]
            np.testing.assert_allclose(np.asarray(logits[row, 0]), expected, atol=2e-4, rtol=1e-4)
        forced = [seq[len(prompt) + i] for seq, prompt in zip(sequences, prompts)]
        fed = jnp.asarray(forced + [0] * (len(layout.last_tokens) - len(forced)), jnp.int32)


def test_logprobs_are_the_temperature_softmax_of_a_full_forward(tiny_model, torch_model):
    temperature = 0.7
    out = generate(tiny_model, PROMPTS, max_new_tokens=NEW, temperature=temperature, seed=1)
    for prompt, tokens, logprobs, plain in zip(
        PROMPTS, out.tokens, out.logprobs, out.plain_logprobs
    ):
        logits = _next_token_logits(torch_model, prompt, tokens)
        expected = _log_softmax(logits / temperature)[np.arange(len(tokens)), tokens]
        np.testing.assert_allclose(logprobs, expected, atol=1e-4)
        np.testing.assert_allclose(plain, expected, atol=1e-4)


def test_top_k_one_equals_greedy(tiny_model, greedy_reference):
    out = generate(tiny_model, PROMPTS, max_new_tokens=NEW, temperature=1.3, top_k=1, seed=5)
    assert out.tokens == greedy_reference.tokens
    for logprobs in out.logprobs:
        np.testing.assert_allclose(logprobs, 0.0, atol=1e-6)


def test_top_k_and_top_p_restrict_the_support(tiny_model, torch_model, greedy_reference):
    temperature, top_k, top_p = [1.0, 1.0, 1.5], [3, 0, 2], [1.0, 0.6, 0.9]
    not_argmax = 0
    for seed in range(4):
        out = generate(
            tiny_model,
            PROMPTS,
            max_new_tokens=NEW,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
        )
        for row, prompt in enumerate(PROMPTS):
            tokens = out.tokens[row]
            scores = torch.from_numpy(_next_token_logits(torch_model, prompt, tokens))
            scores = logits_process.TemperatureLogitsWarper(temperature[row])(None, scores)
            if top_k[row]:
                scores = logits_process.TopKLogitsWarper(top_k[row])(None, scores)
            scores = logits_process.TopPLogitsWarper(top_p[row])(None, scores)
            allowed = torch.log_softmax(scores, -1).numpy()
            picked = allowed[np.arange(len(tokens)), tokens]
            assert np.isfinite(picked).all(), f"row {row} drew a filtered-out token"
            np.testing.assert_allclose(out.logprobs[row], picked, atol=1e-4)
            not_argmax += int((scores.numpy().argmax(-1) != np.asarray(tokens)).sum())
    assert not_argmax > 0, "sampling never left the argmax"


def test_same_seed_same_output(tiny_model):
    def run(seed):
        return generate(tiny_model, PROMPTS, max_new_tokens=NEW, temperature=1.0, seed=seed)

    a, b, c = run(11), run(11), run(12)
    assert a.tokens == b.tokens
    for x, y in zip(a.logprobs, b.logprobs):
        np.testing.assert_array_equal(x, y)
    assert a.tokens != c.tokens


def test_stop_tokens_end_rows_independently(tiny_model, greedy_reference):
    ref = greedy_reference.tokens
    stop_a = next(t for t in ref[0][1:] if t not in ref[2])
    stop_b = ref[1][5]
    out = generate(tiny_model, PROMPTS, max_new_tokens=NEW, stop_token_ids=(stop_a, stop_b))
    for row in range(3):
        hits = [i for i, t in enumerate(ref[row]) if t in (stop_a, stop_b)]
        length = hits[0] + 1 if hits else NEW
        assert out.tokens[row] == ref[row][:length]
        assert out.lengths[row] == length
        assert out.finish_reasons[row] == ("stop" if hits else "length")
    assert out.finish_reasons[0] == "stop" and out.lengths[0] < NEW


def test_stop_strings_are_cut_on_the_host(tiny_model, greedy_reference):
    ref = greedy_reference.tokens
    marker = ref[1][4]

    def decode(ids):
        return "".join(f"<{i}>" for i in ids)

    out = generate(
        tiny_model, PROMPTS, max_new_tokens=NEW, stop_strings=[f"<{marker}>"], decode=decode
    )
    for row in range(3):
        if marker in ref[row]:
            cut = ref[row].index(marker)
            assert out.tokens[row] == ref[row][: cut + 1]
            assert out.texts[row] == decode(ref[row][:cut])
            assert out.finish_reasons[row] == "stop"
            assert len(out.logprobs[row]) == cut + 1
        else:
            assert out.tokens[row] == ref[row] and out.finish_reasons[row] == "length"
            assert out.texts[row] == decode(ref[row])


def test_prompt_lengths_inside_one_bucket_compile_once(tiny_model):
    generate(tiny_model, PROMPTS, max_new_tokens=NEW)
    before = sampler.trace_counts()
    for n in range(34, 66, 3):
        prompts = [list(range(1, n + 1)), [7] * (n - 20), list(range(50, 50 + n // 2))]
        generate(
            tiny_model,
            prompts,
            max_new_tokens=9 + n % 8,
            temperature=(n % 3) * 0.5,
            top_k=n % 4,
            top_p=0.5 + (n % 2) * 0.5,
            seed=n,
        )
    after = sampler.trace_counts()
    assert after["prefill"] >= 1 and after["decode"] >= 1
    assert after["prefill"] - before["prefill"] == 0
    assert after["decode"] - before["decode"] == 0


def test_the_cache_grows_in_length_buckets_with_the_tokens_of_transformers(tiny_model, torch_model):
    # Width 64 and 40 new tokens (budget 64): caches of 64 + 16, 64 + 32 and 64 + 64 slots.
    assert batching.cache_rooms(64, 64) == (16, 32, 64)
    calls = sampler.call_counts()
    out = generate(tiny_model, PROMPTS, max_new_tokens=40)
    assert sampler.call_counts()["decode_segments"] - calls.get("decode_segments", 0) == 3
    assert out.tokens == _hf_greedy(torch_model, PROMPTS, 40)
    np.testing.assert_array_equal(out.lengths, [40] * 3)


def test_the_cache_stops_growing_once_every_row_stopped(tiny_model, greedy_reference):
    long = generate(tiny_model, PROMPTS, max_new_tokens=40)
    stops = tuple(tokens[4] for tokens in long.tokens)  # every row stops by step 5
    calls = sampler.call_counts()
    out = generate(tiny_model, PROMPTS, max_new_tokens=40, stop_token_ids=stops)
    assert sampler.call_counts()["decode_segments"] - calls["decode_segments"] == 1
    for row, tokens in enumerate(long.tokens):
        cut = next(i for i, t in enumerate(tokens) if t in stops) + 1
        assert out.tokens[row] == tokens[:cut] and out.finish_reasons[row] == "stop"


def test_group_sampling_prefills_once_and_samples_distinct_rows(tiny_model):
    group = 4
    calls = sampler.call_counts()
    out = generate(tiny_model, [PROMPTS[2]], max_new_tokens=NEW, temperature=1.0, n_samples=group)
    after = sampler.call_counts()
    assert after["prefill"] - calls["prefill"] == 1
    assert after["prefill_rows"] - calls["prefill_rows"] == 1
    assert out.num_prefilled == 1
    assert len(out.tokens) == group
    assert len({tuple(t) for t in out.tokens}) == group


def test_group_rows_are_prompt_major(tiny_model, greedy_reference):
    calls = sampler.call_counts()
    out = generate(tiny_model, [PROMPTS[2], PROMPTS[0]], max_new_tokens=NEW, n_samples=2)
    assert sampler.call_counts()["prefill_rows"] - calls["prefill_rows"] == 2
    assert out.num_prefilled == 2
    ref = greedy_reference.tokens
    assert out.tokens == [ref[2], ref[2], ref[0], ref[0]]


def test_array_prompts_with_a_mask_equal_lists(tiny_model, greedy_reference):
    width = 45
    ids = np.zeros((3, width), np.int32)
    mask = np.zeros((3, width), np.int32)
    for row, prompt in enumerate(PROMPTS):  # right padding: the mask decides
        ids[row, : len(prompt)] = prompt
        mask[row, : len(prompt)] = 1
    out = generate(tiny_model, ids, prompt_mask=mask, max_new_tokens=NEW)
    assert out.tokens == greedy_reference.tokens


def test_lora_model_samples_with_its_adapters_unmerged(tiny_checkpoint, torch_model, tmp_path):
    model, _ = qwen3.load_hf(tiny_checkpoint[0])
    base = generate(model, PROMPTS, max_new_tokens=NEW).tokens
    assert lora.apply_lora(model, rank=4, alpha=8) == 14
    adapters = nnx.state(model, nnx.LoRAParam)
    leaves, treedef = jax.tree.flatten(adapters)
    rng = np.random.default_rng(0)
    noisy = [np.asarray(x) + 0.3 * rng.normal(size=x.shape).astype(np.float32) for x in leaves]
    nnx.update(model, jax.tree.unflatten(treedef, [jnp.asarray(x) for x in noisy]))
    ours = generate(model, PROMPTS, max_new_tokens=NEW)

    lora.export_peft(model, tmp_path / "adapter")
    peft_model = peft.PeftModel.from_pretrained(copy.deepcopy(torch_model), tmp_path / "adapter")
    assert ours.tokens == _hf_greedy(peft_model.eval(), PROMPTS, NEW)
    assert ours.tokens != base
    assert lora.adapters(model), "generate must not merge the adapters"


def test_bad_settings_fail_with_a_clear_message(tiny_model):
    with pytest.raises(ValueError, match="max_top_k"):
        generate(tiny_model, PROMPTS, max_new_tokens=4, top_k=65)
    with pytest.raises(ValueError, match="temperature"):
        generate(tiny_model, PROMPTS, max_new_tokens=4, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        generate(tiny_model, PROMPTS, max_new_tokens=4, top_p=0.0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(tiny_model, [[1], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="decode"):
        generate(tiny_model, PROMPTS, max_new_tokens=4, stop_strings=["x"])
    with pytest.raises(ValueError, match="per prompt"):
        generate(tiny_model, PROMPTS, max_new_tokens=4, temperature=[1.0, 0.5])
    with pytest.raises(ValueError, match="outside"):
        generate(tiny_model, [[1, 500]], max_new_tokens=4)
