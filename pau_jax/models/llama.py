"""Llama 3 (3.0, 3.1, 3.2) causal language models: a config for the shared Qwen3-style decoder.

Llama 3 is the decoder of ``qwen3.py`` without per-head q/k norms and with
optional ``llama3`` RoPE frequency scaling, so the model class, KV cache, LoRA
and sampler are shared; only the config and its checkpoint format differ.
"""

import dataclasses
import pathlib
from typing import Any

import jax
import numpy as np

from pau_jax.models import layers, qwen3, sharding

_ARCHITECTURE = "LlamaForCausalLM"
_ROPE_TYPES = ("default", "llama3")

# The model is the shared decoder; its architecture comes from the LlamaConfig it is built with.
LlamaForCausalLM = qwen3.Qwen3ForCausalLM
abstract_model = qwen3.abstract_model


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig(qwen3.Qwen3Config):
    """Architecture of a Llama 3 decoder (field names as in Hugging Face config.json).

    ``rope_type`` is "default" (plain RoPE) or "llama3"; the four scaling
    fields (``rope_factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``) are used by "llama3" only.
    """

    qk_norm: bool = False
    rope_type: str = "default"
    rope_factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        super().__post_init__()
        if self.qk_norm:
            raise ValueError("Llama has no q/k norm; use qwen3.Qwen3Config for qk_norm=True")
        if self.rope_type not in _ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {_ROPE_TYPES}, got {self.rope_type!r}")
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
    def from_hf_dict(cls, d: dict[str, Any], *, source: str = "config") -> "LlamaConfig":
        """Reads a Hugging Face Llama config dict (transformers 4 or 5 form).

        RoPE settings come from ``rope_parameters`` (transformers 5) or from
        ``rope_theta`` and ``rope_scaling`` (transformers 4); absent fields take
        transformers' defaults.

        Raises:
          ValueError: the dict is not a Llama causal-LM config, or uses a feature
            this model lacks (biases, another activation or RoPE type).
        """
        model_type = d.get("model_type")
        if model_type != "llama":
            raise ValueError(
                f"{source} has model_type {model_type!r}; only Llama checkpoints "
                "(model_type 'llama') can be loaded"
            )
        architectures = d.get("architectures") or [_ARCHITECTURE]
        if _ARCHITECTURE not in architectures:
            raise ValueError(
                f"{source} describes {architectures}; only {_ARCHITECTURE} is supported"
            )
        unsupported = {
            "hidden_act": ("silu", d.get("hidden_act", "silu")),
            "attention_bias": (False, d.get("attention_bias", False)),
            "mlp_bias": (False, d.get("mlp_bias", False)),
            "pretraining_tp": (1, d.get("pretraining_tp", 1)),
        }
        for key, (wanted, got) in unsupported.items():
            if got != wanted:
                raise ValueError(f"{source} sets {key}={got!r}; this Llama model needs {wanted!r}")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in _ROPE_TYPES:
            raise ValueError(
                f"{source} uses RoPE type {rope_type!r}; only {_ROPE_TYPES} are supported"
            )
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
        for key in (*required, "num_attention_heads"):
            if key not in d:
                raise ValueError(f"{source} lacks {key!r}, which a Llama config needs")
        scaling = {}
        if rope_type == "llama3":
            names = ("factor", "low_freq_factor", "high_freq_factor")
            names += ("original_max_position_embeddings",)
            for key in names:
                if key not in rope:
                    raise ValueError(f"{source} has llama3 RoPE scaling without {key!r}")
            scaling = {
                "rope_factor": float(rope["factor"]),
                "low_freq_factor": float(rope["low_freq_factor"]),
                "high_freq_factor": float(rope["high_freq_factor"]),
                "original_max_position_embeddings": int(rope["original_max_position_embeddings"]),
            }
        heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        return cls(
            **{key: d[key] for key in required},
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            rope_type=rope_type,
            **scaling,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` dict (readable by transformers 4 and 5)."""
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        rope: dict[str, Any] = {"rope_type": self.rope_type}
        if self.rope_type == "llama3":
            rope.update(
                factor=self.rope_factor,
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        return {
            "architectures": [_ARCHITECTURE],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_type == "default" else rope,
            "rope_parameters": dict(rope, rope_theta=self.rope_theta),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "pretraining_tp": 1,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
        }


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


def load_hf(
    path: str | pathlib.Path,
    dtype="float32",
    mesh: jax.sharding.Mesh | None = None,
    *,
    rules: sharding.Rules = sharding.LOGICAL_RULES,
) -> tuple[qwen3.Qwen3ForCausalLM, LlamaConfig]:
    """Loads a Hugging Face ``LlamaForCausalLM`` checkpoint directory (see ``qwen3.load_hf``).

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or an index and shards).
      dtype: parameter dtype, e.g. "float32" or "bfloat16".
      mesh: optional device mesh.
      rules: logical-axis to mesh-axis rules.

    Returns:
      (model, config).
    """
    config = LlamaConfig.from_json(pathlib.Path(path))
    return qwen3.load_weights(config, path, dtype, mesh, rules=rules), config


def save_hf(
    model: qwen3.Qwen3ForCausalLM,
    config: LlamaConfig,
    path: str | pathlib.Path,
    *,
    max_shard_bytes: int | None = None,
) -> None:
    """Writes a ``LlamaForCausalLM`` checkpoint that ``transformers`` loads (see ``qwen3.save_hf``)."""
    if not isinstance(config, LlamaConfig):
        raise ValueError(f"save_hf: expected a LlamaConfig, got {type(config).__name__}")
    qwen3.save_hf(model, config, path, max_shard_bytes=max_shard_bytes)
