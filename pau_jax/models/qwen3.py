"""Qwen3 (dense): the shared decoder with per-head q/k RMSNorm, its config.json form and presets."""

import dataclasses
from typing import Any

from pau_jax.models import decoder, decoder_config, hf_checkpoint


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3Config(decoder_config.DecoderConfig):
    """Architecture of a Qwen3 dense decoder (field names as in Hugging Face config.json).

    ``qk_norm`` (per-head RMSNorm on queries and keys) is True for every Qwen3 model;
    its linears have no bias.
    """

    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    family_name = "Qwen3"
    fixed_fields = {"qk_norm": True, "qkv_bias": False}
    hf_fixed = {"attention_bias": False, "use_sliding_window": False}
    default_max_position_embeddings = 32768

    qk_norm: bool = True

    def _to_hf_extra(self) -> dict[str, Any]:
        return {"sliding_window": None, "max_window_layers": self.num_hidden_layers}


def _preset(hidden, intermediate, num_layers, heads, tied) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=tied,
        max_position_embeddings=40960,
    )


# The official Qwen3 dense sizes (architecture only; token ids come from the checkpoint).
PRESETS: dict[str, Qwen3Config] = {
    "0.6B": _preset(1024, 3072, 28, 16, True),
    "1.7B": _preset(2048, 6144, 28, 16, True),
    "4B": _preset(2560, 9728, 36, 32, True),
    "8B": _preset(4096, 12288, 36, 32, False),
    "14B": _preset(5120, 17408, 40, 40, False),
    "32B": _preset(5120, 25600, 64, 64, False),
}

FAMILY = hf_checkpoint.Family(config=Qwen3Config, presets=PRESETS)

# The model is the shared decoder; these names read as the Hugging Face ones.
Qwen3ForCausalLM = decoder.Decoder
Qwen3Model = decoder.Backbone
abstract_model = hf_checkpoint.abstract_model
load_weights = hf_checkpoint.load_weights
load_hf = FAMILY.load_hf
# Writes a model of any family under its config's own model_type.
save_hf = hf_checkpoint.save_hf
