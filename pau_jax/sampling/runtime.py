"""What the sampler's jitted programs share: trace and call counters, and the KV cache's placement.

The counters are kept on the host: `TRACES` counts traces of each jitted function (a
retrace is a new compilation), `CALLS` the prefill and decode calls, prompt rows and tokens.
`constrain_cache` places a cache's rows over the batch mesh axes and its heads over `tp`
(a no-op without a mesh), so every program that makes or grows a cache lays it out alike.
`release_freed_memory` hands the C heap's free pages back to the OS after a call.
"""

import collections
import ctypes
import sys

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


def _malloc_trim():
    """glibc's `malloc_trim`, or None (another C library, another OS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_freed_memory() -> bool:
    """Returns the free pages of the C heap to the OS (glibc `malloc_trim(0)`); False if none.

    XLA:CPU allocates a call's buffers with malloc. Buffers below glibc's mmap threshold
    (which grows to 32 MiB as large buffers are freed) come from the heap, and a heap whose
    free space lies between live blocks (a prefix cache's entries, kept across calls) is not
    returned: the resident size grew by ~0.5 GB per agent call of 16 episodes until the kernel
    killed a 40-task evaluation (docs/benchmarks.md, `benchmarks/sampler_memory.py`).
    `malloc_trim(0)` releases those pages (madvise) without moving anything; it takes
    milliseconds, against seconds for a call.
    """
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
