"""Keys and values of earlier sequences, reused when a new prompt starts with one of them.

A multi-phase episode asks the model for one reply per phase, and each phase's prompt is
the conversation re-rendered from the episode's state: the same system prompt, function
header, examples and calls so far, then the newest call and the phase's instruction. Without
reuse, every phase re-encodes the whole prompt, so an episode's prefill work grows with the
square of its length. A `PrefixCache` keeps, for each recent sequence (a prompt and the
reply sampled after it), the keys and values the model computed for its tokens; a new
prompt is matched against all of them (longest common token prefix, as vLLM's automatic
prefix caching does, without block hashing) and only the tokens after the match are
prefilled (`sampling.generate(..., prefix_cache=...)`).

Entries live on the host as numpy arrays in the cache layout of `kv_cache.KVCache`, keys
[L, K, n, H] and values [L, K, H, n]. The cache is bound to the model weights it was filled
with: a call with different parameter arrays (an optimizer step, new adapters) empties it.
Least-recently-used entries are dropped beyond `max_bytes`.
"""

import collections
import dataclasses

import jax
import numpy as np

from pau_jax.sampling import batching


@dataclasses.dataclass
class Entry:
    """One cached sequence.

    Attributes:
      tokens: [n] int32 ids whose keys and values are held.
      keys: [L, K, n, H] rotated keys.
      values: [L, K, H, n] values (transposed, the cache layout).
    """

    tokens: np.ndarray
    keys: np.ndarray
    values: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.keys.nbytes + self.values.nbytes


class PrefixCache:
    """Recent sequences' keys and values, matched by longest common token prefix.

    Args:
      max_bytes: memory budget of the entries; least recently used ones are dropped.
      min_reuse: a match shorter than this many tokens is not reused (the prompt is
        prefilled whole); reusing a handful of tokens saves less than it costs.
    """

    def __init__(self, max_bytes: int = 2 << 30, min_reuse: int = 32):
        if max_bytes < 0 or min_reuse < 1:
            raise ValueError(
                f"max_bytes must be >= 0 and min_reuse >= 1, got {max_bytes} and {min_reuse}"
            )
        self.max_bytes = max_bytes
        self.min_reuse = min_reuse
        self._entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()
        self._next_id = 0
        self._weights: list | None = None
        self._dtype = None
        self.stats = collections.Counter()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def clear(self) -> None:
        """Drops every entry."""
        self._entries.clear()

    def bind(self, state, dtype) -> None:
        """Empties the cache unless `state`'s arrays and `dtype` are those it was filled with.

        Args:
          state: the model's parameter state (any pytree of arrays).
          dtype: the dtype of the cached keys and values.
        """
        leaves = jax.tree.leaves(state)
        same = (
            self._weights is not None
            and self._dtype == np.dtype(dtype)
            and len(leaves) == len(self._weights)
            and all(a is b for a, b in zip(leaves, self._weights, strict=True))
        )
        if not same:
            if self._entries:
                self.stats["invalidations"] += 1
            self.clear()
        # Holding the arrays keeps their ids unique while the cache is bound to them.
        self._weights, self._dtype = leaves, np.dtype(dtype)

    def match(self, prompt) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `prompt`, and that prefix's length.

        At most len(prompt) - 1 tokens are matched (the last prompt token is always fed to
        the first decode step). Matches shorter than `min_reuse` give (None, 0).

        Args:
          prompt: token ids.

        Returns:
          (entry, n): reuse the first n positions of `entry`.
        """
        ids = np.asarray(prompt, np.int32)
        limit = len(ids) - 1
        best, best_len = None, 0
        for key, entry in self._entries.items():
            m = min(limit, len(entry.tokens))
            if m <= best_len:
                continue
            differ = np.flatnonzero(entry.tokens[:m] != ids[:m])
            n = int(differ[0]) if len(differ) else m
            if n > best_len:
                best, best_len = key, n
        if best is None or best_len < self.min_reuse:
            return None, 0
        self._entries.move_to_end(best)
        return self._entries[best], best_len

    def add(self, tokens, keys: np.ndarray, values: np.ndarray) -> None:
        """Stores one sequence; drops entries it extends and the oldest beyond the budget.

        Args:
          tokens: [n] ids.
          keys: [L, K, n, H].
          values: [L, K, H, n].
        """
        entry = Entry(np.asarray(tokens, np.int32), keys, values)
        n = len(entry.tokens)
        if keys.shape[2] != n or values.shape[3] != n:
            raise ValueError(
                f"{n} tokens but keys {keys.shape} / values {values.shape} (expect n at "
                "axis 2 of keys and axis 3 of values)"
            )
        if entry.nbytes > self.max_bytes:
            return
        for key in [
            k
            for k, e in self._entries.items()
            if len(e.tokens) <= n and np.array_equal(e.tokens, entry.tokens[: len(e.tokens)])
        ]:
            del self._entries[key]
        self._entries[self._next_id] = entry
        self._next_id += 1
        total = self.nbytes
        while total > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            total -= dropped.nbytes
            self.stats["evictions"] += 1


@dataclasses.dataclass(frozen=True)
class Reuse:
    """Host arrays of a prefill on top of cached prefixes (see `sampler._prefill_extend`)."""

    prefix_k: np.ndarray  # [L, U, K, P + T, H], the last T slots empty
    prefix_v: np.ndarray  # [L, U, K, H, P + T]
    prefix_mask: np.ndarray  # [U, P + T] bool
    suffix_ids: np.ndarray  # [U, T] int32
    suffix_mask: np.ndarray  # [U, T] int32
    starts: np.ndarray  # [U] int32, cached prefix length of each prompt
    width: int  # P + T, the slot of decode step 0

    @property
    def prefix_width(self) -> int:
        """P, the slots of the cached prefixes."""
        return self.width - self.suffix_ids.shape[1]


def plan_reuse(cache, distinct, layout, config, dtype) -> "Reuse | None":
    """Matches each distinct prompt against `cache`; None when no prompt reuses anything.

    The prefilled width W = P + T is a prompt-length bucket (so the decode programs are
    those of a plain call) with T the suffix bucket (`batching.SUFFIX_BUCKET`) of the
    longest remaining part.
    """
    matches = [cache.match(p) for p in distinct]
    cache.stats["lookups"] += len(distinct)
    cache.stats["hits"] += sum(n > 0 for _, n in matches)
    if not any(n for _, n in matches):
        return None
    height = layout.input_ids.shape[0]
    starts = np.zeros(height, np.int32)
    starts[: len(distinct)] = [n for _, n in matches]
    rest = [len(p) - 1 - n for p, (_, n) in zip(distinct, matches, strict=True)]
    suffix_width = batching.bucket_size(max(max(rest), 1), **batching.SUFFIX_BUCKET)
    width = batching.bucket_size(int(starts.max()) + suffix_width, **batching.PROMPT_BUCKET)
    prefix_width = width - suffix_width
    layers, heads, head_dim = (
        config.num_hidden_layers,
        config.num_key_value_heads,
        config.head_dim,
    )
    # P prefix slots and T empty ones, where the prefill writes the suffix.
    prefix_k = np.zeros((layers, height, heads, width, head_dim), dtype)
    prefix_v = np.zeros((layers, height, heads, head_dim, width), dtype)
    prefix_mask = np.zeros((height, width), bool)
    suffix_ids = np.zeros((height, suffix_width), np.int32)
    suffix_mask = np.zeros((height, suffix_width), np.int32)
    for u, (prompt, (entry, n)) in enumerate(zip(distinct, matches, strict=True)):
        if n:
            cached = slice(prefix_width - n, prefix_width)
            prefix_k[:, u, :, cached] = entry.keys[:, :, :n]
            prefix_v[:, u, :, :, cached] = entry.values[:, :, :, :n]
            prefix_mask[u, cached] = True
        if rest[u]:
            suffix_ids[u, suffix_width - rest[u] :] = prompt[n:-1]
            suffix_mask[u, suffix_width - rest[u] :] = 1
    return Reuse(prefix_k, prefix_v, prefix_mask, suffix_ids, suffix_mask, starts, width)


def store_rows(cache, device_cache, layout, distinct, starts, prefix_width, width, tokens,
                lengths) -> None:  # fmt: skip
    """Adds each row's prompt and reply (all but its last token, whose keys were never
    computed) to `cache`, read from the final decode cache.

    A row's prompt occupies slots [P - p, P) (its reused prefix, p tokens) and
    [W - r, W) (the r tokens prefilled after it), then its last prompt token and reply
    slots [W, W + length).
    """
    first = device_cache.k[0]
    per_token = 2 * len(device_cache.k) * first.shape[1] * first.shape[3] * first.dtype.itemsize
    # Only the rows the budget can hold leave the device (all of them, usually).
    rows, total = [], 0
    for row in range(layout.num_rows):
        size = (len(distinct[int(layout.row_source[row])]) + int(lengths[row])) * per_token
        if total + size > cache.max_bytes:
            break
        rows.append(row)
        total += size
    if not rows:
        return
    # `rows` is 0 .. m - 1. On the CPU backend np.asarray reads the cache in place.
    if len(rows) == layout.num_rows or jax.default_backend() == "cpu":
        keys = [np.asarray(k) for k in device_cache.k]
        values = [np.asarray(v) for v in device_cache.v]
    else:
        keys = [np.asarray(k[: len(rows)]) for k in device_cache.k]
        values = [np.asarray(v[: len(rows)]) for v in device_cache.v]
    for i, row in enumerate(rows):
        u = int(layout.row_source[row])
        prompt, n, length = distinct[u], int(starts[u]), int(lengths[row])
        rest = len(prompt) - 1 - n
        # Two contiguous runs of slots: the reused prefix, then the rest of the sequence,
        # copied once into the entry's arrays.
        head, tail = slice(prefix_width - n, prefix_width), slice(width - rest, width + length)
        size = n + rest + length
        _, heads, _, head_dim = first.shape
        entry_k = np.empty((len(keys), heads, size, head_dim), first.dtype)
        entry_v = np.empty((len(values), heads, head_dim, size), first.dtype)
        for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
            entry_k[layer, :, :n], entry_k[layer, :, n:] = k[i][:, head], k[i][:, tail]
            entry_v[layer, ..., :n], entry_v[layer, ..., n:] = v[i][..., head], v[i][..., tail]
        cache.add(list(prompt) + tokens[row, : length - 1].tolist(), entry_k, entry_v)
