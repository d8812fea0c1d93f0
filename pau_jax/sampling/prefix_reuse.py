"""How the prefixes a `PrefixCache` matched become the arrays of a prefill that reuses them.

`plan` lays each prompt's matched run (an entry's slots in the block that holds it) over
the slots a plain prefill of the same prompts would give it (`batching.BatchLayout`), and
the tokens after it into a left-padded suffix block; `_gather` moves the runs on the
device, one shifted window per prompt and layer, so nothing is copied to or from the host.
`prefill._prefill_extend` then computes only the suffix.
"""

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from pau_jax.sampling import batching

_TRACES: collections.Counter = collections.Counter()


def trace_counts() -> dict[str, int]:
    """How many times the gather of reused runs was traced (compiled) so far."""
    return dict(_TRACES)


@dataclasses.dataclass(frozen=True)
class Reuse:
    """The arrays of a prefill on top of cached prefixes (see `prefill._prefill_extend`).

    Their slots are those of a plain prefill of the same prompts (`batching.BatchLayout`).
    """

    prefix_k: tuple[jax.Array, ...]  # L arrays [U, K, W, H], the reused runs
    prefix_v: tuple[jax.Array, ...]  # L arrays [U, K, H, W]
    prefix_mask: np.ndarray  # [U, W] bool, True on reused slots
    suffix_ids: np.ndarray  # [U, T] int32
    suffix_mask: np.ndarray  # [U, T] int32
    starts: np.ndarray  # [U] int32, reused prefix length of each prompt


def plan(distinct, matches, layout: batching.BatchLayout) -> Reuse:
    """The gathered prefixes and the suffix block of prompts of which some reuse a prefix.

    The prefill has the plain layout's width W (`layout.input_ids`) and slots
    (`batching.BatchLayout`); the suffix block is T slots, the suffix bucket
    (`batching.SUFFIX_BUCKET`) of the longest remaining part (at most W).

    Args:
      distinct: the call's distinct prompts (`layout.prompts`).
      matches: per prompt (entry, n): reuse the first n positions of the cache entry
        `entry` (its `block`, `row` and `start`); (None, 0) for none. Some n > 0.
      layout: the call's layout.
    """
    height, width = layout.input_ids.shape
    starts = np.zeros(height, np.int32)
    starts[: len(distinct)] = [n for _, n in matches]
    rest = [len(p) - 1 - n for p, (_, n) in zip(distinct, matches, strict=True)]
    suffix_width = min(batching.bucket_size(max(max(rest), 1), **batching.SUFFIX_BUCKET), width)
    suffix_ids = np.zeros((height, suffix_width), np.int32)
    suffix_mask = np.zeros((height, suffix_width), np.int32)
    prefix_mask = np.zeros((height, width), bool)
    # Per block (a `prefix_cache.Block`) the reused runs it holds: prompt u's first n tokens
    # go to [lo, lo + n).
    runs: dict[int, tuple[object, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for u, (prompt, (entry, n)) in enumerate(zip(distinct, matches, strict=True)):
        lo = width - (len(prompt) - 1)
        if n:
            prefix_mask[u, lo : lo + n] = True
            block = runs.setdefault(
                id(entry.block), (entry.block, *(np.zeros(height, np.int32) for _ in range(4)))
            )
            _, rows, offsets, first, end = block
            rows[u], offsets[u], first[u], end[u] = entry.row, entry.start - lo, lo, lo + n
        if rest[u]:
            suffix_ids[u, suffix_width - rest[u] :] = prompt[n:-1]
            suffix_mask[u, suffix_width - rest[u] :] = 1
    gathered = None
    for block, rows, offsets, first, end in runs.values():
        gathered = _gather(block.k, block.v, rows, offsets, first, end, gathered, width=width)
    return Reuse(*gathered, prefix_mask, suffix_ids, suffix_mask, starts)


@functools.partial(jax.jit, static_argnames=("width",))
def _gather(keys, values, rows, offsets, lo, hi, into=None, *, width):
    """Each prompt's reused run of a block, moved to its slots of a prefill of `width` slots.

    Output slot w of prompt u holds block slot w + offsets[u] of block row rows[u] for w in
    [lo[u], hi[u]), and `into` (zeros when None) elsewhere. One prompt at a time
    (`lax.map`): per layer a shifted window of one block row, a contiguous copy.

    Args:
      keys: L block arrays [B, K, S, H].
      values: L block arrays [B, K, H, S].
      rows, offsets, lo, hi: [U] int32.
      into: None or (L arrays [U, K, width, H], L arrays [U, K, H, width]) kept outside
        the runs (the runs of other blocks).
      width: the prefill's slots.

    Returns:
      (L arrays [U, K, width, H], L arrays [U, K, H, width]).
    """
    _TRACES["gather"] += 1
    slots = jnp.arange(width)

    def window(block_array, row, offset, slot_axis):
        # One block row shifted by `offset` slots; padding by `width` on both sides keeps
        # the window start (offset + width) in range.
        src = jax.lax.dynamic_index_in_dim(block_array, row, 0, keepdims=False)
        pad = [(0, 0)] * src.ndim
        pad[slot_axis] = (width, width)
        return jax.lax.dynamic_slice_in_dim(
            jnp.pad(src, pad), offset + width, width, axis=slot_axis
        )

    def one_prompt(args):
        row, offset, first, end, *kept = args
        run = (slots >= first) & (slots < end)

        def place(arrays, slot_axis, others):
            inside = run.reshape([width if a == slot_axis else 1 for a in range(3)])
            return tuple(
                jnp.where(inside, window(x, row, offset, slot_axis), others[i] if others else 0.0)
                for i, x in enumerate(arrays)
            )

        others_k, others_v = kept if kept else (None, None)
        return place(keys, 1, others_k), place(values, 2, others_v)

    xs = (rows, offsets, lo, hi) + (() if into is None else (tuple(into[0]), tuple(into[1])))
    return jax.lax.map(one_prompt, xs)
