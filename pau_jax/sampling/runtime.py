"""What the sampler's jitted programs share: trace and call counters, and the KV cache's placement.

The counters are kept on the host: `TRACES` counts traces of each jitted function (a
retrace is a new compilation), `CALLS` the prefill and decode calls, prompt rows and tokens.
`constrain_cache` places a cache's rows over the batch mesh axes and its heads over `tp`
(a no-op without a mesh), so every program that makes or grows a cache lays it out alike.
"""

import collections

from pau_jax.models import kv_cache, sharding

TRACES: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()

# Logical axes of the cached keys [B, K, S, H] and values [B, K, H, S].
KEY_AXES = ("batch", "act_kv_heads", "length", None)
VALUE_AXES = ("batch", "act_kv_heads", None, "length")


def constrain_cache(cache: kv_cache.KVCache) -> kv_cache.KVCache:
    """Places the cache's rows over the batch mesh axes and its heads over tp (no-op off mesh)."""
    return kv_cache.KVCache(
        k=tuple(sharding.constrain(k, KEY_AXES) for k in cache.k),
        v=tuple(sharding.constrain(v, VALUE_AXES) for v in cache.v),
        mask=sharding.constrain(cache.mask, ("batch", "length")),
    )
