"""A BERT encoder in Flax NNX under Hugging Face `BertModel` names, and its mean-pooled sentence embeddings.

The module tree mirrors transformers' `BertModel` (absolute positions, erf GELU,
post-LN, no pooler): `embeddings.{word,position,token_type}_embeddings` and
`embeddings.LayerNorm`, then `encoder.layer.N` with `attention.self.{query,key,value}`,
`attention.output.{dense,LayerNorm}`, `intermediate.dense` and `output.{dense,LayerNorm}`.
Every text is token type 0 and positions count from 0, so batches are padded on
the right. sentence-transformers checkpoints (all-MiniLM-L6-v2) embed a text as
the mean of its last hidden states over real tokens, L2-normalised (`mean_pooled`).

    model, config = bert.load_hf(path)
    vectors = bert.mean_pooled(model, ids, mask)      # [B, T] -> [B, D] float32, unit norm
"""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
from flax import nnx

from pau_jax.models import layers, weights

_EPS = 1e-12  # As torch.nn.functional.normalize.
_MEAN_EPS = 1e-9  # As sentence-transformers' mean pooling (token counts are clamped to it).
# config.json settings this encoder implements only in one form (absent means that form).
_FIXED = {
    "hidden_act": "gelu",
    "position_embedding_type": "absolute",
    "is_decoder": False,
    "add_cross_attention": False,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertConfig:
    """Sizes of a BERT encoder (the fields of a Hugging Face `BertConfig` it uses)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )

    @classmethod
    def from_hf_dict(cls, d: dict, *, source: str = "config") -> "BertConfig":
        """Reads a Hugging Face BERT config dict; refuses settings this encoder lacks."""
        if d.get("model_type") != "bert":
            raise ValueError(f"{source} has model_type {d.get('model_type')!r}, not 'bert'")
        for key, wanted in _FIXED.items():
            if d.get(key, wanted) != wanted:
                raise ValueError(f"{source} sets {key}={d[key]!r}; this BERT needs {wanted!r}")
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in d]
        if missing:
            raise ValueError(f"{source} lacks {missing[0]!r}, which a BERT config needs")
        return cls(**{f.name: d[f.name] for f in fields if f.name in d})


def read_config(path: str | pathlib.Path) -> BertConfig:
    """The config of a BERT checkpoint directory (its config.json)."""
    config_path = pathlib.Path(path).expanduser() / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found; pass a BERT checkpoint directory")
    return BertConfig.from_hf_dict(json.loads(config_path.read_text()), source=str(config_path))


class LayerNorm(nnx.Module):
    """torch's LayerNorm over the last axis (biased variance) in float32; `weight` and `bias` [D]."""

    def __init__(self, size: int, *, eps: float, dtype):
        self.weight = nnx.Param(
            jnp.ones((size,), dtype), out_sharding=("embed",), eager_sharding=False
        )
        self.bias = nnx.Param(
            jnp.zeros((size,), dtype), out_sharding=("embed",), eager_sharding=False
        )
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalises [..., D]; returns the input dtype."""
        x32 = x.astype(jnp.float32)
        mean = x32.mean(axis=-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        w, b = self.weight[...].astype(jnp.float32), self.bias[...].astype(jnp.float32)
        return (y * w + b).astype(x.dtype)


def _linear(d_in: int, d_out: int, axes, *, dtype, rngs) -> layers.Linear:
    return layers.Linear(d_in, d_out, axes=axes, dtype=dtype, rngs=rngs, use_bias=True)


def _embed(rows: int, d: int, axis, *, dtype, rngs) -> nnx.Embed:
    init = layers.partitioned(nnx.initializers.normal(layers.INIT_STDDEV), (axis, "embed"))
    return nnx.Embed(rows, d, dtype=dtype, param_dtype=dtype, embedding_init=init, rngs=rngs)


class Embeddings(nnx.Module):
    """Word + token type 0 + absolute position embeddings, then LayerNorm."""

    def __init__(self, config: BertConfig, *, dtype, rngs: nnx.Rngs):
        d, kw = config.hidden_size, dict(dtype=dtype, rngs=rngs)
        self.word_embeddings = _embed(config.vocab_size, d, "vocab", **kw)
        self.position_embeddings = _embed(config.max_position_embeddings, d, None, **kw)
        self.token_type_embeddings = _embed(config.type_vocab_size, d, None, **kw)
        self.LayerNorm = LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:
        """Maps [B, T] token ids to [B, T, D]."""
        x = self.word_embeddings(ids) + self.token_type_embeddings.embedding[0]
        return self.LayerNorm(x + self.position_embeddings.embedding[: ids.shape[1]])


class SelfAttention(nnx.Module):
    """Bidirectional multi-head attention over the real tokens (`attention.self`)."""

    def __init__(self, config: BertConfig, *, dtype, rngs: nnx.Rngs):
        d, kw = config.hidden_size, dict(dtype=dtype, rngs=rngs)
        self.query = _linear(d, d, ("embed", "heads"), **kw)
        self.key = _linear(d, d, ("embed", "heads"), **kw)
        self.value = _linear(d, d, ("embed", "heads"), **kw)
        self.heads = config.num_attention_heads

    def __call__(self, x: jax.Array, real: jax.Array) -> jax.Array:
        """Maps [B, T, D] and a [B, T] bool mask of real tokens to [B, T, D]."""
        b, t, d = x.shape
        shape = (b, t, self.heads, d // self.heads)
        q = self.query(x).reshape(shape)
        k = self.key(x).reshape(shape).transpose(0, 2, 1, 3)  # [B, N, T, H]
        v = self.value(x).reshape(shape).transpose(0, 2, 3, 1)  # [B, N, H, T]
        allowed = jnp.broadcast_to(real[:, None, :], (b, t, t))
        return layers.attend(q, k, v, allowed).reshape(b, t, d)


class DenseNorm(nnx.Module):
    """`LayerNorm(dense(x) + residual)`: a layer's `attention.output` and `output`."""

    def __init__(self, d_in: int, config: BertConfig, axes, *, dtype, rngs: nnx.Rngs):
        self.dense = _linear(d_in, config.hidden_size, axes, dtype=dtype, rngs=rngs)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps, dtype=dtype)

    def __call__(self, x: jax.Array, residual: jax.Array) -> jax.Array:
        """Maps [..., d_in] and the [..., D] residual to [..., D]."""
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nnx.Module):
    """`attention`: self-attention, then its output projection, residual and LayerNorm."""

    def __init__(self, config: BertConfig, *, dtype, rngs: nnx.Rngs):
        d, kw = config.hidden_size, dict(dtype=dtype, rngs=rngs)
        self.self = SelfAttention(config, **kw)
        self.output = DenseNorm(d, config, ("heads", "embed"), **kw)

    def __call__(self, x: jax.Array, real: jax.Array) -> jax.Array:
        return self.output(self.self(x, real), x)


class Intermediate(nnx.Module):
    """`intermediate`: the MLP's up projection [..., D] -> [..., F] and erf GELU."""

    def __init__(self, config: BertConfig, *, dtype, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.dense = _linear(d, f, ("embed", "mlp"), dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.gelu(self.dense(x), approximate=False)


class Layer(nnx.Module):
    """One post-LN encoder layer (`encoder.layer.N`)."""

    def __init__(self, config: BertConfig, *, dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, rngs=rngs)
        self.attention = Attention(config, **kw)
        self.intermediate = Intermediate(config, **kw)
        self.output = DenseNorm(config.intermediate_size, config, ("mlp", "embed"), **kw)

    def __call__(self, x: jax.Array, real: jax.Array) -> jax.Array:
        h = self.attention(x, real)
        return self.output(self.intermediate(h), h)


class Encoder(nnx.Module):
    """The stack of layers (`encoder`)."""

    def __init__(self, config: BertConfig, *, dtype, rngs: nnx.Rngs):
        n = config.num_hidden_layers
        self.layer = nnx.List([Layer(config, dtype=dtype, rngs=rngs) for _ in range(n)])


class BertModel(nnx.Module):
    """The BERT encoder without its pooler; `model(ids, mask)` gives the last hidden states."""

    def __init__(self, config: BertConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        self.embeddings = Embeddings(config, dtype=dtype, rngs=rngs)
        self.encoder = Encoder(config, dtype=dtype, rngs=rngs)

    def __call__(self, ids: jax.Array, mask: jax.Array) -> jax.Array:
        """Maps [B, T] token ids and a [B, T] mask (1 on real tokens, right-padded) to [B, T, D]."""
        x, real = self.embeddings(ids), mask.astype(bool)
        for layer in self.encoder.layer:
            x = layer(x, real)
        return x


class _Prefixed(nnx.Module):
    """An encoder under the attribute `bert`, so that its tensors are read as `bert.*`."""

    def __init__(self, model: BertModel):
        self.bert = model


def load_hf(path: str | pathlib.Path, dtype="float32") -> tuple[BertModel, BertConfig]:
    """Loads the encoder of a Hugging Face BERT checkpoint directory (`bert.` prefix or none).

    The pooler, task heads and the `position_ids` / `token_type_ids` buffers are not read.

    Args:
      path: directory with config.json and safetensors (single file or index + shards).
      dtype: parameter dtype ('float32' on CPU, 'bfloat16' on accelerators).

    Returns:
      (the `BertModel`, its config).

    Raises:
      FileNotFoundError: no config.json or safetensors in `path`.
      ValueError: config.json asks for what this encoder lacks, or the tensors do not match it.
    """
    path = pathlib.Path(path).expanduser()
    config = read_config(path)
    names = weights.open_checkpoint(path).names
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in names else ""
    body = (f"{prefix}embeddings.", f"{prefix}encoder.")
    buffers = {f"{prefix}embeddings.{b}" for b in ("position_ids", "token_type_ids")}
    ignore = [n for n in names if not n.startswith(body) or n in buffers]
    model = nnx.eval_shape(lambda: BertModel(config, dtype=dtype, rngs=nnx.Rngs(0)))
    target = _Prefixed(model) if prefix else model
    weights.load_into(target, path, dtype=jnp.dtype(dtype), ignore=ignore)
    return model, config


@nnx.jit
def _mean_pooled(model: BertModel, ids: jax.Array, mask: jax.Array) -> jax.Array:
    hidden = model(ids, mask).astype(jnp.float32)
    weight = mask.astype(jnp.float32)[..., None]
    mean = (hidden * weight).sum(axis=1) / jnp.maximum(weight.sum(axis=1), _MEAN_EPS)
    return mean / jnp.maximum(jnp.linalg.norm(mean, axis=-1, keepdims=True), _EPS)


def mean_pooled(model: BertModel, ids, mask) -> jax.Array:
    """L2-normalised mean of the last hidden states over the real tokens of a right-padded batch.

    Args:
      model: a `BertModel` (e.g. from `load_hf`).
      ids: [B, T] int token ids, right-padded, T <= max_position_embeddings.
      mask: [B, T], 1 on real tokens.

    Returns:
      [B, D] float32 unit vectors.

    Raises:
      ValueError: bad shapes, T beyond the position embeddings, or a row that is not real
        tokens then padding (left-padded, or no real token).
    """
    ids, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)
    if ids.ndim != 2 or ids.shape != mask.shape:
        raise ValueError(f"ids and mask must both be [B, T], got {ids.shape} and {mask.shape}")
    limit = model.config.max_position_embeddings
    if ids.shape[1] > limit:
        raise ValueError(f"{ids.shape[1]} tokens exceed max_position_embeddings {limit}; truncate")
    if not bool(jnp.all(mask[:, 0] == 1) & jnp.all(mask[:, 1:] <= mask[:, :-1])):
        raise ValueError("every row must be real tokens then padding: pad on the right")
    return _mean_pooled(model, ids, mask)
