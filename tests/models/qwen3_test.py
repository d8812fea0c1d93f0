"""Qwen3 in NNX against transformers' Qwen3ForCausalLM: logits, config reading, presets."""

import dataclasses
import json
import pathlib

import checkpoints
import jax
import numpy as np
import pytest
import qwen3_testlib as lib
import transformers
from flax import nnx

from pau_jax.models import qwen3

GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin" / "models"

# Together: tied and untied heads, GQA ratios 2, 4 and 1, head_dim 32 != hidden / heads
# (16), and rope_theta 1e6 next to the transformers default 1e4.
VARIANTS = {
    "untied_gqa2": {},
    "tied_gqa4_theta_1e6": {
        "tie_word_embeddings": True,
        "num_key_value_heads": 1,
        "rope_theta": 1_000_000.0,
    },
    "gqa1_head_dim_32": {"num_key_value_heads": 4, "head_dim": 32},
}

BATCH = lib.batch(checkpoints.TINY_QWEN3["vocab_size"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Builds each variant's transformers checkpoint once: name -> (path, torch model)."""
    return lib.built_once(tmp_path_factory, checkpoints.make_tiny_qwen3, VARIANTS, seed=1)


def _torch_model(torch_state, **overrides):
    """A transformers model of the tiny config with ``overrides``, holding ``torch_state``."""
    config = transformers.Qwen3Config(**dict(checkpoints.TINY_QWEN3, **overrides))
    model = transformers.Qwen3ForCausalLM(config).eval()
    state = dict(torch_state)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight")
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state)
    return model


def _with_config(model, config):
    """Our model with ``config`` in place of its own and the same parameter values."""
    abstract = qwen3.abstract_model(config)
    graphdef, abstract_state = nnx.split(abstract)
    state = nnx.state(model)
    wanted = {path for path, _ in nnx.to_flat_state(abstract_state)}
    flat = [(path, var) for path, var in nnx.to_flat_state(state) if path in wanted]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers_on_a_left_padded_batch(tiny, name):
    path, torch_model = tiny(name)
    model, config = qwen3.load_hf(path)
    assert config.tie_word_embeddings == torch_model.config.tie_word_embeddings
    assert (model.lm_head is None) == config.tie_word_embeddings
    assert config.head_dim == torch_model.config.head_dim
    assert config.num_key_value_heads == torch_model.config.num_key_value_heads
    ids, mask = BATCH
    ours, theirs = lib.ours(model, ids, mask), lib.theirs(torch_model, ids, mask)
    assert ours.dtype == np.float32 and ours.shape == (4, 9, config.vocab_size)
    assert lib.max_real_diff(ours, theirs, mask) < lib.TOL
    # The comparison has teeth: the logits vary much more than the tolerance.
    assert np.abs(theirs - theirs[:, :1]).max() > 100 * lib.TOL


def test_each_config_field_changes_the_logits_like_transformers(tiny):
    path, torch_model = tiny("untied_gqa2")
    model, config = qwen3.load_hf(path)
    torch_state = torch_model.state_dict()
    ids, mask = BATCH
    base = lib.ours(model, ids, mask)
    changes = {"rope_theta": 50.0, "rms_norm_eps": 0.1, "tie_word_embeddings": True}
    for field, value in changes.items():
        changed = _with_config(model, dataclasses.replace(config, **{field: value}))
        ours = lib.ours(changed, ids, mask)
        theirs = lib.theirs(_torch_model(torch_state, **{field: value}), ids, mask)
        assert lib.max_real_diff(ours, theirs, mask) < lib.TOL, field
        assert lib.max_real_diff(ours, base, mask) > 100 * lib.TOL, field


def test_hidden_states_logits_from_hidden_and_positions(tiny):
    model, config = qwen3.load_hf(tiny("untied_gqa2")[0])
    ids, mask = BATCH

    @nnx.jit
    def variants(model, ids, mask, positions):
        hidden = model.hidden_states(ids, mask)
        return hidden, model.logits_from_hidden(hidden), model(ids, mask, positions)

    default = lib.ours(model, ids, mask)
    hidden, composed, same = variants(model, ids, mask, lib.positions(mask))
    assert hidden.shape == (4, 9, config.hidden_size)
    np.testing.assert_allclose(np.asarray(composed), default, atol=1e-5)
    np.testing.assert_allclose(np.asarray(same), default, atol=1e-5)
    # RoPE is relative: a constant shift changes nothing, scaling the positions does.
    *_, shifted = variants(model, ids, mask, lib.positions(mask) + 5)
    *_, scaled = variants(model, ids, mask, lib.positions(mask) * 3)
    assert lib.max_real_diff(np.asarray(shifted), default, mask) < lib.TOL
    assert lib.max_real_diff(np.asarray(scaled), default, mask) > 100 * lib.TOL


def _hf_dict(**changes):
    d = transformers.Qwen3Config(**checkpoints.TINY_QWEN3).to_dict()
    d.update(changes)
    return d


def test_config_reads_transformers_4_and_5_forms():
    v5 = _hf_dict()
    assert v5["rope_parameters"]["rope_theta"] == 10000.0
    config = qwen3.Qwen3Config.from_hf_dict(v5)
    assert config == qwen3.Qwen3Config(**checkpoints.TINY_QWEN3)
    v4 = dict(v5, rope_theta=123.0, rope_scaling=None)
    del v4["rope_parameters"]
    assert qwen3.Qwen3Config.from_hf_dict(v4).rope_theta == 123.0
    # head_dim and num_key_value_heads default as in transformers.
    sparse = {k: v for k, v in v5.items() if k not in ("head_dim", "num_key_value_heads")}
    config = qwen3.Qwen3Config.from_hf_dict(sparse)
    assert config.head_dim == 64 // 4 and config.num_key_value_heads == 4


def test_to_hf_dict_round_trips_through_transformers(tmp_path):
    config = dataclasses.replace(
        qwen3.Qwen3Config(**checkpoints.TINY_QWEN3),
        head_dim=32,
        rope_theta=777.0,
        eos_token_id=(5, 6),
    )
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    loaded = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is transformers.Qwen3Config
    assert loaded.rope_parameters["rope_theta"] == 777.0 and loaded.head_dim == 32
    assert qwen3.Qwen3Config.from_hf_dict(loaded.to_dict()) == config


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_type": "llama"}, "model_type 'llama'"),
        ({"model_type": "qwen3_moe"}, "model_type 'qwen3_moe'"),
        ({"architectures": ["Qwen3ForSequenceClassification"]}, "Qwen3ForSequenceClassification"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "'yarn'"),
    ],
)
def test_config_that_is_not_qwen3_dense_fails_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as info:
        qwen3.Qwen3Config.from_hf_dict(_hf_dict(**changes))
    assert "\n" not in str(info.value)


# Totals from the official config.json shapes. The 1.7B total counts the tied
# embedding once (1,720,574,976); 2,031,739,904 would count it twice.
OFFICIAL_TOTALS = {
    "0.6B": 596_049_920,
    "1.7B": 1_720_574_976,
    "4B": 4_022_468_096,
    "8B": 8_190_735_360,
    "14B": 14_768_307_200,
    "32B": 32_762_123_264,
}


def _count_from_shapes(c: qwen3.Qwen3Config) -> int:
    n, k, h, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
    attention = 2 * d * n * h + 2 * d * k * h + 2 * h
    layer = attention + 3 * d * c.intermediate_size + 2 * d
    heads = 1 if c.tie_word_embeddings else 2
    return heads * c.vocab_size * d + c.num_hidden_layers * layer + d


@pytest.mark.parametrize("name", list(OFFICIAL_TOTALS))
def test_preset_parameter_counts_match_the_official_totals(name):
    config = qwen3.PRESETS[name]
    abstract = qwen3.abstract_model(config, dtype="bfloat16")
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing allocated
    total = sum(x.size for x in leaves)
    assert total == OFFICIAL_TOTALS[name] == _count_from_shapes(config) == config.num_parameters()


GIN_PRESETS = {
    "qwen3_0_6b.gin": "0.6B",
    "qwen3_1_7b.gin": "1.7B",
    "qwen3_4b.gin": "4B",
    "qwen3_8b.gin": "8B",
    "qwen3_14b.gin": "14B",
    "qwen3_32b.gin": "32B",
}


def test_every_preset_has_a_gin_file():
    dense = [p.name for p in GIN_DIR.glob("qwen3_*.gin") if "a3b" not in p.name]  # a3b: MoE
    assert sorted(dense) == sorted(GIN_PRESETS)
    assert sorted(GIN_PRESETS.values()) == sorted(qwen3.PRESETS)


@pytest.mark.parametrize("file_name", list(GIN_PRESETS))
def test_gin_preset_builds_the_python_preset(file_name):
    # Raises if the file leaves a field without a default unbound.
    config = lib.gin_config(qwen3.Qwen3Config, "pau_jax.models.qwen3", GIN_DIR / file_name)
    assert config == qwen3.PRESETS[GIN_PRESETS[file_name]]


def test_model_mirrors_the_transformers_module_tree(tiny):
    path, torch_model = tiny("untied_gqa2")
    model, _ = qwen3.load_hf(path)
    ours = {
        ".".join(map(str, p[:-1])) + ".weight"
        for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }
    assert ours == set(torch_model.state_dict())
    layer = model.model.layers[1]
    assert layer.self_attn.q_proj.kernel.shape == (64, 4 * 16)
    assert layer.self_attn.q_norm.weight.shape == (16,)
    assert layer.mlp.gate_proj.kernel.get_metadata()["out_sharding"] == ("embed", "mlp")
    assert layer.self_attn.k_proj.kernel.get_metadata()["out_sharding"] == ("embed", "kv_heads")
    assert layer.self_attn.q_norm.weight.get_metadata()["out_sharding"] == ("head_dim",)
    assert model.lm_head.kernel.get_metadata()["out_sharding"] == ("embed", "vocab")
    torch_q = torch_model.model.layers[1].self_attn.q_proj.weight.detach().numpy()
    np.testing.assert_array_equal(np.asarray(layer.self_attn.q_proj.kernel[...]), torch_q.T)
