"""8-bit decode weights: decode steps read them, every other path keeps float32, LoRA on top."""

import logging

import checkpoints
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwen3_testlib
from flax import nnx

from pau_jax import models
from pau_jax.env import parse
from pau_jax.kernels import build, q8
from pau_jax.models import kv_cache, lora, quantization, qwen3
from pau_jax.policy import backends
from pau_jax.policy import config as policy_config
from pau_jax.sampling import constraint, generate
from pau_jax.sampling.prefix_cache import PrefixCache

VOCAB = checkpoints.TINY_QWEN3["vocab_size"]
PROMPTS = [[3, 17, 42], [5, 9, 11, 60, 61, 62, 7], list(range(20, 60))]


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def ckpt(request, tmp_path_factory):
    tied = request.param
    return checkpoints.make_tiny_qwen3(
        tmp_path_factory.mktemp("q8"), seed=7, tie_word_embeddings=tied
    )[0]


def _pair(path):
    """(float32 model, the same model with q8 decode weights)."""
    plain, _ = qwen3.load_hf(path)
    quantized, _ = qwen3.load_hf(path)
    quantization.quantize_for_decode(quantized, "q8")
    return plain, quantized


@jax.jit
def _decode_logits(graphdef, state, ids):
    """[B, T, V] logits of `Decoder.decode` over an empty cache, traced as a decode step."""
    model = nnx.merge(graphdef, state)
    cache = kv_cache.init_cache(model.config, ids.shape[0], ids.shape[1])
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    with quantization.decode_step():
        logits, _ = model.decode(
            ids, positions=positions, cache=cache, cache_index=jnp.int32(0), cache_is_empty=True
        )
    return logits


def _logits(model, ids):
    return np.asarray(_decode_logits(*nnx.split(model), jnp.asarray(ids)))


def test_every_matrix_gets_a_copy_and_only_decode_steps_read_it(ckpt):
    plain, quantized = _pair(ckpt)
    layers = plain.config.num_hidden_layers
    assert quantization.decode_weights_of(quantized) == "q8"
    assert quantization.quantize_for_decode(qwen3.load_hf(ckpt)[0], "q8") == 7 * layers + 1
    ids = jnp.asarray([PROMPTS[2]])
    # Prefill and learner paths (`__call__`, hidden states) are bit for bit float32.
    np.testing.assert_array_equal(np.asarray(plain(ids)), np.asarray(quantized(ids)))
    ours, theirs = _logits(quantized, ids), _logits(plain, ids)
    assert not np.array_equal(ours, theirs)  # the decode step did read the 8-bit copies
    error = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert error < 0.05, error


def test_decode_products_are_the_q8_arithmetic(ckpt, monkeypatch):
    _, quantized = _pair(ckpt)
    ids = [PROMPTS[1]]
    kernel = _logits(quantized, ids)
    # The same model with every product on the pure-JAX twin of the kernel's arithmetic.
    fmt = quantization.FORMATS["q8"]
    twin = quantization.Format(
        quantize=fmt.quantize,
        quantize_rows=fmt.quantize_rows,
        matmul=q8.matmul_reference,
        usable=fmt.usable,
    )
    monkeypatch.setitem(quantization.FORMATS, "q8", twin)
    _decode_logits.clear_cache()
    reference = _logits(quantized, ids)
    _decode_logits.clear_cache()
    np.testing.assert_allclose(kernel, reference, rtol=1e-4, atol=1e-5)


def test_lora_stays_a_float32_update_on_top(ckpt):
    plain, quantized = _pair(ckpt)
    ids = [PROMPTS[2]]
    without = _logits(plain, ids)
    for model in (plain, quantized):
        lora.apply_lora(model, rank=4, alpha=8, seed=1)
        for _, module in nnx.iter_graph(model):
            if isinstance(module, lora.LoRA):  # trained adapters: B is no longer zero
                module.lora_b.set_value(jnp.full(module.lora_b.shape, 0.02, jnp.float32))
    with_lora, base = _logits(quantized, ids), _logits(plain, ids)
    assert quantization.decode_weights_of(quantized) == "q8"
    scale = np.abs(base).max()
    error = np.abs(with_lora - base).max() / scale
    assert error < 0.05, error
    assert np.abs(base - without).max() / scale > 3 * error  # the update counts
    # Merging folds the adapters into the kernels and quantises them again.
    lora.merge(quantized)
    assert quantization.decode_weights_of(quantized) == "q8"
    merged = _logits(quantized, ids)
    assert np.abs(merged - base).max() / scale < 0.05


def test_an_unusable_format_keeps_float32_with_one_log_line(ckpt, monkeypatch, caplog):
    fmt = quantization.FORMATS["q8"]
    broken = quantization.Format(
        quantize=fmt.quantize,
        quantize_rows=fmt.quantize_rows,
        matmul=fmt.matmul,
        usable=lambda: (False, "no compiler"),
    )
    monkeypatch.setitem(quantization.FORMATS, "q8", broken)
    model, _ = qwen3.load_hf(ckpt)
    with caplog.at_level(logging.WARNING, logger=quantization.__name__):
        assert quantization.quantize_for_decode(model, "q8") == 0
    assert "no compiler" in caplog.text
    assert quantization.decode_weights_of(model) == "float32"
    plain, _ = qwen3.load_hf(ckpt)
    a = generate(plain, PROMPTS, max_new_tokens=8)
    b = generate(model, PROMPTS, max_new_tokens=8)
    assert a.tokens == b.tokens


def test_generate_with_a_prefix_cache_and_an_automaton(ckpt):
    _, quantized = _pair(ckpt)
    alone = generate(quantized, PROMPTS, max_new_tokens=10)
    cache = PrefixCache(max_bytes=1 << 26)
    generate(quantized, PROMPTS, max_new_tokens=10, prefix_cache=cache)
    longer = [p + t for p, t in zip(PROMPTS, alone.tokens)]
    reused = generate(quantized, longer, max_new_tokens=6, prefix_cache=cache)
    fresh = generate(quantized, longer, max_new_tokens=6)
    assert reused.reused_tokens > 0
    assert reused.tokens == fresh.tokens
    # Structured decoding: every masked reply of the 8-bit model parses with its arity.
    pieces = [bytes([b]) for b in [10, *range(0x20, 0x7F)]]
    pieces += [b"```\n", b"\n```", b"12", b", ", b"'ab'", b"-3", b"None", b"True"]
    pieces += [b"x"] * (VOCAB - 2 - len(pieces))
    vocab, stop = [*pieces, None, None], VOCAB - 2
    automaton = constraint.build_components(
        vocab, [stop], [constraint.Component("input", arity=2)], vocab_size=VOCAB
    )
    out = generate(
        quantized, PROMPTS, max_new_tokens=48, temperature=1.0, n_samples=4, seed=3,
        automaton=automaton, stop_token_ids=[stop],
    )  # fmt: skip
    for ids, reason in zip(out.tokens, out.finish_reasons):
        text = b"".join(vocab[i] or b"" for i in ids).decode()
        _, args, _ = parse.read_input(text, 2, "lenient")
        assert reason == "stop" and args is not None and len(args) == 2, text


def test_settings_name_the_formats():
    assert policy_config.DECODE_WEIGHTS == quantization.DECODE_WEIGHTS
    with pytest.raises(ValueError, match="decode_weights must be one of"):
        backends.LocalBackendConfig(checkpoint_dir="x", decode_weights="q4")
    with pytest.raises(ValueError, match="decode_weights must be one of"):
        quantization.quantize_for_decode(nnx.Module(), "int4")


def _tiny_qwen2(directory):
    """A random transformers Qwen2 (q/k/v biases) saved in `directory`."""
    import torch
    import transformers

    config = transformers.Qwen2Config(**dict(checkpoints.TINY_QWEN3, tie_word_embeddings=True))
    torch.manual_seed(5)
    model = transformers.Qwen2ForCausalLM(config).eval()
    return qwen3_testlib.perturb_and_save(model, directory, bias_scale=0.5)[0]


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_q_k_v_and_gate_up_read_one_copy_each_with_the_same_numbers(ckpt, family, tmp_path):
    path = ckpt if family == "qwen3" else _tiny_qwen2(tmp_path / "qwen2")
    grouped, separate = models.load_hf(path)[0], models.load_hf(path)[0]
    layers = grouped.config.num_hidden_layers
    assert quantization.quantize_for_decode(grouped, "q8") == 7 * layers + 1
    assert quantization.quantize_for_decode(separate, "q8", group=False) == 7 * layers + 1
    attention = grouped.model.layers[0].self_attn
    assert attention.decode_qkv is not None and attention.q_proj.decode_weight is None
    if family == "qwen2":
        assert attention.q_proj.bias is not None
    for model in (grouped, separate):  # adapters stay per linear, on top of the one product
        lora.apply_lora(model, rank=4, alpha=8, seed=1)
        for _, module in nnx.iter_graph(model):
            if isinstance(module, lora.LoRA):
                module.lora_b.set_value(jnp.full(module.lora_b.shape, 0.02, jnp.float32))
    ids = jnp.asarray([PROMPTS[1]])

    def kernel_calls(model):
        text = _decode_logits.lower(*nnx.split(model), ids).as_text()
        return text.count(build.TARGET)

    assert kernel_calls(separate) == 7 * layers + 1
    assert kernel_calls(grouped) == 4 * layers + 1
    # Each output column is the same Q8_0 sum whether its kernel is alone or beside others.
    np.testing.assert_array_equal(_logits(grouped, ids), _logits(separate, ids))
    quantization.quantize_for_decode(grouped, "float32")
    assert attention.decode_qkv is None and quantization.decode_weights_of(grouped) == "float32"
