"""Llama 3 (3.0, 3.1, 3.2): the shared decoder without q/k norms, with optional ``llama3`` RoPE scaling."""

import dataclasses
from typing import Any

import numpy as np

from pau_jax.models import decoder, decoder_config, hf_checkpoint, layers

# The ``llama3`` RoPE scaling fields: ours -> config.json's (in ``rope_parameters``).
_SCALING = {
    "rope_factor": "factor",
    "low_freq_factor": "low_freq_factor",
    "high_freq_factor": "high_freq_factor",
    "original_max_position_embeddings": "original_max_position_embeddings",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig(decoder_config.DecoderConfig):
    """Architecture of a Llama 3 decoder (field names as in Hugging Face config.json).

    ``rope_type`` is "default" (plain RoPE) or "llama3"; the four scaling
    fields (``rope_factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``) are used by "llama3" only.
    """

    model_type = "llama"
    architecture = "LlamaForCausalLM"
    family_name = "Llama"
    fixed_fields = {"qk_norm": False, "qkv_bias": False}
    hf_fixed = {"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}
    rope_types = ("default", "llama3")
    default_max_position_embeddings = 2048

    rope_type: str = "default"
    rope_factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        super().__post_init__()
        if self.rope_type not in self.rope_types:
            raise ValueError(f"rope_type must be one of {self.rope_types}, got {self.rope_type!r}")
        if self.rope_type == "llama3":
            if self.rope_factor <= 0 or self.original_max_position_embeddings <= 0:
                raise ValueError(
                    "llama3 RoPE needs rope_factor > 0 and original_max_position_embeddings > 0"
                )
            if not 0 < self.low_freq_factor < self.high_freq_factor:
                raise ValueError(
                    f"llama3 RoPE needs 0 < low_freq_factor ({self.low_freq_factor}) < "
                    f"high_freq_factor ({self.high_freq_factor})"
                )

    def rope_frequencies(self) -> np.ndarray:
        """The [head_dim / 2] float32 rotary inverse frequencies, scaled for "llama3"."""
        inv_freq = layers.rope_inv_freq(self.head_dim, self.rope_theta)
        if self.rope_type == "default":
            return inv_freq
        return layers.llama3_scaled_inv_freq(
            inv_freq,
            factor=self.rope_factor,
            low_freq_factor=self.low_freq_factor,
            high_freq_factor=self.high_freq_factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
        )

    @classmethod
    def _from_hf_extra(cls, d: dict[str, Any], *, rope: dict[str, Any], source: str) -> dict:
        if rope["rope_type"] == "default":
            return {"rope_type": "default"}
        for key in _SCALING.values():
            if key not in rope:
                raise ValueError(f"{source} has llama3 RoPE scaling without {key!r}")
        return {
            "rope_type": "llama3",
            "rope_factor": float(rope["factor"]),
            "low_freq_factor": float(rope["low_freq_factor"]),
            "high_freq_factor": float(rope["high_freq_factor"]),
            "original_max_position_embeddings": int(rope["original_max_position_embeddings"]),
        }

    def _hf_rope(self) -> dict[str, Any]:
        if self.rope_type == "default":
            return {"rope_type": "default"}
        scaling = {theirs: getattr(self, ours) for ours, theirs in _SCALING.items()}
        return {"rope_type": self.rope_type, **scaling}

    def _to_hf_extra(self) -> dict[str, Any]:
        return {"rope_scaling": None if self.rope_type == "default" else self._hf_rope()}


def _preset(hidden, intermediate, num_layers, heads, *, tied, factor) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        head_dim=hidden // heads,
        rms_norm_eps=1e-5,
        rope_theta=500_000.0,
        tie_word_embeddings=tied,
        max_position_embeddings=131072,
        rope_type="llama3",
        rope_factor=factor,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )


# The official Llama 3.1 / 3.2 sizes (architecture only; token ids come from the checkpoint).
PRESETS: dict[str, LlamaConfig] = {
    "3.1-8B": _preset(4096, 14336, 32, 32, tied=False, factor=8.0),
    "3.1-70B": _preset(8192, 28672, 80, 64, tied=False, factor=8.0),
    "3.2-1B": _preset(2048, 8192, 16, 32, tied=True, factor=32.0),
    "3.2-3B": _preset(3072, 8192, 28, 24, tied=True, factor=32.0),
}

FAMILY = hf_checkpoint.Family(config=LlamaConfig, presets=PRESETS)

# The model is the shared decoder; its architecture comes from the LlamaConfig it is built with.
LlamaForCausalLM = decoder.Decoder
abstract_model = hf_checkpoint.abstract_model
load_hf = FAMILY.load_hf
save_hf = FAMILY.save_hf
