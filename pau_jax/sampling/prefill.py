"""The prefill: every prompt but its last token cached, whole or after a reused prefix.

`prefill_rows` runs one of two jitted programs: `_prefill` (the distinct prompts whole, last
position only, no logits) or, on a `PrefixCache` hit, `_prefill_extend` (only the tokens after
each reused prefix, laid over it with `Decoder.decode(overlay=True)`). Both give the slots of
`batching.BatchLayout` and copy each prompt's cache to its G sample rows.
"""

import functools
import logging
import time

import jax
import jax.numpy as jnp
from flax import nnx

from pau_jax.models import kv_cache, sharding
from pau_jax.sampling import batching, runtime
from pau_jax.sampling import prefix_cache as prefix_cache_lib

_log = logging.getLogger(__name__)


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_len", "cache_dtype"))
def _prefill(graphdef, state, input_ids, mask, row_source, *, cache_len, cache_dtype):
    """Caches the distinct prompts (all but their last token) and lays them out as decode rows.

    The last prompt token is left for the first decode step, so the prefill computes no
    logits at all and every decode step has the same shape.

    Args:
      graphdef: the model's static graph definition.
      state: the model's state (parameters).
      input_ids: [U, W] prompts without their last token, left-padded.
      mask: [U, W] 1 on those tokens.
      row_source: [B] prompt index of every decode row, or None when row b is prompt b
        (one sample per prompt and as many rows as prompts: nothing to copy).
      cache_len: S, cache slots (W plus the first decode segment's steps).
      cache_dtype: dtype of cached keys and values.

    Returns:
      KVCache with B rows of S slots, slots [0, W) filled (`batching.BatchLayout`).
    """
    runtime.TRACES["prefill"] += 1
    model = nnx.merge(graphdef, state)
    cache = kv_cache.init_cache(model.config, input_ids.shape[0], cache_len, cache_dtype)
    positions = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
    _, cache = model.decode(
        input_ids,
        positions=positions,
        cache=cache,
        cache_index=jnp.int32(0),
        attention_mask=mask,
        last_only=True,
        cache_is_empty=True,
    )
    return runtime.constrain_cache(_to_rows(cache, row_source))


def _to_rows(cache: kv_cache.KVCache, row_source) -> kv_cache.KVCache:
    """The cache of each decode row (a copy of its prompt's), or `cache` itself for None."""
    if row_source is None:
        return cache
    return jax.tree.map(lambda x: jnp.take(x, row_source, axis=0), cache)


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_len"))
def _prefill_extend(
    graphdef, state, prefix_k, prefix_v, prefix_mask, input_ids, mask, starts, row_source,
    *, cache_len,
):  # fmt: skip
    """Like `_prefill`, on top of cached prefixes: only the tokens after them are computed.

    The result has the slots of `_prefill` for the same prompts (`batching.BatchLayout`
    states where the reused prefix and the T-slot block of new tokens lie).

    Args:
      graphdef: the model's static graph definition.
      state: the model's state (parameters).
      prefix_k: L arrays [U, K, W, H], each prompt's reused prefix in its slots.
      prefix_v: L arrays [U, K, H, W], the same for values.
      prefix_mask: [U, W] bool, True on reused slots.
      input_ids: [U, T] the rest of each prompt but its last token, left-padded.
      mask: [U, T] 1 on those tokens.
      starts: [U] int32 length of each prompt's prefix (the position of its first new token).
      row_source: [B] prompt index of every decode row, or None (row b is prompt b).
      cache_len: S, cache slots (W plus the first decode segment's steps).

    Returns:
      KVCache with B rows of S slots, slots [0, W) filled as by `_prefill`.
    """
    runtime.TRACES["prefill_extend"] += 1
    model = nnx.merge(graphdef, state)
    width = prefix_mask.shape[1]
    # The model runs on a cache of exactly the W prefill slots, so attention reads no empty
    # decode slot; the decode room is added afterwards.
    cache = kv_cache.KVCache(k=tuple(prefix_k), v=tuple(prefix_v), mask=prefix_mask)
    positions = starts[:, None] + jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
    _, cache = model.decode(
        input_ids,
        positions=positions,
        cache=cache,
        cache_index=jnp.int32(width - input_ids.shape[1]),
        attention_mask=mask,
        last_only=True,
        overlay=True,
    )
    return runtime.constrain_cache(kv_cache.grow(_to_rows(cache, row_source), cache_len))


# A prefill computes attention scores for every query and key position of its rows at
# once: rows are prefilled in chunks of at most this many (query x key) positions per row
# chunk and head (14 heads of float32 scores: ~470 MB) ...
SCORE_POSITIONS = 1 << 23
# ... of at least this many query positions where the rows allow (smaller matrix products
# run below the CPU's speed), and small enough that few rows are batch padding: chunks
# that hold only padding are not computed.
MIN_CHUNK_QUERIES = 512


def chunk_rows(height: int, num_real: int, queries: int, keys: int) -> int:
    """Rows per prefill chunk: a power of two that divides `height`, or `height` itself.

    Args:
      height: the prefill's rows (`batching.BATCH_BUCKET`: a power of two up to its
        granularity, then multiples of it), of which the first `num_real` are prompts.
      queries, keys: positions a row computes and attends over.
    """

    def floor2(n: int) -> int:
        return 1 << (max(1, n).bit_length() - 1)

    fit = floor2(SCORE_POSITIONS // max(1, queries * keys))
    efficient = 1 << max(0, -(-MIN_CHUNK_QUERIES // max(1, queries)) - 1).bit_length()
    rows = min(fit, max(efficient, floor2(-(-num_real // 4))))
    return height if rows >= height else min(rows, batching.BATCH_BUCKET["granularity"])


def _in_chunks(run, arrays, height: int, num_real: int, chunk: int) -> kv_cache.KVCache:
    """`run` on each chunk of `chunk` rows of `arrays` (pytrees of [height, ...] arrays),
    concatenated; chunks past the `num_real` real rows are empty (zeros, masked out)."""
    parts = []
    for lo in range(0, min(height, -(-num_real // chunk) * chunk), chunk):
        parts.append(run(*jax.tree.map(lambda x, lo=lo: x[lo : lo + chunk], arrays)))
    parts += [jax.tree.map(jnp.zeros_like, parts[0])] * (height // chunk - len(parts))
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *parts)


@jax.jit
def _copy_rows(cache: kv_cache.KVCache, row_source) -> kv_cache.KVCache:
    """Each decode row's copy of its prompt's cache, placed as the prefill programs place it."""
    return runtime.constrain_cache(_to_rows(cache, row_source))


def usable_prefix_cache(prefix_cache, mesh):
    """`prefix_cache`, or None under a device mesh (logged), where prompts are prefilled whole."""
    if mesh is None or prefix_cache is None:
        return prefix_cache
    _log.info(
        "prefix cache off: the model is on a device mesh %s, so prompts are prefilled whole",
        dict(mesh.shape),
    )
    return None


def _share_prefixes(graphdef, state, layout, prefix_cache, cache_dtype) -> int:
    """Prefills the prefixes the call's prompts share into `prefix_cache`; tokens prefilled.

    The shared prefixes (`PrefixCache.warm_prompts`) are prefilled as one call of their own
    (reusing what the cache already holds of them) and stored as entries, so that the
    call's prompts then reuse them like any cached prefix: a prefix that k prompts share
    costs one prefill instead of k.
    """
    warm = prefix_cache.warm_prompts(layout.prompts)
    if not warm:
        return 0
    warm_layout = batching.layout_batch(warm, 1)
    # Shared prefixes of the shared prefixes are prefilled once first, the same way (each
    # level's prefixes are shorter than the last's, so this ends).
    cache, stats = prefill_rows(graphdef, state, warm_layout, prefix_cache, 0, cache_dtype)
    block = prefix_cache_lib.Block(tuple(cache.k), tuple(cache.v))
    width = warm_layout.input_ids.shape[1]
    stored = [
        prefix_cache.add(p[:-1], block, row, width - (len(p) - 1)) for row, p in enumerate(warm)
    ]
    prefix_cache.stats["shared_prefixes"] += sum(stored)
    _log.debug("shared prefixes: %d of %d stored, %s tokens", sum(stored), len(warm), stats)
    return stats["prefill_tokens"]


def prefill_rows(
    graphdef,
    state,
    layout: batching.BatchLayout,
    prefix_cache: prefix_cache_lib.PrefixCache | None,
    room: int,
    cache_dtype: jnp.dtype,
    share: bool = True,
) -> tuple[kv_cache.KVCache, dict]:
    """The decode rows' cache with every prompt but its last token prefilled.

    With a `prefix_cache` that holds a prefix of some prompt, only the tokens after the
    cached prefixes are computed (`_prefill_extend`); otherwise the prompts are prefilled
    whole (`_prefill`). Both give the slots of `batching.BatchLayout`.

    Args:
      graphdef: the model's static graph definition.
      state: the model's state (parameters).
      layout: the call's layout.
      prefix_cache: a cache to reuse (bound to `state` and `cache_dtype` first), or None.
      room: the first decode segment's steps; the cache has S = W + room slots.
      cache_dtype: dtype of cached keys and values.
      share: first prefill the prefixes several prompts share into `prefix_cache`
        (`_share_prefixes`; its tokens and time are counted in the returned fields).

    Returns:
      (KVCache with B rows of S slots, the `SampleOutput` fields prefill_seconds,
      prefill_tokens and reused_tokens by name).
    """
    start = time.perf_counter()
    cache_len = layout.input_ids.shape[1] + room
    reuse, warmed = None, 0
    if prefix_cache is not None:
        prefix_cache.bind(state, cache_dtype)
        if share:
            warmed = _share_prefixes(graphdef, state, layout, prefix_cache, cache_dtype)
        reuse = prefix_cache.plan_reuse(layout)
    runtime.CALLS["prefill"] += 1
    height, width = layout.input_ids.shape
    row_source = None if layout.rows_are_prompts else jnp.asarray(layout.row_source)
    if reuse is None:
        prefill_tokens, reused_tokens = sum(len(p) - 1 for p in layout.prompts), 0
        arrays = (jnp.asarray(layout.input_ids), jnp.asarray(layout.mask))
        queries = width

        def run(rows, input_ids, mask):
            return _prefill(
                graphdef, state, input_ids, mask, rows, cache_len=cache_len, cache_dtype=cache_dtype
            )
    else:
        prefill_tokens, reused_tokens = int(reuse.suffix_mask.sum()), int(reuse.starts.sum())
        arrays = (reuse.prefix_k, reuse.prefix_v) + tuple(
            jnp.asarray(x)
            for x in (reuse.prefix_mask, reuse.suffix_ids, reuse.suffix_mask, reuse.starts)
        )
        queries = reuse.suffix_ids.shape[1]

        def run(rows, *arrays):
            return _prefill_extend(graphdef, state, *arrays, rows, cache_len=cache_len)

    chunk = height
    if sharding.mesh_of(state) is None:
        chunk = chunk_rows(height, layout.num_distinct, queries, width)
    if chunk == height:
        cache = run(row_source, *arrays)
    else:
        cache = _in_chunks(functools.partial(run, None), arrays, height, layout.num_distinct, chunk)
        cache = cache if row_source is None else _copy_rows(cache, row_source)
    runtime.CALLS["prefill_rows"] += min(height, -(-layout.num_distinct // chunk) * chunk)
    jax.block_until_ready(cache)
    seconds = time.perf_counter() - start
    prefill_tokens += warmed
    runtime.CALLS["prefill_tokens"] += prefill_tokens
    runtime.CALLS["reused_tokens"] += reused_tokens
    return cache, dict(
        prefill_seconds=seconds, prefill_tokens=prefill_tokens, reused_tokens=reused_tokens
    )
