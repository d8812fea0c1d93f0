"""Llama 3 on the shared decoder against transformers' LlamaForCausalLM, peft and generate()."""

import dataclasses
import json
import pathlib
import shutil

import jax
import numpy as np
import peft
import pytest
import qwen3_testlib as lib
import torch
import transformers
from flax import nnx

from pau_jax.models import llama, lora, qwen3
from pau_jax.sampling import generate

GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin" / "models"

TINY_LLAMA = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    # Wider than the default 0.02 so attention is far from uniform and RoPE matters.
    initializer_range=0.1,
)


def _rope(theta=10000.0, **scaling):
    kind = "llama3" if scaling else "default"
    return {"rope_parameters": dict(scaling, rope_type=kind, rope_theta=theta)}


# Short original contexts put the tiny head_dim's wavelengths (6 to 6e3 at theta 1e4)
# on all three sides of the llama3 bands, so a 9-token batch sees the scaling.
# Together: plain and scaled RoPE, tied and untied heads, GQA 2 and 4, head_dim != D / N.
VARIANTS = {
    "untied_default": _rope(),
    "tied_llama3": dict(
        tie_word_embeddings=True,
        num_key_value_heads=1,
        **_rope(
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=16,
        ),
    ),
    "untied_llama3_head_dim_32": dict(
        head_dim=32,
        **_rope(
            theta=500_000.0,
            factor=32.0,
            low_freq_factor=2.0,
            high_freq_factor=8.0,
            original_max_position_embeddings=64,
        ),
    ),
}

BATCH = lib.batch(TINY_LLAMA["vocab_size"])


def make_tiny_llama(directory, *, seed: int = 0, **overrides):
    """Saves a random transformers ``LlamaForCausalLM`` with ``save_pretrained``; returns (path, model)."""
    config = transformers.LlamaConfig(**dict(TINY_LLAMA, **overrides))
    torch.manual_seed(seed)
    return lib.perturb_and_save(transformers.LlamaForCausalLM(config).eval(), directory)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Builds each variant's transformers checkpoint once: name -> (path, torch model)."""
    return lib.built_once(tmp_path_factory, make_tiny_llama, VARIANTS, seed=3)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers_on_a_left_padded_batch(tiny, name):
    path, torch_model = tiny(name)
    model, config = llama.load_hf(path)
    assert type(torch_model.config) is transformers.LlamaConfig
    assert config.tie_word_embeddings == torch_model.config.tie_word_embeddings
    assert (model.lm_head is None) == config.tie_word_embeddings
    assert config.rope_type == torch_model.config.rope_parameters["rope_type"]
    assert config.head_dim == torch_model.config.head_dim
    assert model.model.layers[0].self_attn.q_norm is None
    ours_state = {
        ".".join(map(str, p[:-1])) + ".weight"
        for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }
    assert ours_state == set(torch_model.state_dict()) - (
        {"lm_head.weight"} if config.tie_word_embeddings else set()
    )
    ids, mask = BATCH
    ours, theirs = lib.ours(model, ids, mask), lib.theirs(torch_model, ids, mask)
    assert ours.dtype == np.float32 and ours.shape == (4, 9, config.vocab_size)
    assert lib.max_real_diff(ours, theirs, mask) < lib.TOL
    # The comparison has teeth: the logits vary much more than the tolerance.
    assert np.abs(theirs - theirs[:, :1]).max() > 100 * lib.TOL


@pytest.mark.parametrize("name", ["tied_llama3", "untied_llama3_head_dim_32"])
def test_llama3_scaling_changes_the_logits_like_transformers(tiny, name, tmp_path):
    path, torch_model = tiny(name)
    scaled, config = llama.load_hf(path)
    # The same weights under plain RoPE, read by both sides from one config.json.
    hf = json.loads((path / "config.json").read_text())
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": config.rope_theta}
    hf.pop("rope_scaling", None)
    shutil.copy(path / "model.safetensors", tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(hf))
    plain, plain_config = llama.load_hf(tmp_path)
    rope_fields = ("rope_type", "rope_factor", "low_freq_factor", "high_freq_factor")
    rope_fields += ("original_max_position_embeddings",)
    assert plain_config.rope_type == "default"
    assert (
        dataclasses.replace(plain_config, **{f: getattr(config, f) for f in rope_fields}) == config
    )
    assert not np.allclose(plain_config.rope_frequencies(), config.rope_frequencies())
    torch_plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = BATCH
    ours_plain = lib.ours(plain, ids, mask)
    assert lib.max_real_diff(ours_plain, lib.theirs(torch_plain, ids, mask), mask) < lib.TOL
    assert lib.max_real_diff(ours_plain, lib.ours(scaled, ids, mask), mask) > 100 * lib.TOL


def test_rope_frequencies_equal_transformers_llama3_init():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for name in ("3.1-8B", "3.2-1B"):
        config = llama.PRESETS[name]
        hf_config = transformers.LlamaConfig(**config.to_hf_dict())
        theirs, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
        assert attention_factor == 1.0
        np.testing.assert_allclose(config.rope_frequencies(), theirs.numpy(), rtol=1e-6)
        plain = dataclasses.replace(config, rope_type="default").rope_frequencies()
        assert (theirs.numpy() < plain).any() and (theirs.numpy() == plain).any()


@pytest.mark.parametrize("name", ["tied_llama3", "untied_llama3_head_dim_32"])
def test_save_hf_round_trips_through_transformers(tiny, name, tmp_path):
    model, config = llama.load_hf(tiny(name)[0])
    llama.save_hf(model, config, tmp_path / "out", max_shard_bytes=40_000)
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(torch_model) is transformers.LlamaForCausalLM
    assert llama.LlamaConfig.from_hf_dict(torch_model.config.to_dict()) == config
    ids, mask = BATCH
    ours = lib.ours(model, ids, mask)
    assert lib.max_real_diff(ours, lib.theirs(torch_model, ids, mask), mask) < lib.TOL
    reloaded, reloaded_config = llama.load_hf(tmp_path / "out")
    assert reloaded_config == config
    np.testing.assert_array_equal(lib.ours(reloaded, ids, mask), ours)
    with pytest.raises(ValueError, match="expected a LlamaConfig"):
        llama.save_hf(model, qwen3.PRESETS["0.6B"], tmp_path / "qwen3")


def _hf_dict(**changes):
    d = transformers.LlamaConfig(**dict(TINY_LLAMA, **VARIANTS["tied_llama3"])).to_dict()
    d.update(changes)
    return d


def test_config_reads_transformers_4_and_5_forms():
    v5 = _hf_dict()
    config = llama.LlamaConfig.from_hf_dict(v5)
    assert config.rope_type == "llama3" and config.original_max_position_embeddings == 16
    assert config.tie_word_embeddings and config.num_key_value_heads == 1
    scaling = {k: v for k, v in v5["rope_parameters"].items() if k != "rope_theta"}
    v4 = {k: v for k, v in v5.items() if k != "rope_parameters"}
    v4.update(rope_theta=v5["rope_parameters"]["rope_theta"], rope_scaling=scaling)
    assert llama.LlamaConfig.from_hf_dict(v4) == config
    v4_plain = dict(v4, rope_scaling=None, rope_theta=123.0)
    plain = llama.LlamaConfig.from_hf_dict(v4_plain)
    assert plain.rope_type == "default" and plain.rope_theta == 123.0
    sparse = {k: v for k, v in v5.items() if k not in ("head_dim", "num_key_value_heads")}
    sparse_config = llama.LlamaConfig.from_hf_dict(sparse)
    assert sparse_config.head_dim == 64 // 4 and sparse_config.num_key_value_heads == 4


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"attention_bias": True}, "attention_bias=True"),
        ({"mlp_bias": True}, "mlp_bias=True"),
        ({"model_type": "qwen3"}, "model_type 'qwen3'"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "LlamaForSequenceClassification"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "'yarn'"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ],
)
def test_config_that_is_not_supported_llama_fails_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as info:
        llama.LlamaConfig.from_hf_dict(_hf_dict(**changes))
    assert "\n" not in str(info.value)


def test_qwen3_config_rejects_llama():
    with pytest.raises(ValueError, match="model_type 'llama'"):
        qwen3.Qwen3Config.from_hf_dict(_hf_dict())


def test_greedy_generate_matches_transformers(tiny):
    path, torch_model = tiny("tied_llama3")
    model, _ = llama.load_hf(path)
    prompts = [[5, 17, 99, 3, 42, 8, 60], [11, 2, 77], [64]]
    new = 6
    out = generate(model, prompts, max_new_tokens=new)
    assert out.tokens == lib.theirs_greedy(torch_model, prompts, new)
    assert len(set(map(tuple, out.tokens))) > 1


def test_lora_matches_peft_and_merges_into_a_llama_checkpoint(tiny, tmp_path):
    path, _ = tiny("untied_llama3_head_dim_32")
    model, config = llama.load_hf(path)
    ids, mask = BATCH
    base = lib.ours(model, ids, mask)
    assert lora.apply_lora(model, rank=4, alpha=8) == 7 * config.num_hidden_layers
    lib.randomise_lora_b(model)
    adapted = lib.ours(model, ids, mask)
    assert lib.max_real_diff(adapted, base, mask) > 100 * lib.TOL
    lora.export_peft(model, tmp_path / "adapter")
    torch_base = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    torch_peft = peft.PeftModel.from_pretrained(torch_base, tmp_path / "adapter").eval()
    assert lib.max_real_diff(adapted, lib.theirs(torch_peft, ids, mask), mask) < lib.TOL
    lora.merge(model)
    llama.save_hf(model, config, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert lib.max_real_diff(lib.theirs(merged, ids, mask), adapted, mask) < lib.TOL


# Totals given for the official checkpoints; the tied 3.2 models count the embedding once.
OFFICIAL_TOTALS = {
    "3.1-8B": 8_030_261_248,
    "3.1-70B": 70_553_706_496,
    "3.2-1B": 1_235_814_400,
    "3.2-3B": 3_212_749_824,
}


def _count_from_shapes(c: llama.LlamaConfig) -> int:
    n, k, h, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
    layer = 2 * d * n * h + 2 * d * k * h + 3 * d * c.intermediate_size + 2 * d
    heads = 1 if c.tie_word_embeddings else 2
    return heads * c.vocab_size * d + c.num_hidden_layers * layer + d


@pytest.mark.parametrize("name", list(OFFICIAL_TOTALS))
def test_preset_parameter_counts_match_the_official_totals(name):
    config = llama.PRESETS[name]
    abstract = llama.abstract_model(config, dtype="bfloat16")
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing allocated
    total = sum(x.size for x in leaves)
    assert total == OFFICIAL_TOTALS[name] == _count_from_shapes(config) == config.num_parameters()


GIN_PRESETS = {
    "llama3_1_8b_instruct.gin": "3.1-8B",
    "llama3_1_70b_instruct.gin": "3.1-70B",
    "llama3_2_1b_instruct.gin": "3.2-1B",
    "llama3_2_3b_instruct.gin": "3.2-3B",
}


def test_every_preset_has_a_gin_file():
    assert sorted(p.name for p in GIN_DIR.glob("llama*.gin")) == sorted(GIN_PRESETS)
    assert sorted(GIN_PRESETS.values()) == sorted(llama.PRESETS)


@pytest.mark.parametrize("file_name", list(GIN_PRESETS))
def test_gin_preset_builds_the_python_preset(file_name):
    config = lib.gin_config(llama.LlamaConfig, "pau_jax.models.llama", GIN_DIR / file_name)
    assert config == llama.PRESETS[GIN_PRESETS[file_name]]
