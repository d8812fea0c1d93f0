"""The family registry: `models.load_hf` by config.json `model_type`, `models.random_checkpoint`."""

import dataclasses
import json

import checkpoints
import numpy as np
import pytest
from flax import nnx

from pau_jax import models
from pau_jax.models import (
    auto,
    decoder,
    decoder_config,
    hf_checkpoint,
    llama,
    qwen2,
    qwen3,
    qwen3_moe,
)

TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=64,
)
CONFIGS = [
    qwen3.Qwen3Config(**TINY),
    llama.LlamaConfig(**TINY),
    qwen2.Qwen2Config(**TINY),
    qwen3_moe.Qwen3MoeConfig(
        **TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True
    ),
]
IDS = np.array([[1, 2, 3, 4]], np.int32)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.model_type)
def test_random_checkpoint_of_each_family_loads_as_itself(tmp_path, config):
    path = models.random_checkpoint(config, tmp_path / "ckpt", seed=3, tokenizer=False)
    assert path == tmp_path / "ckpt" and not (path / "tokenizer.json").exists()
    loaded, loaded_config = models.load_hf(path)
    assert type(loaded_config) is type(config) and loaded_config == config
    fresh = decoder.Decoder(config, rngs=nnx.Rngs(3))
    np.testing.assert_array_equal(np.asarray(loaded(IDS)), np.asarray(fresh(IDS)))


def test_random_checkpoint_writes_the_offline_tokenizer(tmp_path):
    from pau_jax.tokenizer import load_tokenizer

    config = checkpoints.tiny_qwen3_config()
    path = models.random_checkpoint(config, tmp_path, dtype="bfloat16")
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    assert load_tokenizer(path).encode("hello") == load_tokenizer("qwen3-offline").encode("hello")
    with pytest.raises(ValueError, match="tokenizer=False"):
        models.random_checkpoint(CONFIGS[0], tmp_path / "small")


def test_random_checkpoint_refuses_an_unregistered_family(tmp_path):
    with pytest.raises(ValueError, match="not a registered family"):
        models.random_checkpoint(_ToyConfig(**TINY), tmp_path, tokenizer=False)


def test_registry_keys_are_the_families_own_model_types():
    assert sorted(auto.ARCHITECTURES) == ["llama", "qwen2", "qwen3", "qwen3_moe"]
    for kind, family in auto.ARCHITECTURES.items():
        assert family.model_type == family.config.model_type == kind
        for preset in family.presets.values():
            assert type(preset) is family.config
            assert family.config.from_hf_dict(preset.to_hf_dict()) == preset


def test_unsupported_or_missing_config_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2'; supported"):
        models.load_hf(tmp_path)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _ToyConfig(decoder_config.DecoderConfig):
    """A family declared in a few lines: Qwen3's q/k norms, a field of its own, not registered."""

    model_type = "toy"
    architecture = "ToyForCausalLM"
    family_name = "Toy"
    hf_fixed = {"use_sliding_window": False}
    default_max_position_embeddings = 512

    qk_norm: bool = True
    toy_scale: float = 1.0

    @classmethod
    def _from_hf_extra(cls, d, *, rope, source):
        return {"toy_scale": float(d.get("toy_scale", 1.0))}

    def _to_hf_extra(self):
        return {"toy_scale": self.toy_scale}


def test_a_family_is_a_config_subclass_and_a_family_record(tmp_path):
    family = hf_checkpoint.Family(config=_ToyConfig, presets={})
    config = _ToyConfig(**TINY, toy_scale=2.0)
    model = decoder.Decoder(config, rngs=nnx.Rngs(0))
    family.save_hf(model, config, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "toy" and written["toy_scale"] == 2.0
    loaded, loaded_config = family.load_hf(tmp_path)
    assert loaded_config == config
    np.testing.assert_array_equal(np.asarray(loaded(IDS)), np.asarray(model(IDS)))
    with pytest.raises(ValueError, match="model_type 'toy'; supported"):
        models.load_hf(tmp_path)
    with pytest.raises(ValueError, match="expected a _ToyConfig"):
        family.save_hf(model, qwen3.Qwen3Config(**TINY), tmp_path / "other")
    with pytest.raises(ValueError, match="only Toy checkpoints"):
        _ToyConfig.from_hf_dict(qwen3.Qwen3Config(**TINY).to_hf_dict())
