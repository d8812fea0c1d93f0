"""Text embeddings from a Qwen3 decoder: the last token's final hidden state, L2-normalised.

Qwen3-Embedding checkpoints are Qwen3 decoders used without their language-model
head. Hugging Face stores them as `Qwen3Model` (tensor names without the
`model.` prefix, no `lm_head`); a `Qwen3ForCausalLM` checkpoint (with the
prefix) works too, its head is not read. The embedding of a text is the final
(normed) hidden state at its last token; with left padding that is position -1
of every row.

    decoder, config = embedding.load_hf(path)
    vectors = embedding.pooled(decoder, ids, mask)      # [B, T] -> [B, D] float32, unit norm
"""

import json
import pathlib

import jax
import jax.numpy as jnp
from flax import nnx

from pau_jax.models import qwen3, weights

# Architectures whose decoder can embed (config.json `architectures`).
ARCHITECTURES = ("Qwen3Model", "Qwen3ForCausalLM")
_EPS = 1e-12  # As torch.nn.functional.normalize.


class _Prefixed(nnx.Module):
    """A decoder under the attribute `model`, so that its tensors are read as `model.*`."""

    def __init__(self, decoder: qwen3.Qwen3Model):
        self.model = decoder


def read_config(path: str | pathlib.Path) -> qwen3.Qwen3Config:
    """The decoder config of a Qwen3 or Qwen3-Embedding checkpoint directory."""
    path = pathlib.Path(path).expanduser()
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} not found; pass a Qwen3-Embedding (Hugging Face) checkpoint directory"
        )
    hf = json.loads(config_path.read_text())
    architectures = hf.get("architectures") or ["Qwen3ForCausalLM"]
    if not set(architectures) & set(ARCHITECTURES):
        raise ValueError(
            f"{config_path} describes {architectures}; an embedding model must be one of "
            f"{ARCHITECTURES}"
        )
    hf = dict(hf, architectures=["Qwen3ForCausalLM"])  # The decoder is the same module.
    return qwen3.Qwen3Config.from_hf_dict(hf, source=str(config_path))


def load_hf(
    path: str | pathlib.Path, dtype="float32"
) -> tuple[qwen3.Qwen3Model, qwen3.Qwen3Config]:
    """Loads the decoder of a Qwen3-Embedding (or Qwen3) checkpoint directory.

    Args:
      path: directory with config.json and safetensors (single file or index + shards).
      dtype: parameter dtype ('float32' on CPU, 'bfloat16' on accelerators).

    Returns:
      (the `qwen3.Qwen3Model` decoder, its config).

    Raises:
      ValueError: the checkpoint has no decoder tensors, or they do not match config.json.
    """
    path = pathlib.Path(path).expanduser()
    config = read_config(path)
    names = weights.open_checkpoint(path).names
    if "model.embed_tokens.weight" in names:
        prefixed = True
    elif "embed_tokens.weight" in names:
        prefixed = False
    else:
        raise ValueError(
            f"{path} has neither 'embed_tokens.weight' nor 'model.embed_tokens.weight'; "
            "pass a Qwen3 or Qwen3-Embedding checkpoint"
        )
    decoder = qwen3.abstract_model(config, dtype).model
    target = _Prefixed(decoder) if prefixed else decoder
    weights.load_into(
        target, path, dtype=jnp.dtype(dtype), ignore=("lm_head.weight", "model.lm_head.weight")
    )
    return decoder, config


@nnx.jit
def _pooled(decoder: qwen3.Qwen3Model, ids: jax.Array, mask: jax.Array) -> jax.Array:
    real = mask.astype(bool)
    positions = jnp.maximum(jnp.cumsum(real, axis=-1, dtype=jnp.int32) - 1, 0)
    t = ids.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    hidden, _ = decoder(ids, positions=positions, mask=causal[None] & real[:, None, :])
    last = hidden[:, -1].astype(jnp.float32)
    norm = jnp.linalg.norm(last, axis=-1, keepdims=True)
    return last / jnp.maximum(norm, _EPS)


def pooled(decoder: qwen3.Qwen3Model, ids, mask) -> jax.Array:
    """L2-normalised last-token embeddings of a left-padded batch.

    Args:
      decoder: a `qwen3.Qwen3Model` (e.g. from `load_hf`).
      ids: [B, T] int32 token ids, left-padded.
      mask: [B, T], 1 on real tokens; every row's last position must be real.

    Returns:
      [B, D] float32 unit vectors.

    Raises:
      ValueError: a row's last position is padding (the batch is not left-padded)
        or a row has no token.
    """
    ids, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)
    if ids.ndim != 2 or ids.shape != mask.shape:
        raise ValueError(f"ids and mask must both be [B, T], got {ids.shape} and {mask.shape}")
    if not bool(jnp.all(mask[:, -1] == 1)):
        raise ValueError("every row must end with a real token: pad on the left")
    return _pooled(decoder, ids, mask)
