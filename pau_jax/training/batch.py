"""Prompt + completion rows, left-padded to few shapes: the layout every loss reads.

Each row is the prompt followed by the completion, left-padded to a common
length ``T`` rounded up to a multiple of ``pad_to_multiple`` (so that only a few
shapes compile); rows added to reach a multiple of ``rows_multiple`` (the
micro-batch size, the data-parallel width) are all padding::

    attention_mask  0 0 1 1 1 1 1      (p = prompt, c = completion, . = padding)
    input_ids       . . p p c c c
    loss_mask       0 0 0 0 1 1 1

``micro_batches`` plans micro-batches that each pad to their own length: rows
sorted longest first, ``size`` rows at a time, each micro-batch padded to the
bucket of its longest row (``bucket_length``: few distinct lengths, so few
compiled shapes), never beyond the batch's longest row.
"""

from collections.abc import Sequence

import numpy as np


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def left_pad(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    pad_to_multiple: int,
    rows_multiple: int,
    pad_id: int = 0,
    length: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids [B, T] int32, attention_mask [B, T] int32, loss_mask [B, T] float32).

    The loss mask is 1 on each row's completion, which ends at column T - 1. T is
    ``length`` when given (at least the longest row), else the longest row rounded up
    to a multiple of ``pad_to_multiple``.

    Raises:
      ValueError: no rows, prompts and completions of different counts, or bad multiples.
    """
    if pad_to_multiple < 1 or rows_multiple < 1:
        raise ValueError(
            f"pad_to_multiple and rows_multiple must be >= 1, got {pad_to_multiple} and "
            f"{rows_multiple}"
        )
    if not prompts or len(prompts) != len(completions):
        raise ValueError(
            f"need one completion per prompt and at least one row, got {len(prompts)} prompts "
            f"and {len(completions)} completions"
        )
    rows = round_up(len(prompts), rows_multiple)
    longest = max(len(p) + len(c) for p, c in zip(prompts, completions))
    if length is not None and length < longest:
        raise ValueError(f"length {length} is shorter than the longest row ({longest} tokens)")
    length = length or round_up(longest, pad_to_multiple)
    input_ids = np.full((rows, length), pad_id, np.int32)
    attention = np.zeros((rows, length), np.int32)
    loss = np.zeros((rows, length), np.float32)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        start = length - len(prompt) - len(completion)
        input_ids[row, start:] = list(prompt) + list(completion)
        attention[row, start:] = 1
        loss[row, length - len(completion) :] = 1.0
    return input_ids, attention, loss


def bucket_length(n: int, multiple: int) -> int:
    """The smallest of ``multiple`` x (1, 2, 3, 4, 6, 8, 12, 16, ...) that holds ``n`` tokens."""
    units, power = -(-n // multiple), 1
    while True:
        for bucket in (power, power * 3 // 2):  # 2^k and 1.5 x 2^k: at most a third is padding
            if bucket >= units:
                return bucket * multiple
        power *= 2


def micro_batches(
    lengths: Sequence[int], *, size: int, pad_to_multiple: int
) -> list[tuple[list[int], int]]:
    """(row indices, padded length) per micro-batch: rows longest first, ``size`` at a time.

    A micro-batch's length is the bucket of its longest row (``bucket_length``), capped
    at the batch's longest row rounded up to ``pad_to_multiple`` (one batch's length), so
    it never pads more than one batch and compiles few shapes. The last micro-batch may
    hold fewer than ``size`` rows (its padding rows are the caller's).
    """
    if size < 1 or pad_to_multiple < 1:
        raise ValueError(f"size and pad_to_multiple must be >= 1, got {size}, {pad_to_multiple}")
    if not lengths:
        raise ValueError("micro_batches needs at least one row")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    cap = round_up(max(lengths), pad_to_multiple)
    plan = []
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        plan.append((rows, min(bucket_length(lengths[rows[0]], pad_to_multiple), cap)))
    return plan
