"""The key/value cache that incremental decoding writes into."""

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
    """Per-layer keys and values for S slots, plus which slots hold real tokens.

    A pytree, so it can be passed to (and donated to) ``jax.jit``.

    Attributes:
      k: L arrays [B, S, K, H], the rotated keys.
      v: L arrays [B, S, K, H], the values.
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
    """
    shape = (batch_size, max_len, config.num_key_value_heads, config.head_dim)
    layers = range(config.num_hidden_layers)
    return KVCache(
        k=tuple(jnp.zeros(shape, dtype) for _ in layers),
        v=tuple(jnp.zeros(shape, dtype) for _ in layers),
        mask=jnp.zeros((batch_size, max_len), bool),
    )
