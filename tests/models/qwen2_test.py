"""Qwen2 on the shared decoder against transformers' Qwen2ForCausalLM, peft and generate()."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import qwen3_testlib as lib
import safetensors.numpy
import torch
import transformers
from flax import nnx

from pau_jax.models import kv_cache, layers, lora, qwen2, qwen3, sharding, weights
from pau_jax.sampling import generate

GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin" / "models"

# Float32 logits of pau_jax and of transformers agree to this (max abs) on these models.
TOL = 1e-5

# D, F and N * H are multiples of layers.GEMV_CHUNKS, so a one-row call of every linear
# layer (a decode step at batch 1) takes the chunked GEMV path.
TINY_QWEN2 = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    # Wider than the default 0.02 so attention is far from uniform and RoPE matters.
    initializer_range=0.1,
)

# Together: tied and untied heads, GQA ratios 2 and 4, rope_theta 1e4 and 1e6, and a
# head_dim (32) other than hidden / heads, which transformers' Qwen2 reads when given.
VARIANTS = {
    "untied": {},
    "tied_gqa4_theta_1e6": dict(
        tie_word_embeddings=True,
        num_key_value_heads=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ),
    "untied_head_dim_32": dict(head_dim=32),
}

BATCH = lib.batch(TINY_QWEN2["vocab_size"])
QKV = ("q_proj", "k_proj", "v_proj")


def make_tiny_qwen2(directory, *, seed: int = 0, **overrides):
    """Saves a random transformers ``Qwen2ForCausalLM`` (biases too); returns (path, model)."""
    config = transformers.Qwen2Config(**dict(TINY_QWEN2, **overrides))
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config).eval()
    return lib.perturb_and_save(model, directory, bias_scale=0.1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Builds each variant's transformers checkpoint once: name -> (path, torch model)."""
    return lib.built_once(tmp_path_factory, make_tiny_qwen2, VARIANTS, seed=7)


def _zero_biases(model):
    """Our model with every q/k/v bias set to zero, in place."""
    for layer in model.model.layers:
        for name in QKV:
            bias = getattr(layer.self_attn, name).bias
            bias.set_value(jnp.zeros_like(bias[...]))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers_on_a_left_padded_batch(tiny, name):
    path, torch_model = tiny(name)
    model, config = qwen2.load_hf(path)
    assert type(torch_model.config) is transformers.Qwen2Config
    assert config.qkv_bias and not config.qk_norm
    assert config.tie_word_embeddings == torch_model.config.tie_word_embeddings
    assert (model.lm_head is None) == config.tie_word_embeddings
    assert config.head_dim == torch_model.model.layers[0].self_attn.head_dim
    assert config.rope_theta == torch_model.config.rope_parameters["rope_theta"]
    # The module tree is transformers': biases on q, k and v only.
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert set(weights.hf_state_dict(model)) == set(torch_model.state_dict()) - tied
    attention = model.model.layers[0].self_attn
    assert attention.q_norm is None and attention.o_proj.bias is None
    assert model.model.layers[0].mlp.up_proj.bias is None
    assert attention.q_proj.bias.get_metadata()["out_sharding"] == ("heads",)
    assert attention.k_proj.bias.get_metadata()["out_sharding"] == ("kv_heads",)
    ids, mask = BATCH
    ours, theirs = lib.ours(model, ids, mask), lib.theirs(torch_model, ids, mask)
    assert ours.dtype == np.float32 and ours.shape == (4, 9, config.vocab_size)
    assert lib.max_real_diff(ours, theirs, mask) < TOL
    # The comparison has teeth: the logits vary much more than the tolerance.
    assert np.abs(theirs - theirs[:, :1]).max() > 1000 * TOL


def test_biases_change_the_logits_like_transformers(tiny):
    path, torch_model = tiny("untied")
    model, _ = qwen2.load_hf(path)
    ids, mask = BATCH
    biased = lib.ours(model, ids, mask)
    _zero_biases(model)
    unbiased = lib.ours(model, ids, mask)
    torch_unbiased = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        for layer in torch_unbiased.model.layers:
            for name in QKV:
                getattr(layer.self_attn, name).bias.zero_()
    assert lib.max_real_diff(unbiased, lib.theirs(torch_unbiased, ids, mask), mask) < TOL
    assert lib.max_real_diff(unbiased, biased, mask) > 1000 * TOL


def test_one_row_linear_adds_its_bias_on_the_chunked_gemv_path():
    linear = layers.Linear(64, 24, axes=("embed", "heads"), dtype=jnp.float32, rngs=nnx.Rngs(0))
    assert linear.bias is None
    linear = layers.Linear(
        64, 24, axes=("embed", "heads"), dtype=jnp.float32, rngs=nnx.Rngs(0), use_bias=True
    )
    assert linear.bias.get_metadata()["out_sharding"] == ("heads",)
    assert not np.asarray(linear.bias[...]).any()  # zero at init, as transformers'
    linear.bias.set_value(jnp.arange(24, dtype=jnp.float32))
    x = jax.random.normal(jax.random.key(1), (2, 1, 64))
    assert layers._single_row_unsharded(x[:1]) and 64 % layers.GEMV_CHUNKS == 0
    rows = np.asarray(linear(x))  # two rows: nnx.Linear's own path
    np.testing.assert_allclose(np.asarray(linear(x[:1])), rows[:1], atol=1e-6)
    np.testing.assert_allclose(rows, np.asarray(x @ linear.kernel[...]) + np.arange(24), atol=1e-5)


def test_a_batch_1_decode_step_takes_the_gemv_path_with_biases(tiny, monkeypatch):
    model, config = qwen2.load_hf(tiny("untied_head_dim_32")[0])
    ids = np.array([[3, 77, 12, 9, 101, 45]], np.int32)
    full = lib.ours(model, ids, np.ones_like(ids))
    calls = []
    chunked = layers._chunked_gemv
    monkeypatch.setattr(
        layers, "_chunked_gemv", lambda x, kernel: calls.append(kernel.shape) or chunked(x, kernel)
    )

    @nnx.jit  # a fresh function: traced here, so the calls are counted
    def decode(model, ids, cache, index):
        positions = index + jnp.arange(ids.shape[1])[None]
        return model.decode(ids, positions=positions, cache=cache, cache_index=index)

    _, cache = decode(model, ids[:, :5], kv_cache.init_cache(config, 1, 8), 0)
    assert not calls  # five rows: the batched path
    step, _ = decode(model, ids[:, 5:], cache, 5)
    assert len(calls) == 7 * config.num_hidden_layers  # every linear layer, biased ones too
    np.testing.assert_allclose(np.asarray(step)[:, 0], full[:, 5], atol=TOL)


def _biases(model):
    """(dotted path, bias parameter) of every biased linear layer."""
    return [
        (".".join(map(str, path)), module.bias)
        for path, module in nnx.iter_modules(model)
        if isinstance(module, layers.Linear) and module.bias is not None
    ]


@pytest.mark.parametrize(
    "prompts",
    [[[5, 17, 99, 3, 42, 8, 60]], [[5, 17, 99, 3, 42, 8, 60], [11, 2, 77], [64]]],
    ids=["batch_1", "batch_3"],
)
def test_greedy_generate_matches_transformers(tiny, prompts):
    path, torch_model = tiny("untied")
    model, _ = qwen2.load_hf(path)
    new = 32
    out = generate(model, prompts, max_new_tokens=new, temperature=0.0)
    assert out.tokens == lib.theirs_greedy(torch_model, prompts, new)
    assert len(set(out.tokens[0])) > 4  # not one repeated token
    _zero_biases(model)
    unbiased = generate(model, prompts, max_new_tokens=new, temperature=0.0)
    assert all(a != b for a, b in zip(out.tokens, unbiased.tokens, strict=True))


def test_lora_matches_peft_and_merging_keeps_the_logits_and_biases(tiny, tmp_path):
    path, _ = tiny("untied_head_dim_32")
    model, config = qwen2.load_hf(path)
    ids, mask = BATCH
    base = lib.ours(model, ids, mask)
    biases = {name: np.asarray(bias[...]) for name, bias in _biases(model)}
    assert lora.apply_lora(model, rank=4, alpha=8) == 7 * config.num_hidden_layers
    lib.randomise_lora_b(model, seed=3)
    adapted = lib.ours(model, ids, mask)
    assert lib.max_real_diff(adapted, base, mask) > 1000 * TOL
    lora.export_peft(model, tmp_path / "adapter")
    torch_base = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    torch_peft = peft.PeftModel.from_pretrained(torch_base, tmp_path / "adapter").eval()
    assert lib.max_real_diff(adapted, lib.theirs(torch_peft, ids, mask), mask) < TOL
    assert lora.merge(model) == 7 * config.num_hidden_layers
    assert lib.max_real_diff(lib.ours(model, ids, mask), adapted, mask) < TOL
    for name, bias in _biases(model):
        np.testing.assert_array_equal(np.asarray(bias[...]), biases[name])
    qwen2.save_hf(model, config, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert lib.max_real_diff(lib.theirs(merged, ids, mask), adapted, mask) < TOL


@pytest.mark.parametrize("name", ["untied", "tied_gqa4_theta_1e6"])
def test_save_hf_round_trips_through_transformers(tiny, name, tmp_path):
    model, config = qwen2.load_hf(tiny(name)[0])
    qwen2.save_hf(model, config, tmp_path / "out", max_shard_bytes=40_000)
    index = json.loads((tmp_path / "out" / weights.INDEX_FILE).read_text())["weight_map"]
    assert "model.layers.1.self_attn.v_proj.bias" in index
    assert ("lm_head.weight" in index) != config.tie_word_embeddings
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(torch_model) is transformers.Qwen2ForCausalLM
    assert torch_model.config.tie_word_embeddings == config.tie_word_embeddings
    assert qwen2.Qwen2Config.from_hf_dict(torch_model.config.to_dict()) == config
    torch_bias = torch_model.model.layers[1].self_attn.v_proj.bias.detach().numpy()
    ours_bias = np.asarray(model.model.layers[1].self_attn.v_proj.bias[...])
    np.testing.assert_array_equal(torch_bias, ours_bias)
    ids, mask = BATCH
    ours = lib.ours(model, ids, mask)
    assert lib.max_real_diff(ours, lib.theirs(torch_model, ids, mask), mask) < TOL
    reloaded, reloaded_config = qwen2.load_hf(tmp_path / "out")
    assert reloaded_config == config
    np.testing.assert_array_equal(lib.ours(reloaded, ids, mask), ours)
    with pytest.raises(ValueError, match="expected a Qwen2Config"):
        qwen2.save_hf(model, qwen3.PRESETS["0.6B"], tmp_path / "qwen3")


def test_checkpoint_missing_a_bias_fails_in_one_line(tiny, tmp_path):
    path, _ = tiny("untied")
    tensors = safetensors.numpy.load_file(str(path / weights.SINGLE_FILE))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    safetensors.numpy.save_file(tensors, str(tmp_path / weights.SINGLE_FILE))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(
        ValueError, match=r"lacks 1 tensor.*layers\.1\.self_attn\.k_proj\.bias"
    ) as e:
        qwen2.load_hf(tmp_path)
    assert "\n" not in str(e.value)


def _hf_dict(**changes):
    d = transformers.Qwen2Config(**TINY_QWEN2).to_dict()
    d.update(changes)
    return d


def test_config_reads_transformers_4_and_5_forms_and_round_trips(tmp_path):
    v5 = _hf_dict()
    config = qwen2.Qwen2Config.from_hf_dict(v5)
    assert config.head_dim == 16 and config.qkv_bias and config.rope_theta == 10000.0
    assert config.max_position_embeddings == 256 and not config.tie_word_embeddings
    # transformers 4 (and the official Qwen2.5 files): rope_theta at the top level,
    # a sliding window that is switched off, no layer_types, no head_dim.
    v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "layer_types", "head_dim")}
    v4.update(rope_theta=1_000_000.0, sliding_window=32768, max_window_layers=21)
    assert qwen2.Qwen2Config.from_hf_dict(v4) == dataclasses.replace(config, rope_theta=1e6)
    changed = dataclasses.replace(config, head_dim=32, eos_token_id=(5, 6), bos_token_id=4)
    written = changed.to_hf_dict()
    assert "attention_bias" not in written and written["use_sliding_window"] is False
    assert qwen2.Qwen2Config.from_hf_dict(written) == changed
    (tmp_path / "config.json").write_text(json.dumps(written))
    assert qwen2.Qwen2Config.from_json(tmp_path) == changed
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(theirs) is transformers.Qwen2Config
    assert theirs.layer_types == ["full_attention"] * 2 and theirs.sliding_window is None
    assert qwen2.Qwen2Config.from_hf_dict(theirs.to_dict()) == changed


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"use_sliding_window": True}, "use_sliding_window=True; this Qwen2 model needs False"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "'sliding_attention'"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"model_type": "qwen3"}, "model_type 'qwen3'"),
        ({"architectures": ["Qwen2ForSequenceClassification"]}, "ForSequenceClassification"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "'yarn'"),
    ],
)
def test_config_that_is_not_supported_qwen2_fails_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as info:
        qwen2.Qwen2Config.from_hf_dict(_hf_dict(**changes))
    assert "\n" not in str(info.value)


def test_the_attention_variant_is_fixed_per_family():
    fields = {k: v for k, v in TINY_QWEN2.items() if k != "initializer_range"}
    fields.update(head_dim=16, rope_theta=1e4)
    with pytest.raises(ValueError, match="Qwen2 has qkv_bias=True only, got False"):
        qwen2.Qwen2Config(**fields, qkv_bias=False)
    with pytest.raises(ValueError, match="Qwen2 has qk_norm=False only, got True"):
        qwen2.Qwen2Config(**fields, qk_norm=True)
    with pytest.raises(ValueError, match="Qwen3 has qkv_bias=False only"):
        qwen3.Qwen3Config(**fields, qkv_bias=True)
    with pytest.raises(ValueError, match="model_type 'qwen2'"):
        qwen3.Qwen3Config.from_hf_dict(_hf_dict())


# Model cards: 0.49B parameters, 0.36B non-embedding; 1.54B and 1.31B (tied heads).
OFFICIAL_BILLIONS = {
    "2.5-Coder-0.5B-Instruct": (0.49, 0.36),
    "2.5-Coder-1.5B-Instruct": (1.54, 1.31),
}
EXACT_TOTALS = {"2.5-Coder-0.5B-Instruct": 494_032_768, "2.5-Coder-1.5B-Instruct": 1_543_714_304}


@pytest.mark.parametrize("name", list(OFFICIAL_BILLIONS))
def test_preset_parameter_counts_match_the_official_totals(name):
    config = qwen2.PRESETS[name]
    abstract = qwen2.abstract_model(config, dtype="bfloat16")
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing allocated
    total = sum(x.size for x in leaves)
    assert total == config.num_parameters() == EXACT_TOTALS[name]
    non_embedding = total - config.vocab_size * config.hidden_size
    assert (round(total / 1e9, 2), round(non_embedding / 1e9, 2)) == OFFICIAL_BILLIONS[name]
    # Biases are placed like the outputs of their kernels.
    mesh = jax.sharding.AbstractMesh((2, 2), ("fsdp", "tp"))
    spec = sharding.partition_spec(("kv_heads",), (2 * config.head_dim,), mesh)
    assert spec == jax.sharding.PartitionSpec("tp")


GIN_PRESETS = {
    "qwen2_5_coder_0_5b_instruct.gin": "2.5-Coder-0.5B-Instruct",
    "qwen2_5_coder_1_5b_instruct.gin": "2.5-Coder-1.5B-Instruct",
}


def test_every_preset_has_a_gin_file():
    assert sorted(p.name for p in GIN_DIR.glob("qwen2*.gin")) == sorted(GIN_PRESETS)
    assert sorted(GIN_PRESETS.values()) == sorted(qwen2.PRESETS)


@pytest.mark.parametrize("file_name", list(GIN_PRESETS))
def test_gin_preset_builds_the_python_preset(file_name):
    config = lib.gin_config(qwen2.Qwen2Config, "pau_jax.models.qwen2", GIN_DIR / file_name)
    assert config == qwen2.PRESETS[GIN_PRESETS[file_name]]
