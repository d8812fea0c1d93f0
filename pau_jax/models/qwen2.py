"""Qwen2 (Qwen2.5, Qwen2.5-Coder): the shared decoder with q/k/v biases and no q/k norms."""

import dataclasses
from typing import Any

from pau_jax.models import decoder, decoder_config, hf_checkpoint


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen2Config(decoder_config.DecoderConfig):
    """Architecture of a Qwen2 decoder (field names as in Hugging Face config.json).

    Every Qwen2 model has biases on its q, k and v projections (``qkv_bias``; not on
    o or the MLP) and no q/k norm. transformers' Qwen2 has no ``attention_bias``
    setting (the biases are always there), so none is read or written. Sliding-window
    attention is not supported: ``use_sliding_window`` must be false and every entry
    of ``layer_types`` (when given) ``"full_attention"``; ``sliding_window`` and
    ``max_window_layers`` then have no effect and are not kept.
    """

    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"
    family_name = "Qwen2"
    fixed_fields = {"qk_norm": False, "qkv_bias": True}
    hf_fixed = {"use_sliding_window": False}
    default_max_position_embeddings = 32768

    qkv_bias: bool = True

    @classmethod
    def _from_hf_extra(cls, d: dict[str, Any], *, rope: dict[str, Any], source: str) -> dict:
        del rope
        kinds = sorted(set(d.get("layer_types") or ()) - {"full_attention"})
        if kinds:
            raise ValueError(
                f"{source} has layer_types {kinds}; this {cls.family_name} model supports "
                "'full_attention' only"
            )
        return {}

    def _to_hf_extra(self) -> dict[str, Any]:
        return {"sliding_window": None, "max_window_layers": self.num_hidden_layers}


def _preset(hidden, intermediate, num_layers, heads) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=2,
        head_dim=hidden // heads,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    )


# The official Qwen2.5-Coder instruct sizes (architecture only; token ids come from the
# checkpoint). Both tie the head to the embedding; untied checkpoints load as well.
PRESETS: dict[str, Qwen2Config] = {
    "2.5-Coder-0.5B-Instruct": _preset(896, 4864, 24, 14),
    "2.5-Coder-1.5B-Instruct": _preset(1536, 8960, 28, 12),
}

FAMILY = hf_checkpoint.Family(config=Qwen2Config, presets=PRESETS)

# The model is the shared decoder; the Qwen2Config it is built with gives q/k/v biases.
Qwen2ForCausalLM = decoder.Decoder
abstract_model = hf_checkpoint.abstract_model
load_hf = FAMILY.load_hf
save_hf = FAMILY.save_hf
