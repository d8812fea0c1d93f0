"""`models.load_hf` picks the architecture from the checkpoint's own config.json."""

import json

import numpy as np
import pytest
from flax import nnx

from pau_jax import models
from pau_jax.models import llama, qwen3, qwen3_moe

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


@pytest.mark.parametrize(
    "module,config",
    [
        (qwen3, qwen3.Qwen3Config(**TINY)),
        (llama, llama.LlamaConfig(**TINY)),
        (
            qwen3_moe,
            qwen3_moe.Qwen3MoeConfig(
                **TINY,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=16,
                norm_topk_prob=True,
            ),
        ),
    ],
)
def test_each_architecture_loads_as_itself(tmp_path, module, config):
    model = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    module.save_hf(model, config, tmp_path)
    loaded, loaded_config = models.load_hf(tmp_path)
    assert type(loaded_config) is type(config)
    ids = np.array([[1, 2, 3, 4]], np.int32)
    np.testing.assert_array_equal(np.asarray(loaded(ids)), np.asarray(model(ids)))


def test_unsupported_or_missing_config_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2'; supported"):
        models.load_hf(tmp_path)
