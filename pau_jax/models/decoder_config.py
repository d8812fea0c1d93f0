"""The config every model family shares: ``DecoderConfig``, its checks and its config.json form.

A family (``qwen3.py``, ``qwen2.py``, ``llama.py``, ``qwen3_moe.py``) subclasses
``DecoderConfig``: it names its config.json ``model_type`` and causal-LM class,
the attention variant it is (``fixed_fields``), the config.json settings the
decoder supports at one value only, the RoPE types it reads, and its own fields
(read and written by two hooks).
"""

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from flax import nnx

from pau_jax.models import layers

# config.json settings every family reads at this value only: SwiGLU blocks.
_HF_FIXED = {"hidden_act": "silu"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """Architecture of a pre-norm decoder with GQA, RoPE and SwiGLU blocks (config.json names).

    The attention variant is chosen by two fields: ``qk_norm`` (per-head RMSNorm on
    queries and keys before RoPE) and ``qkv_bias`` (biases on the q, k and v
    projections; never on o or the MLP).

    The class attributes (not fields) are what a family declares: ``model_type``
    and ``architecture`` as config.json writes them, ``family_name`` for messages,
    ``fixed_fields`` (fields of this class the family holds at one value, e.g. its
    attention variant), ``hf_fixed`` (config.json settings supported at one value
    only; an absent one is taken to hold it), ``rope_types`` and
    ``default_max_position_embeddings`` (transformers' default for the family). Its
    own fields are read by ``_from_hf_extra`` and written by ``_to_hf_extra``;
    ``_hf_rope`` gives the RoPE settings besides ``rope_theta``.
    """

    model_type: ClassVar[str]
    architecture: ClassVar[str]
    family_name: ClassVar[str]
    fixed_fields: ClassVar[Mapping[str, Any]] = {}
    hf_fixed: ClassVar[Mapping[str, Any]] = {}
    rope_types: ClassVar[tuple[str, ...]] = ("default",)
    default_max_position_embeddings: ClassVar[int]

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    qk_norm: bool = False
    qkv_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    def __post_init__(self):
        for name, wanted in self.fixed_fields.items():
            if getattr(self, name) != wanted:
                raise ValueError(
                    f"{self.family_name} has {name}={wanted!r} only, got {getattr(self, name)!r}"
                )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads <= 0 or self.num_key_value_heads <= 0:
            raise ValueError("num_attention_heads and num_key_value_heads must be positive")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be positive and even for RoPE, got {self.head_dim}")

    def rope_frequencies(self) -> np.ndarray:
        """The [head_dim / 2] float32 rotary inverse frequencies (unscaled RoPE)."""
        return layers.rope_inv_freq(self.head_dim, self.rope_theta)

    def mlp_class(self, layer_index: int) -> type[nnx.Module]:
        """The feed-forward block of decoder layer ``layer_index`` (dense SwiGLU everywhere)."""
        del layer_index
        return layers.MLP

    def mlp_parameters(self, layer_index: int, *, active: bool = False) -> int:
        """Parameters of layer ``layer_index``'s feed-forward block (``active``: those one token uses)."""
        del layer_index, active
        return 3 * self.hidden_size * self.intermediate_size

    def num_parameters(self, *, active: bool = False) -> int:
        """Parameters of the model (with ``active``, those one token uses)."""
        d, h = self.hidden_size, self.head_dim
        heads = self.num_attention_heads + self.num_key_value_heads
        attention = 2 * d * heads * h + (2 * h if self.qk_norm else 0)
        if self.qkv_bias:
            attention += (heads + self.num_key_value_heads) * h
        total = (1 if self.tie_word_embeddings else 2) * self.vocab_size * d + d
        for i in range(self.num_hidden_layers):
            total += attention + 2 * d + self.mlp_parameters(i, active=active)
        return total

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], *, source: str = "config") -> "DecoderConfig":
        """Reads a Hugging Face config dict of this family (transformers 4 or 5 form).

        RoPE settings come from ``rope_parameters`` (transformers 5) or from
        ``rope_theta`` and ``rope_scaling`` (transformers 4); absent fields take
        transformers' defaults.

        Raises:
          ValueError: the dict is not this family's causal-LM config, lacks a field it
            needs, or uses a feature this decoder lacks (``hf_fixed``, another RoPE type).
        """
        name = cls.family_name
        if d.get("model_type") != cls.model_type:
            raise ValueError(
                f"{source} has model_type {d.get('model_type')!r}; only {name} checkpoints "
                f"(model_type {cls.model_type!r}) can be loaded"
            )
        architectures = d.get("architectures") or [cls.architecture]
        if cls.architecture not in architectures:
            raise ValueError(
                f"{source} describes {architectures}; only {cls.architecture} is supported"
            )
        for key, wanted in {**_HF_FIXED, **cls.hf_fixed}.items():
            if d.get(key, wanted) != wanted:
                raise ValueError(
                    f"{source} sets {key}={d[key]!r}; this {name} model needs {wanted!r}"
                )
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in cls.rope_types:
            raise ValueError(
                f"{source} uses RoPE type {rope_type!r}; supported: "
                + ", ".join(repr(t) for t in cls.rope_types)
            )
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
        for key in (*required, "num_attention_heads"):
            if key not in d:
                raise ValueError(f"{source} lacks {key!r}, which a {name} config needs")
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
            max_position_embeddings=d.get(
                "max_position_embeddings", cls.default_max_position_embeddings
            ),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            **cls._from_hf_extra(d, rope=dict(rope, rope_type=rope_type), source=source),
        )

    @classmethod
    def _from_hf_extra(cls, d: dict[str, Any], *, rope: dict[str, Any], source: str) -> dict:
        """The family's own fields from config dict ``d`` (``rope``: its RoPE settings)."""
        del d, rope, source
        return {}

    @classmethod
    def from_json(cls, path: str | pathlib.Path) -> "DecoderConfig":
        """Reads ``config.json`` (``path`` is the file or its checkpoint directory)."""
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} does not exist; pass a Hugging Face checkpoint directory"
            )
        return cls.from_hf_dict(json.loads(path.read_text()), source=str(path))

    def to_hf_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` dict (readable by transformers 4 and 5)."""
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        return {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": dict(self._hf_rope(), rope_theta=self.rope_theta),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            **_HF_FIXED,
            **self.hf_fixed,
            **self._to_hf_extra(),
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
        }

    def _hf_rope(self) -> dict[str, Any]:
        """The RoPE settings besides ``rope_theta``, as config.json's ``rope_parameters`` holds them."""
        return {"rope_type": "default"}

    def _to_hf_extra(self) -> dict[str, Any]:
        """The family's own config.json entries."""
        return {}
