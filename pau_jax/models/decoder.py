"""The decoder every model family shares: its config, the causal LM in Flax NNX, and HF checkpoints.

A family (``qwen3.py``, ``llama.py``, ``qwen3_moe.py``) subclasses ``DecoderConfig``:
it names its config.json ``model_type`` and causal-LM class, the config.json
settings the decoder supports at one value only, the RoPE types it reads, and
its own fields (read and written by two hooks). ``Decoder`` builds the
Hugging Face module tree from any such config; ``Family`` pairs a config class
with its presets and is what ``auto.ARCHITECTURES`` registers.
"""

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pau_jax.models import kv_cache, layers, sharding, weights

# config.json settings every family reads at this value only: SwiGLU blocks, bias-free linears.
_HF_FIXED = {"hidden_act": "silu", "attention_bias": False}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """Architecture of a pre-norm decoder with GQA, RoPE and SwiGLU blocks (config.json names).

    The class attributes (not fields) are what a family declares: ``model_type``
    and ``architecture`` as config.json writes them, ``family_name`` for messages,
    ``hf_fixed`` (config.json settings supported at one value only; an absent one
    is taken to hold it), ``rope_types`` and ``default_max_position_embeddings``
    (transformers' default for the family). Its own fields are read by
    ``_from_hf_extra`` and written by ``_to_hf_extra``; ``_hf_rope`` gives the
    RoPE settings besides ``rope_theta``.
    """

    model_type: ClassVar[str]
    architecture: ClassVar[str]
    family_name: ClassVar[str]
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
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    def __post_init__(self):
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


class Backbone(nnx.Module):
    """Token embedding, decoder layers and final norm (``model.*`` in Hugging Face names)."""

    def __init__(self, config: DecoderConfig, *, dtype, rngs: nnx.Rngs):
        self.embed_tokens = nnx.Embed(
            config.vocab_size,
            config.hidden_size,
            dtype=dtype,
            param_dtype=dtype,
            embedding_init=layers.partitioned(
                nnx.initializers.normal(layers.INIT_STDDEV), ("vocab", "embed")
            ),
            rngs=rngs,
        )
        self.layers = nnx.List(
            [
                layers.DecoderLayer(config, dtype=dtype, rngs=rngs, mlp_class=config.mlp_class(i))
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = layers.RMSNorm(
            config.hidden_size, eps=config.rms_norm_eps, axis_name="embed", dtype=dtype
        )

    def __call__(
        self,
        input_ids,
        *,
        positions,
        mask,
        cache=None,
        cache_index=None,
        cache_mask=None,
        write_mask=None,
    ):
        """Maps [B, T] ids to ([B, T, D] normed hidden states, updated (keys, values) or None).

        ``mask`` is [B, T, T] (which of the T tokens each attends to); ``cache`` is None
        or (keys, values), L arrays [B, K, S, H] and [B, K, H, S], that the tokens are
        written into from slot ``cache_index`` (only those in ``write_mask``, [B, T] or
        None for all); ``cache_mask`` ([B, S] or None) is which cached slots they also
        attend to (see ``layers.Attention``).
        """
        x = sharding.constrain(self.embed_tokens(input_ids), layers.ACTIVATION_AXES)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (cache[0][i], cache[1][i])
            x, new = layer(
                x,
                positions=positions,
                mask=mask,
                cache=layer_cache,
                cache_index=cache_index,
                cache_mask=cache_mask,
                write_mask=write_mask,
            )
            if new is not None:
                keys.append(new[0])
                values.append(new[1])
        return self.norm(x), (None if cache is None else (tuple(keys), tuple(values)))


class Decoder(nnx.Module):
    """The causal language model of any family; ``lm_head`` is None when tied to the embedding."""

    def __init__(self, config: DecoderConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.model = Backbone(config, dtype=self.dtype, rngs=rngs)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nnx.Linear(
                config.hidden_size,
                config.vocab_size,
                use_bias=False,
                dtype=self.dtype,
                param_dtype=self.dtype,
                kernel_init=layers.partitioned(
                    nnx.initializers.normal(layers.INIT_STDDEV), ("embed", "vocab")
                ),
                rngs=rngs,
            )

    def __call__(self, input_ids, attention_mask=None, positions=None) -> jax.Array:
        """Logits of a full sequence.

        Args:
          input_ids: [B, T] int32.
          attention_mask: [B, T], 1 for real tokens and 0 for (left) padding.
          positions: [B, T]; defaults to ``cumsum(attention_mask) - 1`` clipped at 0.

        Returns:
          [B, T, V] float32 logits.
        """
        return self.logits_from_hidden(self.hidden_states(input_ids, attention_mask, positions))

    def hidden_states(self, input_ids, attention_mask=None, positions=None) -> jax.Array:
        """[B, T, D] hidden states after the final norm; arguments as in ``__call__``."""
        _, t = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        real = attention_mask.astype(bool)
        if positions is None:
            positions = jnp.maximum(jnp.cumsum(real, axis=-1, dtype=jnp.int32) - 1, 0)
        causal = jnp.tril(jnp.ones((t, t), bool))
        mask = causal[None, :, :] & real[:, None, :]
        hidden, _ = self.model(input_ids, positions=positions, mask=mask)
        return hidden

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """Maps [..., D] hidden states to [..., V] float32 logits."""
        if self.lm_head is None:
            table = self.model.embed_tokens.embedding[...]
            return jnp.einsum("...d,vd->...v", hidden, table, preferred_element_type=jnp.float32)
        kernel = self.lm_head.kernel[...]
        return jnp.einsum("...d,dv->...v", hidden, kernel, preferred_element_type=jnp.float32)

    def decode(
        self,
        input_ids,
        *,
        positions,
        cache: kv_cache.KVCache,
        cache_index,
        attention_mask=None,
        last_only: bool = False,
        cache_is_empty: bool = False,
        overlay: bool = False,
    ) -> tuple[jax.Array, kv_cache.KVCache]:
        """Runs T new tokens against a KV cache (prefill when the cache is empty).

        New tokens occupy slots [cache_index, cache_index + T). A new token attends to
        the cached slots before ``cache_index`` whose slot mask is True and to the new
        tokens up to itself that are real.

        With ``overlay``, the T slots may already hold cached tokens where the new tokens
        are padding: a left-padded block of new tokens laid over the end of a cached
        prefix, so that every row's sequence ends at the same slot. Only real new tokens
        are written (the other slots keep their keys, values and mask), and the new tokens
        attend to every cached slot whose mask is True, inside the block too.

        Args:
          input_ids: [B, T] int32 new tokens.
          positions: [B, T] their RoPE positions.
          cache: the cache, S slots.
          cache_index: int32 scalar (may be traced), slot of ``input_ids[:, 0]``.
          attention_mask: [B, T], 1 for real new tokens (default all real).
          last_only: return logits of the last new position only.
          cache_is_empty: static; True when no slot holds a token yet, so the new tokens
            attend only to each other (a prefill then costs T x T scores, not T x S).
          overlay: static; see above. Every True slot of the cache, wherever it lies,
            must precede the new tokens in the sequence (a smaller position): the cache
            should end with the block.

        Returns:
          ([B, T, V] or [B, 1, V] float32 logits, updated cache).
        """
        _, t = input_ids.shape
        real = jnp.ones(input_ids.shape, bool) if attention_mask is None else attention_mask
        real = real.astype(bool)
        mask = jnp.tril(jnp.ones((t, t), bool))[None, :, :] & real[:, None, :]
        if overlay:
            earlier = cache.mask
        else:
            earlier = cache.mask & (jnp.arange(cache.max_len) < cache_index)[None, :]
        hidden, (keys, values) = self.model(
            input_ids,
            positions=positions,
            mask=mask,
            cache=(cache.k, cache.v),
            cache_index=cache_index,
            cache_mask=None if cache_is_empty else earlier,
            write_mask=real if overlay else None,
        )
        if last_only:
            hidden = hidden[:, -1:]
        written = real
        if overlay:
            written = real | jax.lax.dynamic_slice(cache.mask, (0, cache_index), real.shape)
        slot_mask = jax.lax.dynamic_update_slice(cache.mask, written, (0, cache_index))
        new_cache = kv_cache.KVCache(k=keys, v=values, mask=slot_mask)
        return self._decode_logits(hidden), new_cache

    def _decode_logits(self, hidden: jax.Array) -> jax.Array:
        """``logits_from_hidden`` for the few rows of a decode step: [B, T, D] -> [B, T, V].

        With a tied [V, D] embedding the table is the left operand of two products over
        half the vocabulary each, [V / 2, D] x [D, B * T]. The CPU backend's matmul then
        streams the table once with B * T columns; as ``hidden @ table.T`` it runs about
        2.5x slower at 8 rows (and no faster at 1). Same contraction, float32 results.
        """
        if self.lm_head is not None or self.config.vocab_size % 2:
            return self.logits_from_hidden(hidden)
        b, t, d = hidden.shape
        table = self.model.embed_tokens.embedding[...]
        halves = table.reshape(2, table.shape[0] // 2, d)
        rows = jnp.broadcast_to(hidden.reshape(1, b * t, d), (2, b * t, d))
        logits = jnp.einsum("nvd,nrd->nvr", halves, rows, preferred_element_type=jnp.float32)
        return logits.reshape(table.shape[0], b * t).T.reshape(b, t, table.shape[0])


class _FixedKey:
    """Stands in for ``nnx.Rngs`` in an abstract build: every draw returns one key.

    Under ``nnx.eval_shape`` each ``nnx.Rngs`` counter update inspects the whole
    trace, which makes abstract builds quadratic in the number of parameters;
    the drawn values are discarded anyway.
    """

    def params(self) -> jax.Array:
        return jax.random.key(0)


def abstract_model(config: DecoderConfig, dtype="float32") -> Decoder:
    """The model with ``jax.ShapeDtypeStruct`` parameters (``nnx.eval_shape``; nothing allocated)."""
    return nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=_FixedKey()))


def load_weights(
    config: DecoderConfig,
    path: str | pathlib.Path,
    dtype="float32",
    mesh: jax.sharding.Mesh | None = None,
    *,
    rules: sharding.Rules = sharding.LOGICAL_RULES,
) -> Decoder:
    """Builds the abstract model for ``config`` and fills it from the checkpoint in ``path``."""
    model = abstract_model(config, dtype)
    ignore = ("lm_head.weight",) if config.tie_word_embeddings else ()
    weights.load_into(
        model, pathlib.Path(path), dtype=model.dtype, mesh=mesh, rules=rules, ignore=ignore
    )
    return model


def load_hf(
    config_class: type[DecoderConfig],
    path: str | pathlib.Path,
    dtype="float32",
    mesh: jax.sharding.Mesh | None = None,
    *,
    rules: sharding.Rules = sharding.LOGICAL_RULES,
) -> tuple[Decoder, DecoderConfig]:
    """Loads a Hugging Face checkpoint directory of one family without materialising a random model.

    The model is built abstractly with ``nnx.eval_shape``; each tensor is then
    memory-mapped, transposed on the host and placed on the default device
    (``mesh=None``) or into the sharding that ``rules`` give its logical axes.
    With tied embeddings a stored ``lm_head.weight`` is ignored. Experts may be
    stored per expert or fused (see ``weights``).

    Args:
      config_class: the family's config class; config.json must be of that family.
      path: directory with ``config.json`` and ``model.safetensors`` (or an index and shards).
      dtype: parameter dtype, e.g. "float32" or "bfloat16".
      mesh: optional device mesh.
      rules: logical-axis to mesh-axis rules.

    Returns:
      (model, config).
    """
    config = config_class.from_json(pathlib.Path(path))
    return load_weights(config, path, dtype, mesh, rules=rules), config


def save_hf(
    model: Decoder,
    config: DecoderConfig,
    path: str | pathlib.Path,
    *,
    max_shard_bytes: int | None = None,
) -> None:
    """Writes ``config.json`` (of the config's family) and safetensors weights that ``transformers`` loads.

    Args:
      model: the model; LoRA adapters must be merged first (``lora.merge``).
      config: the model's config.
      path: a directory without a checkpoint in it (created if needed).
      max_shard_bytes: split the weights into shards of at most this size
        (plus ``model.safetensors.index.json``); default one file.
    """
    path = pathlib.Path(path)
    if config != model.config:
        raise ValueError("save_hf: config differs from model.config; pass the model's own config")
    if jax.tree.leaves(nnx.state(model, nnx.LoRAParam)):
        raise ValueError(
            "save_hf: the model has unmerged LoRA adapters; call lora.merge(model) first "
            "or save them with lora.export_peft"
        )
    if path.exists() and (any(path.glob("*.safetensors")) or (path / weights.INDEX_FILE).exists()):
        raise FileExistsError(
            f"save_hf: {path} already holds a checkpoint; choose an empty directory"
        )
    weights.write_safetensors(weights.hf_state_dict(model), path, max_shard_bytes=max_shard_bytes)
    hf_config = config.to_hf_dict()
    hf_config["dtype"] = model.dtype.name
    (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
    """A model family: its config class (which names its config.json ``model_type``) and presets."""

    config: type[DecoderConfig]
    presets: Mapping[str, DecoderConfig]

    @property
    def model_type(self) -> str:
        return self.config.model_type

    def load_hf(
        self,
        path: str | pathlib.Path,
        dtype="float32",
        mesh: jax.sharding.Mesh | None = None,
        *,
        rules: sharding.Rules = sharding.LOGICAL_RULES,
    ) -> tuple[Decoder, DecoderConfig]:
        """(model, config) of a checkpoint directory of this family (see ``decoder.load_hf``)."""
        return load_hf(self.config, path, dtype, mesh, rules=rules)

    def save_hf(
        self,
        model: Decoder,
        config: DecoderConfig,
        path: str | pathlib.Path,
        *,
        max_shard_bytes: int | None = None,
    ) -> None:
        """``decoder.save_hf`` for a config of this family only."""
        if not isinstance(config, self.config):
            raise ValueError(
                f"save_hf: expected a {self.config.__name__}, got {type(config).__name__}"
            )
        save_hf(model, config, path, max_shard_bytes=max_shard_bytes)
