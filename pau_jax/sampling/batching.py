"""Host-side batch layout for generation: distinct prompts, left padding and shape buckets.

Shapes given to the jitted prefill and decode are rounded up to buckets so that calls with
varying prompt lengths, batch sizes and token budgets reuse compiled code: powers of two
from a minimum up to a granularity, then multiples of that granularity. The KV cache grows
in length buckets too (`cache_rooms`), so early decode steps attend over fewer slots.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np

PROMPT_BUCKET = dict(minimum=32, granularity=512)
# The part of a prompt prefilled after a cached prefix: usually one reply and a new turn,
# a few hundred tokens, so finer steps beyond 64 waste fewer padded tokens.
SUFFIX_BUCKET = dict(minimum=32, granularity=64)
NEW_TOKENS_BUCKET = dict(minimum=16, granularity=512)
BATCH_BUCKET = dict(minimum=1, granularity=64)
# The first cache holds at least this many new tokens, and at least W / FIRST_ROOM_FRACTION.
MIN_ROOM = 16
FIRST_ROOM_FRACTION = 4


def bucket_size(n: int, *, minimum: int, granularity: int) -> int:
    """Rounds `n` up to its bucket.

    Args:
      n: the size needed (>= 0).
      minimum: smallest bucket.
      granularity: powers of two are used up to this size, multiples of it beyond.

    Returns:
      The bucket size, >= n.
    """
    if n <= granularity:
        return max(minimum, 1 << max(0, n - 1).bit_length())
    return -(-n // granularity) * granularity


def cache_rooms(width: int, buffer_len: int) -> tuple[int, ...]:
    """New-token room of each cache length the decode loop runs with, smallest first.

    The cache starts with W prompt slots plus room for the first decode steps and doubles
    that room until it holds the whole budget N. The first room is at least a quarter of
    W, so at most about a sixth of the attention work falls on empty slots while the number
    of cache lengths (compiled decode programs) stays logarithmic in N / W.

    Args:
      width: W, the prefilled (bucketed) prompt width.
      buffer_len: N, the bucketed new-token budget.

    Returns:
      Increasing rooms; the last is N. Each is a power of two or N.
    """
    wanted = max(MIN_ROOM, -(-width // FIRST_ROOM_FRACTION))
    rooms = [min(1 << (wanted - 1).bit_length(), buffer_len)]
    while rooms[-1] < buffer_len:
        rooms.append(min(2 * rooms[-1], buffer_len))
    return tuple(rooms)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchLayout:
    """Bucketed arrays for one generation call, and the slot layout of its KV cache.

    Slot layout (of the prefill, prefix reuse, decode and prefix cache). Row b of the
    cache is decode row b, a copy of prompt ``row_source[b]``'s prefill. Prompt u of n
    tokens has its first n - 1 tokens in slots [W - n + 1, W), right-aligned at the
    prompt-bucket width W (left padding before them). Decode step i feeds one token into
    slot W + i: step 0 the last prompt token, step i > 0 the token sampled at step i - 1.
    A row's prompt and its first m reply tokens thus fill one contiguous run of slots,
    [W - n + 1, W + m + 1).

    Prefix reuse (``prefix_cache.PrefixCache.plan_reuse``) gives the same slots: prompt u's
    first ``starts[u]`` tokens are gathered from cached runs into
    [W - n + 1, W - n + 1 + starts[u]), and the rest of the prompt but its last token is a
    left-padded block of T slots, [W - T, W), whose padding may lie over reused or empty
    slots; only its real tokens are written (``Decoder.decode(overlay=True)``). A call with
    reuse therefore runs the decode programs and cache sizes of a call without it. After
    decoding, ``PrefixCache.store_rows`` records each row's prompt and reply but the
    reply's last token (whose keys were never computed): the run [W - n + 1, W + length).

    Attributes:
      input_ids: [U, W] int32 distinct prompts without their last token, left-padded
        (U, W bucketed; W is the bucket of the longest prompt).
      mask: [U, W] int32, 1 on prompt tokens.
      row_source: [B] int32 index into the U prompts for each decode row (B bucketed).
      last_tokens: [B] int32 last prompt token of each decode row.
      prompt_lens: [B] int32 prompt length of each decode row.
      active: [B] bool, False on rows added only to fill the batch bucket.
      num_rows: number of real decode rows (prompts x samples).
      num_distinct: number of distinct prompts (prefilled once each).
      prompts: the distinct prompts, in the order of the U rows of `input_ids`.
    """

    input_ids: np.ndarray
    mask: np.ndarray
    row_source: np.ndarray
    last_tokens: np.ndarray
    prompt_lens: np.ndarray
    active: np.ndarray
    num_rows: int
    num_distinct: int
    prompts: tuple[tuple[int, ...], ...] = ()

    @property
    def rows_are_prompts(self) -> bool:
        """Whether decode row b is prompt b for every b (nothing to copy between them)."""
        return len(self.row_source) == len(self.input_ids) and bool(
            (self.row_source == np.arange(len(self.row_source))).all()
        )


def prompts_as_lists(prompts, prompt_mask=None) -> list[list[int]]:
    """Normalises prompts to a list of token-id lists.

    Args:
      prompts: a sequence of token-id sequences, or a [B, T] integer array.
      prompt_mask: with an array, [B, T] with 1 on real tokens (any padding side);
        omitted means every position is real.

    Returns:
      One list of ids per prompt.
    """
    if isinstance(prompts, np.ndarray) or hasattr(prompts, "__array__"):
        ids = np.asarray(prompts)
        if ids.ndim != 2:
            raise ValueError(f"prompt array must be [B, T], got shape {ids.shape}")
        mask = np.ones(ids.shape, bool) if prompt_mask is None else np.asarray(prompt_mask) != 0
        if mask.shape != ids.shape:
            raise ValueError(f"prompt_mask shape {mask.shape} differs from prompts {ids.shape}")
        return [[int(t) for t in row[m]] for row, m in zip(ids, mask)]
    if prompt_mask is not None:
        raise ValueError("prompt_mask is only for [B, T] arrays; pass lists without a mask")
    return [[int(t) for t in prompt] for prompt in prompts]


def layout_batch(prompts: Sequence[Sequence[int]], n_samples: int, pad_id: int = 0) -> BatchLayout:
    """Deduplicates prompts, left-pads all but their last token and maps decode rows to them.

    Decode rows are prompt-major: prompt i's samples are rows i*G .. i*G+G-1.

    Args:
      prompts: token-id lists, each non-empty.
      n_samples: G, samples per prompt.
      pad_id: id placed in padding positions (masked out).

    Returns:
      The bucketed `BatchLayout`.
    """
    if not prompts:
        raise ValueError("prompts is empty; pass at least one prompt")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    distinct: dict[tuple[int, ...], int] = {}
    sources = []
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        sources.append(distinct.setdefault(tuple(prompt), len(distinct)))
    num_distinct = len(distinct)
    num_rows = len(prompts) * n_samples
    width = bucket_size(max(map(len, distinct)) - 1, **PROMPT_BUCKET)
    height = bucket_size(num_distinct, **BATCH_BUCKET)
    rows = bucket_size(num_rows, **BATCH_BUCKET)

    input_ids = np.full((height, width), pad_id, np.int32)
    mask = np.zeros((height, width), np.int32)
    lengths = np.zeros(height, np.int32)
    last = np.zeros(height, np.int32)
    for prompt, u in distinct.items():
        head = len(prompt) - 1
        input_ids[u, width - head :] = prompt[:-1]
        mask[u, width - head :] = 1
        lengths[u] = len(prompt)
        last[u] = prompt[-1]
    # Rows that only fill a bucket repeat prompt 0.
    for array in (input_ids, mask, lengths, last):
        array[num_distinct:] = array[0]

    row_source = np.zeros(rows, np.int32)
    row_source[:num_rows] = np.repeat(np.asarray(sources, np.int32), n_samples)
    active = np.arange(rows) < num_rows
    return BatchLayout(
        input_ids=input_ids,
        mask=mask,
        row_source=row_source,
        last_tokens=last[row_source],
        prompt_lens=lengths[row_source],
        active=active,
        num_rows=num_rows,
        num_distinct=num_distinct,
        prompts=tuple(distinct),
    )
