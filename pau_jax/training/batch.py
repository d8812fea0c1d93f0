"""Prompt + completion rows, left-padded to few shapes: the layout every loss reads.

Each row is the prompt followed by the completion, left-padded to a common
length ``T`` rounded up to a multiple of ``pad_to_multiple`` (so that only a few
shapes compile); rows added to reach a multiple of ``rows_multiple`` (the
micro-batch size, the data-parallel width) are all padding::

    attention_mask  0 0 1 1 1 1 1      (p = prompt, c = completion, . = padding)
    input_ids       . . p p c c c
    loss_mask       0 0 0 0 1 1 1
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids [B, T] int32, attention_mask [B, T] int32, loss_mask [B, T] float32).

    The loss mask is 1 on each row's completion, which ends at column T - 1.

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
    length = round_up(max(len(p) + len(c) for p, c in zip(prompts, completions)), pad_to_multiple)
    input_ids = np.full((rows, length), pad_id, np.int32)
    attention = np.zeros((rows, length), np.int32)
    loss = np.zeros((rows, length), np.float32)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        start = length - len(prompt) - len(completion)
        input_ids[row, start:] = list(prompt) + list(completion)
        attention[row, start:] = 1
        loss[row, length - len(completion) :] = 1.0
    return input_ids, attention, loss
