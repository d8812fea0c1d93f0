"""Training sequences (prompt, sampled completion, sampler log-probs, advantage) and their batches.

A ``Sample`` is one phase of an episode: its prompt and its reply. An
``EpisodeSample`` is a whole episode in one row (``episode_sample``, when every
phase's prompt is a token prefix of the next, as in a multi-turn conversation of a
local policy): the first prompt, then every reply and every appended turn, the
replies in the loss with their own phase's advantage and the appended turns out
of it; it costs one forward and backward of the episode's final length where one
row per phase costs about half as many as it has phases.

``make_batch`` lays samples out as the learner's ``Batch`` in the layout of
``training.batch.left_pad``. Column ``t`` of ``sampler_logprobs`` scores the token in column ``t``,
as ``training.logprobs.token_logprobs`` does, so the completion's log-probs sit under the
completion's tokens and every other column is 0::

    attention_mask  0 0 1 1 1 1 1 1 1  (p = prompt, c = completion, u = appended turn)
    input_ids       . . p p c c u u c  (. = padding; one Sample has no u)
    loss_mask       0 0 0 0 1 1 0 0 1
    sampler_logp    0 0 0 0 l l 0 0 l

``sequence_tokens`` gives each loss token the token count of its phase and
``sequences`` each row's phases, so every GRPO aggregation scores an episode row as
it scores its phases one row each (``grpo``). ``make_micro_batches`` orders rows by
length and pads each micro-batch to its own length bucket
(``training.batch.micro_batches``).

Rows added to reach a multiple of ``rows_multiple`` (e.g. the micro-batch size
or the data-parallel width) are all padding: zero attention, loss mask and
advantage, so they contribute nothing to the loss or its denominator.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

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
      masks: per completion token, the packed set of tokens a structured-decoding mask
        allowed it from (`sampling.token_mask.effective_masks`; None: every token), so
        the learner scores it under the same masked policy; empty: no mask anywhere.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float]
    advantage: float
    masks: Sequence[np.ndarray | None] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeSample:
    """A whole episode as one training row.

    Attributes:
      prompt_ids: the first phase's prompt ids.
      completion_ids: everything after it: each phase's reply, then the turn appended
        before the next phase (the reply's end-of-turn token when the sampler did not
        write it, the next user message, the generation prompt).
      sampler_logprobs: per completion token, its sampler log-prob (0 on appended tokens).
      phases: per completion token, the phase (from 1) whose reply it is; 0 on appended
        tokens, which are out of the loss.
      advantages: per phase, its advantage.
      masks: per completion token, its mask as ``Sample.masks`` (None on appended tokens);
        empty: no mask anywhere.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float]
    phases: list[int]
    advantages: list[float]
    masks: Sequence[np.ndarray | None] = ()


def episode_sample(replies: Sequence[Any], advantages: Sequence[float]) -> EpisodeSample | None:
    """One row for an episode whose every prompt extends the previous prompt and reply.

    Args:
      replies: per phase, the actor's reply with ``prompt_ids``, ``token_ids`` and
        ``logprobs`` (``LocalPolicy``'s ``Completion``).
      advantages: per phase, its advantage.

    Returns:
      The episode's ``EpisodeSample``, or None when a phase's prompt does not start with
      the previous prompt and reply (fresh conversations): then train one row per phase.
    """
    if len(replies) != len(advantages) or not replies:
        raise ValueError(f"{len(replies)} replies and {len(advantages)} advantages; pass one each")
    ids = [int(i) for i in replies[0].prompt_ids]
    first = len(ids)
    logprobs, phases, masks = [], [], []
    for phase, reply in enumerate(replies, 1):
        prompt = reply.prompt_ids
        if len(prompt) < len(ids) or list(prompt[: len(ids)]) != ids:
            return None
        appended = [int(i) for i in prompt[len(ids) :]]
        tokens = [int(i) for i in reply.token_ids]
        ids += appended + tokens
        logprobs += [0.0] * len(appended) + [float(x) for x in reply.logprobs]
        phases += [0] * len(appended) + [phase] * len(tokens)
        masks += [None] * len(appended) + list(reply_masks(reply))
    return EpisodeSample(
        prompt_ids=ids[:first],
        completion_ids=ids[first:],
        sampler_logprobs=logprobs,
        phases=phases,
        advantages=[float(a) for a in advantages],
        masks=masks if any(m is not None for m in masks) else (),
    )


def reply_masks(reply) -> list[np.ndarray | None]:
    """Per token of a reply, its structured-decoding mask (``Completion.masks``; None: none)."""
    masks = list(getattr(reply, "masks", ()) or ())
    return masks or [None] * len(reply.token_ids)


def _check(index: int, sample: Sample | EpisodeSample) -> None:
    where = f"sample {index}"
    if not isinstance(sample, (Sample, EpisodeSample)):
        raise TypeError(
            f"{where} is a {type(sample).__name__}, expected a samples.Sample or EpisodeSample"
        )
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
    if isinstance(sample, EpisodeSample):
        _check_phases(where, sample)
    elif not math.isfinite(float(sample.advantage)):
        raise ValueError(f"{where} has a non-finite advantage {sample.advantage}")
    ids = np.asarray(list(sample.prompt_ids) + list(sample.completion_ids))
    if ids.dtype.kind not in "iu" or (ids < 0).any():
        raise ValueError(f"{where} has token ids that are not non-negative integers")


def _check_phases(where: str, sample: EpisodeSample) -> None:
    phases = np.asarray(sample.phases)
    if len(phases) != len(sample.completion_ids):
        raise ValueError(
            f"{where} has {len(sample.completion_ids)} completion ids but {len(phases)} phases"
        )
    if (phases < 0).any() or (phases > len(sample.advantages)).any() or not (phases > 0).any():
        raise ValueError(
            f"{where} has phases outside 1..{len(sample.advantages)} or no phase in the loss"
        )
    if not np.isfinite(np.asarray(sample.advantages, np.float64)).all():
        raise ValueError(f"{where} has a non-finite advantage")


def _columns(sample: Sample | EpisodeSample) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Per completion token (loss mask, advantage, tokens of its phase) and the row's phases."""
    n = len(sample.completion_ids)
    if isinstance(sample, Sample):
        return np.ones(n), np.full(n, sample.advantage), np.full(n, float(n)), 1
    phases = np.asarray(sample.phases)
    counts = np.bincount(phases, minlength=len(sample.advantages) + 1).astype(np.float64)
    advantages = np.concatenate([[0.0], np.asarray(sample.advantages, np.float64)])
    in_loss = phases > 0
    return (
        in_loss.astype(np.float64),
        advantages[phases] * in_loss,
        counts[phases] * in_loss,
        int(np.count_nonzero(counts[1:])),
    )


def make_batch(
    samples: Sequence[Sample | EpisodeSample],
    *,
    pad_to_multiple: int = 8,
    rows_multiple: int = 1,
    pad_id: int = 0,
    length: int | None = None,
    per_token_advantages: bool | None = None,
    score_positions: bool = True,
) -> Batch:
    """Left-pads samples into a learner ``Batch``.

    Args:
      samples: one or more ``Sample`` (one phase each) or ``EpisodeSample`` (a whole
        episode each), mixed as they come.
      pad_to_multiple: T is the longest prompt + completion rounded up to a
        multiple of this.
      rows_multiple: B is the number of samples rounded up to a multiple of
        this; the extra rows are all padding.
      pad_id: token id written in padded positions.
      length: T itself (at least the longest row), instead of rounding.
      per_token_advantages: advantages [B, T] rather than [B]; None: [B, T] when some
        sample is an ``EpisodeSample``.
      score_positions: list the loss columns (``Batch.score_positions``, P the most loss
        tokens of a row rounded up to a length bucket of ``pad_to_multiple``) so the
        learner's head runs on them only; False: every column is scored (same loss).

    Returns:
      ``Batch`` with input_ids [B, T] int32, attention_mask [B, T] int32,
      loss_mask [B, T] float32, advantages [B] or [B, T] float32, sampler_logprobs
      [B, T] float32, sequence_tokens [B, T] float32, sequences [B] float32 and
      score_positions [B, P] int32 (or None).

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
    episodes = any(isinstance(s, EpisodeSample) for s in samples)
    if per_token_advantages is None:
        per_token_advantages = episodes
    elif episodes and not per_token_advantages:
        raise ValueError("an EpisodeSample's phases have their own advantages: keep them per token")
    input_ids, attention, _ = batch_lib.left_pad(
        [s.prompt_ids for s in samples],
        [s.completion_ids for s in samples],
        pad_to_multiple=pad_to_multiple,
        rows_multiple=rows_multiple,
        pad_id=pad_id,
        length=length,
    )
    rows, length = input_ids.shape
    loss, sampler, token_advantages, sequence_tokens = (
        np.zeros((rows, length), np.float32) for _ in range(4)
    )
    advantages, sequences = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    for row, sample in enumerate(samples):
        start = length - len(sample.completion_ids)
        mask, advantage, tokens, sequences[row] = _columns(sample)
        loss[row, start:] = mask
        sampler[row, start:] = sample.sampler_logprobs
        token_advantages[row, start:] = advantage
        sequence_tokens[row, start:] = tokens
        advantages[row] = 0.0 if isinstance(sample, EpisodeSample) else sample.advantage
    positions = _score_positions(loss, pad_to_multiple) if score_positions else None
    table, index = _mask_columns(samples, length, positions)
    return Batch(
        input_ids=jnp.asarray(input_ids),
        attention_mask=jnp.asarray(attention),
        loss_mask=jnp.asarray(loss),
        advantages=jnp.asarray(token_advantages if per_token_advantages else advantages),
        sampler_logprobs=jnp.asarray(sampler),
        sequence_tokens=jnp.asarray(sequence_tokens),
        sequences=jnp.asarray(sequences),
        score_positions=None if positions is None else jnp.asarray(positions),
        mask_table=None if table is None else jnp.asarray(table),
        mask_index=None if index is None else jnp.asarray(index),
    )


def _mask_columns(samples, length: int, positions) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(table [B, R, W] uint32, index [B, P] int32): each scored column's structured-decoding mask.

    Per row, a table of its distinct masks (row-major like every other field, so a batch
    splits into micro-batches and shards by rows): entry 0 allows every token (unmasked
    columns), the row's masks follow; R is the most of any row, rounded up to a multiple
    of 8 (fewer compiled shapes). (None, None) when no sample has a mask.
    """
    if not any(m is not None for s in samples for m in s.masks):
        return None, None
    if positions is None:
        raise ValueError("samples with masks need score_positions (the masked columns)")
    width = next(m.shape[0] for s in samples for m in s.masks if m is not None)
    everything = np.full(width, 0xFFFFFFFF, np.uint32)
    tables, index = [], np.zeros(positions.shape, np.int32)
    for row, sample in enumerate(samples):
        rows, seen = [everything], {}
        if len(sample.masks) and len(sample.masks) != len(sample.completion_ids):
            raise ValueError(f"sample {row}: {len(sample.masks)} masks for "
                             f"{len(sample.completion_ids)} completion tokens")  # fmt: skip
        start = length - len(sample.completion_ids)
        column = {int(c): k for k, c in enumerate(positions[row]) if c > 0}
        for offset, mask in enumerate(sample.masks):
            if mask is None or start + offset not in column:
                continue
            key = mask.tobytes()
            if key not in seen:
                seen[key] = len(rows)
                rows.append(np.asarray(mask, np.uint32))
            index[row, column[start + offset]] = seen[key]
        tables.append(rows)
    depth = -(-max(len(t) for t in tables) // 8) * 8
    table = np.zeros((positions.shape[0], depth, width), np.uint32)
    for row, rows in enumerate(tables):
        table[row, : len(rows)] = rows
    return table, index


def _score_positions(loss: np.ndarray, multiple: int) -> np.ndarray:
    """[B, P] the loss columns of each row (column 0 never counts), 0-padded to a bucket."""
    columns = [np.flatnonzero(row[1:] > 0) + 1 for row in loss]
    longest = max((len(c) for c in columns), default=0)
    width = min(batch_lib.bucket_length(max(longest, 1), multiple), loss.shape[1])
    positions = np.zeros((loss.shape[0], width), np.int32)
    for row, c in enumerate(columns):
        positions[row, : len(c)] = c
    return positions


def make_micro_batches(
    samples: Sequence[Sample | EpisodeSample],
    *,
    micro_batch_size: int,
    pad_to_multiple: int = 8,
    pad_id: int = 0,
    score_positions: bool = True,
) -> list[Batch]:
    """Micro-batches of ``micro_batch_size`` rows, longest rows first, each at its own length.

    Each micro-batch is padded to the length bucket of its longest row
    (``training.batch.micro_batches``); the last one is filled with padding rows.
    ``training.step.TrainStep`` takes the list as one update, equal to the update on
    one batch of every row.

    ``pad_to_multiple`` also buckets the scored positions (``make_batch``'s
    ``score_positions``).

    Returns:
      ``Batch``es of ``micro_batch_size`` rows each (see ``make_batch``); advantages
      [B, T] in all of them when some sample is an ``EpisodeSample``.
    """
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    per_token = any(isinstance(s, EpisodeSample) for s in samples)
    plan = batch_lib.micro_batches(lengths, size=micro_batch_size, pad_to_multiple=pad_to_multiple)
    return [
        make_batch(
            [samples[i] for i in rows],
            rows_multiple=micro_batch_size,
            pad_id=pad_id,
            length=length,
            pad_to_multiple=pad_to_multiple,
            per_token_advantages=per_token,
            score_positions=score_positions,
        )
        for rows, length in plan
    ]
