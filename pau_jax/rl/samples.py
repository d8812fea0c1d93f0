"""Training sequences (prompt, sampled completion, sampler log-probs, advantage) and their batches.

``make_batch`` lays samples out as the learner's ``Batch`` in the layout of
``training.batch.left_pad``. Column ``t`` of ``sampler_logprobs`` scores the token in column ``t``,
as ``training.logprobs.token_logprobs`` does, so the completion's log-probs sit under the
completion's tokens and every other column is 0::

    attention_mask  0 0 1 1 1 1 1      (p = prompt, c = completion, . = padding)
    input_ids       . . p p c c c
    loss_mask       0 0 0 0 1 1 1
    sampler_logp    0 0 0 0 l l l

Rows added to reach a multiple of ``rows_multiple`` (e.g. the micro-batch size
or the data-parallel width) are all padding: zero attention, loss mask and
advantage, so they contribute nothing to the loss or its denominator.
"""

import dataclasses
import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from pau_jax.rl.learner import Batch
from pau_jax.training import batch as batch_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    """One training sequence: a prompt and one completion sampled from it.

    Attributes:
      prompt_ids: the prompt's token ids (at least one: the first token of a row
        is never scored).
      completion_ids: the sampled token ids (at least one), including any stop
        token the sampler kept.
      sampler_logprobs: one log-prob per completion token under the sampling
        distribution the learner compares against (``SampleOutput.plain_logprobs``
        for a learner at the rollout temperature).
      advantage: the sequence's advantage.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float]
    advantage: float


def _check(index: int, sample: Sample) -> None:
    where = f"sample {index}"
    if not isinstance(sample, Sample):
        raise TypeError(f"{where} is a {type(sample).__name__}, expected a samples.Sample")
    if len(sample.prompt_ids) == 0:
        raise ValueError(f"{where} has an empty prompt; a completion needs a token to follow")
    if len(sample.completion_ids) == 0:
        raise ValueError(f"{where} has an empty completion; drop it before batching")
    if len(sample.sampler_logprobs) != len(sample.completion_ids):
        raise ValueError(
            f"{where} has {len(sample.completion_ids)} completion ids but "
            f"{len(sample.sampler_logprobs)} sampler log-probs; pass one log-prob per token"
        )
    logprobs = np.asarray(sample.sampler_logprobs, np.float64)
    if not np.isfinite(logprobs).all() or (logprobs > 1e-6).any():
        raise ValueError(f"{where} has sampler log-probs that are not finite and <= 0")
    if not math.isfinite(float(sample.advantage)):
        raise ValueError(f"{where} has a non-finite advantage {sample.advantage}")
    ids = np.asarray(list(sample.prompt_ids) + list(sample.completion_ids))
    if ids.dtype.kind not in "iu" or (ids < 0).any():
        raise ValueError(f"{where} has token ids that are not non-negative integers")


def make_batch(
    samples: Sequence[Sample],
    *,
    pad_to_multiple: int = 8,
    rows_multiple: int = 1,
    pad_id: int = 0,
) -> Batch:
    """Left-pads samples into a learner ``Batch``.

    Args:
      samples: one or more ``Sample``.
      pad_to_multiple: T is the longest prompt + completion rounded up to a
        multiple of this.
      rows_multiple: B is the number of samples rounded up to a multiple of
        this; the extra rows are all padding.
      pad_id: token id written in padded positions.

    Returns:
      ``Batch`` with input_ids [B, T] int32, attention_mask [B, T] int32,
      loss_mask [B, T] float32, advantages [B] float32 and sampler_logprobs
      [B, T] float32.

    Raises:
      ValueError: no samples, bad multiples, or a malformed sample (empty
        prompt or completion, log-probs not one per completion token, ...).
    """
    if pad_to_multiple < 1 or rows_multiple < 1:
        raise ValueError(
            f"pad_to_multiple and rows_multiple must be >= 1, got {pad_to_multiple} and "
            f"{rows_multiple}"
        )
    if len(samples) == 0:
        raise ValueError("make_batch needs at least one sample")
    for index, sample in enumerate(samples):
        _check(index, sample)
    input_ids, attention, loss = batch_lib.left_pad(
        [s.prompt_ids for s in samples],
        [s.completion_ids for s in samples],
        pad_to_multiple=pad_to_multiple,
        rows_multiple=rows_multiple,
        pad_id=pad_id,
    )
    rows, length = input_ids.shape
    sampler = np.zeros((rows, length), np.float32)
    advantages = np.zeros(rows, np.float32)
    for row, sample in enumerate(samples):
        sampler[row, length - len(sample.completion_ids) :] = sample.sampler_logprobs
        advantages[row] = sample.advantage
    return Batch(
        input_ids=jnp.asarray(input_ids),
        attention_mask=jnp.asarray(attention),
        loss_mask=jnp.asarray(loss),
        advantages=jnp.asarray(advantages),
        sampler_logprobs=jnp.asarray(sampler),
    )
