"""Keys and values of earlier sequences, reused when a new prompt starts with one of them.

A multi-phase episode asks the model for one reply per phase, and each phase's prompt is
the conversation re-rendered from the episode's state: the same system prompt, function
header, examples and calls so far, then the newest call and the phase's instruction. Without
reuse, every phase re-encodes the whole prompt, so an episode's prefill work grows with the
square of its length. A `PrefixCache` keeps, for each recent sequence (a prompt and the
reply sampled after it), where the model's keys and values for its tokens are; a new
prompt is matched against all of them (longest common token prefix, as vLLM's automatic
prefix caching does, without block hashing) and only the tokens after the match are
prefilled (`sampling.generate(..., prefix_cache=...)`).

The keys and values stay on the device, in the final decode cache of the call that
computed them (a `Block`, shared by the entries of that call's rows): a row's prompt and
reply fill one contiguous run of its slots. A reusing call gathers each prompt's matched
run into the slots a plain prefill would give it (`prefix_reuse`); nothing is copied to or
from the host.
`batching.BatchLayout` states the slot layout of both.

The cache is bound to the model weights it was filled with: a call with different
parameter arrays (an optimizer step, new adapters) empties it. Least-recently-used entries
are dropped beyond `max_bytes`, each with the other entries of its block (a block's memory
counts once, for as long as an entry uses it).
"""

import collections
import dataclasses

import jax
import numpy as np

from pau_jax.sampling import batching, prefix_reuse


@dataclasses.dataclass(eq=False)
class Block:
    """Device keys and values of one call's rows (a decode cache, `kv_cache.KVCache` layout).

    Attributes:
      k: L arrays [B, K, S, H], rotated keys.
      v: L arrays [B, K, H, S], values (transposed).
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in self.k + self.v)

    @property
    def num_rows(self) -> int:
        return self.k[0].shape[0]

    @property
    def num_slots(self) -> int:
        return self.k[0].shape[2]

    def first_rows(self, m: int) -> "Block":
        """A block of rows [0, m) (a copy)."""
        return Block(tuple(k[:m] for k in self.k), tuple(v[:m] for v in self.v))


@dataclasses.dataclass(eq=False)
class Entry:
    """One cached sequence: its tokens and the run of a block's slots holding their keys.

    Attributes:
      tokens: [n] int32 ids.
      block: the block holding their keys and values.
      row: the block row.
      start: the slot of token 0; token i is in slot start + i.
    """

    tokens: np.ndarray
    block: Block
    row: int
    start: int

    @property
    def keys(self) -> np.ndarray:
        """[L, K, n, H] the tokens' keys, read back from the device."""
        run = slice(self.start, self.start + len(self.tokens))
        return np.stack([np.asarray(k[self.row, :, run]) for k in self.block.k])

    @property
    def values(self) -> np.ndarray:
        """[L, K, H, n] the tokens' values (transposed), read back from the device."""
        run = slice(self.start, self.start + len(self.tokens))
        return np.stack([np.asarray(v[self.row, :, :, run]) for v in self.block.v])


class PrefixCache:
    """Recent sequences' keys and values, matched by longest common token prefix.

    Args:
      max_bytes: memory budget of the entries (their blocks and token ids); least
        recently used entries are dropped beyond it.
      min_reuse: a match shorter than this many tokens is not reused (the prompt is
        prefilled whole); reusing a handful of tokens saves less than it costs.
      share_within_call: prefill a prefix that several prompts of one call share once,
        before them (`warm_prompts`), so each of them prefills only what follows it: a
        grader's instructions ahead of every item, an agent's system prompt ahead of
        every task. Off: prompts of one call reuse only what earlier calls cached.
    """

    def __init__(self, max_bytes: int, min_reuse: int = 32, *, share_within_call: bool = True):
        if max_bytes < 0 or min_reuse < 1:
            raise ValueError(
                f"max_bytes must be >= 0 and min_reuse >= 1, got {max_bytes} and {min_reuse}"
            )
        self.max_bytes = max_bytes
        self.min_reuse = min_reuse
        self.share_within_call = share_within_call
        self._entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()
        self._next_id = 0
        self._weights: list | None = None
        self._dtype = None
        self.stats = collections.Counter()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes held: each distinct block once, plus the entries' token ids."""
        blocks = {id(e.block): e.block.nbytes for e in self._entries.values()}
        return sum(blocks.values()) + sum(e.tokens.nbytes for e in self._entries.values())

    def clear(self) -> None:
        """Drops every entry (and with them the blocks)."""
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

    def warm_prompts(self, prompts) -> list[list[int]]:
        """Prompts whose prefill caches the prefixes `prompts` share beyond what is cached.

        A prefix counts when at least two prompts start with it, it is at least `min_reuse`
        tokens longer than this cache's match for it, and no longer shared prefix extends
        it (a match against a longer entry covers the shorter prefix too). Each warm prompt
        is the prefix plus the token after it, since a prefill caches all but the last
        token. Empty when `share_within_call` is off.

        Args:
          prompts: the call's distinct prompts (token ids).
        """
        if not self.share_within_call or len(prompts) < 2:
            return []
        found = {}
        for prefix, nxt in shared_prefixes(prompts, self.min_reuse):
            _, cached = self.match(prefix + [nxt])
            if len(prefix) - cached >= self.min_reuse:
                found[tuple(prefix)] = prefix + [nxt]
        return list(found.values())

    def add(self, tokens, block: Block, row: int, start: int) -> bool:
        """Stores one sequence; drops entries it extends and the oldest beyond the budget.

        Args:
          tokens: [n] ids.
          block: the block holding their keys and values.
          row: the block row.
          start: the slot of the first token (the n tokens fill [start, start + n)).

        Returns:
          Whether the entry was stored (False when its block alone exceeds the budget).
        """
        entry = Entry(np.asarray(tokens, np.int32), block, int(row), int(start))
        n = len(entry.tokens)
        if not (0 <= entry.row < block.num_rows and 0 <= entry.start <= block.num_slots - n):
            raise ValueError(
                f"{n} tokens from slot {start} of row {row} do not fit a block of "
                f"{block.num_rows} rows x {block.num_slots} slots"
            )
        if block.nbytes + entry.tokens.nbytes > self.max_bytes:
            return False
        for key in [
            k
            for k, e in self._entries.items()
            if len(e.tokens) <= n and np.array_equal(e.tokens, entry.tokens[: len(e.tokens)])
        ]:
            del self._entries[key]
        self._entries[self._next_id] = entry
        self._next_id += 1
        while self.nbytes > self.max_bytes:
            # A block's memory is freed only with its last entry: the least recently used
            # entry goes with every other entry of its block.
            _, dropped = self._entries.popitem(last=False)
            for key in [k for k, e in self._entries.items() if e.block is dropped.block]:
                del self._entries[key]
            self.stats["evictions"] += 1
        return True

    def plan_reuse(self, layout: batching.BatchLayout) -> prefix_reuse.Reuse | None:
        """Matches each distinct prompt against the cache; None when no prompt reuses anything.

        Args:
          layout: the call's layout; its `prompts` are matched.

        Returns:
          The gathered prefixes and the suffix block (`prefix_reuse.plan`), or None.
        """
        distinct = layout.prompts
        matches = [self.match(p) for p in distinct]
        self.stats["lookups"] += len(distinct)
        self.stats["hits"] += sum(n > 0 for _, n in matches)
        if not any(n for _, n in matches):
            return None
        return prefix_reuse.plan(distinct, matches, layout)

    def store_rows(self, device_cache, layout: batching.BatchLayout, tokens, lengths) -> None:
        """Adds each row's prompt and reply to the cache, as runs of the final decode cache.

        The reply's last token is left out (its keys were never computed); the runs stay
        on the device, in the slots `batching.BatchLayout` gives them. Beyond the budget
        only the first rows that fit are kept.

        Args:
          device_cache: the final decode cache (`kv_cache.KVCache`, B rows).
          layout: the call's layout.
          tokens: [B, N] the sampled tokens.
          lengths: [B] how many of them each row generated.
        """
        width = layout.input_ids.shape[1]
        block = Block(tuple(device_cache.k), tuple(device_cache.v))
        sequences = []
        for row in range(layout.num_rows):
            prompt, length = layout.prompts[int(layout.row_source[row])], int(lengths[row])
            ids = np.asarray(list(prompt) + tokens[row, : length - 1].tolist(), np.int32)
            sequences.append((ids, width - (len(prompt) - 1)))
        ids_bytes = np.cumsum([ids.nbytes for ids, _ in sequences])
        if block.nbytes + ids_bytes[-1] > self.max_bytes:
            # Only the first rows the budget can hold are kept (their rows copied out).
            held = block.nbytes // block.num_rows * np.arange(1, len(sequences) + 1) + ids_bytes
            fit = int((held <= self.max_bytes).sum())
            if not fit:
                return
            block, sequences = block.first_rows(fit), sequences[:fit]
        for row, (ids, start) in enumerate(sequences):
            self.add(ids, block, row, start)


def shared_prefixes(prompts, min_len: int) -> list[tuple[list[int], int]]:
    """The longest prefixes of at least `min_len` tokens that two or more prompts share.

    Sorted, two prompts sharing a prefix are neighbours or have neighbours between them
    that share it too, so the longest prefixes shared by neighbours are all there are. A
    prefix that a longer one found extends is left out. Each stops one token before the
    shorter prompt's end (its last token is fed to the decode, never cached).

    Args:
      prompts: token-id sequences.
      min_len: the shortest prefix returned.

    Returns:
      (prefix, the token after it in one of the prompts) pairs.
    """
    ordered = sorted(tuple(p) for p in prompts)
    found: dict[tuple[int, ...], int] = {}
    for a, b in zip(ordered, ordered[1:]):
        limit = min(len(a), len(b)) - 1
        x, y = np.asarray(a[:limit], np.int64), np.asarray(b[:limit], np.int64)
        differ = np.flatnonzero(x != y)
        n = int(differ[0]) if len(differ) else limit
        if n >= min_len:
            found.setdefault(a[:n], a[n])
    keys = sorted(found, key=len, reverse=True)
    kept = [k for i, k in enumerate(keys) if not any(m[: len(k)] == k for m in keys[:i])]
    return [(list(k), found[k]) for k in kept]
