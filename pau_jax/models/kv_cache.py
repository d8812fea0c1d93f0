"""The key/value cache that incremental decoding writes into."""

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
    """Per-layer keys and values for S slots, plus which slots hold real tokens.

    A pytree, so it can be passed to (and donated to) ``jax.jit``. Keys and values are
    stored heads-major, keys [B, K, S, H] and values transposed [B, K, H, S]: both
    attention dots then batch over the leading (B, K) and contract over the minor axis
    of the cached operand (H for the scores, S for the weighted values), the layout the
    CPU backend's batched matmuls read in place; in any other layout XLA copies (and
    transposes) the whole cache at every step.

    Attributes:
      k: L arrays [B, K, S, H], the rotated keys.
      v: L arrays [B, K, H, S], the values, transposed.
      mask: [B, S] bool, True for slots holding a real (non-padding) token.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    mask: jax.Array

    @property
    def max_len(self) -> int:
        """The number of slots S."""
        return self.mask.shape[1]


def init_cache(config, batch_size: int, max_len: int, dtype=jnp.float32) -> KVCache:
    """An empty cache: zero keys and values, every slot marked unused.

    Args:
      config: a model config (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``).
      batch_size: B.
      max_len: S, the number of token slots.
      dtype: dtype of keys and values; usually the model's parameter dtype.

    Returns:
      A KVCache of zeros (keys [B, K, S, H], values [B, K, H, S]) with a [B, S] mask of False.
    """
    heads, head_dim = config.num_key_value_heads, config.head_dim
    layers = range(config.num_hidden_layers)
    return KVCache(
        k=tuple(jnp.zeros((batch_size, heads, max_len, head_dim), dtype) for _ in layers),
        v=tuple(jnp.zeros((batch_size, heads, head_dim, max_len), dtype) for _ in layers),
        mask=jnp.zeros((batch_size, max_len), bool),
    )


def grow(cache: KVCache, max_len: int) -> KVCache:
    """The same cache with S grown to ``max_len`` slots; the new slots are empty.

    Args:
      cache: a cache of S <= ``max_len`` slots.
      max_len: the new number of slots.

    Returns:
      A KVCache of ``max_len`` slots; slots [0, S) are those of ``cache``.
    """
    extra = max_len - cache.max_len
    if extra < 0:
        raise ValueError(f"cannot shrink a cache of {cache.max_len} slots to {max_len}")
    keys, values = ((0, 0), (0, 0), (0, extra), (0, 0)), ((0, 0), (0, 0), (0, 0), (0, extra))
    return KVCache(
        k=tuple(jnp.pad(k, keys) for k in cache.k),
        v=tuple(jnp.pad(v, values) for v in cache.v),
        mask=jnp.pad(cache.mask, ((0, 0), (0, extra))),
    )
