"""Behaviour cloning of recorded episode steps: masked token NLL on LoRA adapters, micro-batched.

Every step of an episode record (``env.runner.episode_record``) becomes
one training pair (``sft.pairs``): the prompt is the chat template of the step's
``messages`` with the generation prompt (exactly what ``LocalPolicy`` feeds the
sampler), the completion is the step's ``output`` followed by the end-of-turn token. The
loss (``NLLLoss``) is the token mean of ``-log p(completion token)``, given to
``training.step`` as (sum, denominator) so that micro-batching gives the
full-batch gradient; only ``nnx.LoRAParam`` arrays move.

    sft_step = make_sft_step(model, config)
    state = training.step.init_state(model, config.optimizer())
    state, history = train_sft(model, tokenizer, records, config)

``run_epochs`` is the epoch loop of a resumable, early-stopped fine-tuning (the
ft baseline, ``sft.finetune``): each epoch shuffled by (seed, epoch), scored on a
held-out slice, stopped after ``patience`` epochs without improvement.
"""

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pau_jax.sft.pairs import SFTExample, pad_id, samples_from_records
from pau_jax.training import batch as batch_lib
from pau_jax.training import step as step_lib
from pau_jax.training.logprobs import token_logprobs
from pau_jax.training.step import TokenBatch, TrainState


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig(step_lib.OptimizerConfig):
    """Optimiser (``training.step.OptimizerConfig``, here with learning rate 1e-5), batching
    and data limits of supervised fine-tuning.

    Attributes:
      epochs: passes over the training pairs.
      batch_size: pairs per optimizer step (the last batch is padded with
        rows that carry no loss).
      micro_batch_size: rows per micro-batch; None = the whole batch. Must
        divide ``batch_size``.
      max_length: pairs whose prompt + completion is longer are dropped (and
        counted in the ``sft/dropped_pairs`` metric).
      pad_to_multiple: sequence lengths are padded to a multiple of this, so
        only a few shapes compile.
      logits_chunk_tokens: positions whose [chunk, V] logits exist at once.
      seed: seed of the per-epoch shuffle.
      skip_unparsed: leave out steps whose output the environment could not parse
        (a malformed input or reflection is not behaviour to imitate); counted in
        the ``sft/skipped_unparsed`` metric.
    """

    learning_rate: float = 1e-5
    epochs: int = 1
    batch_size: int = 8
    micro_batch_size: int | None = None
    max_length: int = 4096
    pad_to_multiple: int = 128
    logits_chunk_tokens: int = 1024
    seed: int = 0
    skip_unparsed: bool = True

    def __post_init__(self):
        for name in ("epochs", "batch_size", "max_length", "pad_to_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"SFTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.micro_batch_size is not None and (
            self.micro_batch_size < 1 or self.batch_size % self.micro_batch_size
        ):
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} must be >= 1 and divide "
                f"batch_size={self.batch_size}"
            )


def nll_loss(logp: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Token NLL of a (micro-)batch as (sum, denominator); position 0 never counts.

    Args:
      logp: [B, T] log-probs, column t scoring token t (``training.logprobs.token_logprobs``).
      loss_mask: [B, T], 1 on the tokens to imitate.

    Returns:
      (scalar sum of -logp over masked tokens, scalar number of masked tokens).
    """
    mask = loss_mask.astype(jnp.float32) * (jnp.arange(logp.shape[1]) > 0)
    return -jnp.sum(logp * mask), jnp.sum(mask)


def make_sft_batch(
    examples: Sequence[SFTExample], *, pad_to_multiple: int, rows_multiple: int, pad_id: int = 0
) -> TokenBatch:
    """Left-padded batch of pairs (``training.batch.left_pad``); the loss is on the completions."""
    input_ids, attention, loss = batch_lib.left_pad(
        [e.prompt_ids for e in examples],
        [e.completion_ids for e in examples],
        pad_to_multiple=pad_to_multiple,
        rows_multiple=rows_multiple,
        pad_id=pad_id,
    )
    return TokenBatch(
        input_ids=jnp.asarray(input_ids),
        attention_mask=jnp.asarray(attention),
        loss_mask=jnp.asarray(loss),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class NLLLoss:
    """Token-mean NLL of the masked tokens, as ``training.step`` takes a loss."""

    chunk_tokens: int = 1024

    def __call__(self, model, batch: TokenBatch):
        logp, _ = token_logprobs(
            model, batch.input_ids, batch.attention_mask, chunk_tokens=self.chunk_tokens
        )
        loss_sum, denominator = nll_loss(logp, batch.loss_mask)
        return loss_sum, denominator, {}

    def metrics(self, loss_sum, denominator, stats) -> dict:
        return {"sft/loss": loss_sum / jnp.maximum(denominator, 1.0), "sft/tokens": denominator}


def make_sft_step(model: nnx.Module, config: SFTConfig) -> step_lib.TrainStep:
    """The compiled update ``sft_step(state, batch) -> (state, metrics)`` of one model.

    One ``jax.jit`` program per model structure and config is shared by every step
    made here, so a resumed or repeated fine-tuning in one process compiles once.
    The train state comes from ``training.step.init_state(model, config.optimizer())``.
    """
    return step_lib.make_train_step(
        NLLLoss(chunk_tokens=config.logits_chunk_tokens),
        config.optimizer(),
        model=model,
        micro_batch_size=config.micro_batch_size,
    )


def batches(examples: Sequence[SFTExample], config: SFTConfig, pad: int) -> Iterator[TokenBatch]:
    """Batches of ``config.batch_size`` pairs in the given order; the last one padded with empty rows."""
    for start in range(0, len(examples), config.batch_size):
        yield make_sft_batch(
            examples[start : start + config.batch_size],
            pad_to_multiple=config.pad_to_multiple,
            rows_multiple=config.batch_size,
            pad_id=pad,
        )


@functools.partial(jax.jit, static_argnums=(0, 1))
def _nll_sums(graphdef, loss: NLLLoss, base, lora, batch):
    """(sum of token NLL, number of tokens) of a batch under the base plus ``lora``."""
    loss_sum, denominator, _ = loss(nnx.merge(graphdef, lora, base), batch)
    return loss_sum, denominator


def mean_nll(
    state: TrainState,
    *,
    model: nnx.Module,
    examples: Sequence[SFTExample],
    config: SFTConfig,
    pad: int,
) -> float:
    """Token-mean NLL of the examples' completions under the model's base plus the state's adapters.

    Args:
      state: the train state whose adapters are scored (not donated).
      model: the model with LoRA adapters (its base weights are read).
      examples: the pairs, e.g. a held-out slice.
      config: batching and ``logits_chunk_tokens``.
      pad: the padding id.
    """
    graphdef, _, base = step_lib.split_model(model)
    loss = NLLLoss(chunk_tokens=config.logits_chunk_tokens)
    total, count = 0.0, 0.0
    for batch in batches(examples, config, pad):
        loss_sum, denominator = _nll_sums(graphdef, loss, base, state.lora, batch)
        total, count = total + float(loss_sum), count + float(denominator)
    return total / max(count, 1.0)


def best_epoch(losses: Sequence[float | None], patience: int) -> tuple[int, bool]:
    """(index of the best epoch so far, whether to stop) from per-epoch held-out losses.

    The best epoch has the lowest loss (the earliest on ties); training stops when
    the last ``patience`` epochs all came after it. Without held-out losses (None)
    the last epoch is the best and training never stops early.
    """
    if not losses:
        raise ValueError("best_epoch needs at least one epoch")
    if any(x is None for x in losses):
        return len(losses) - 1, False
    best = int(np.argmin(losses))
    return best, len(losses) - 1 - best >= patience


def held_out_losses(history: Sequence[dict]) -> list[float | None]:
    """The ``held_out_nll`` of every epoch record of ``run_epochs``."""
    return [record["held_out_nll"] for record in history]


def _stops(history: Sequence[dict], patience: int | None) -> bool:
    return (
        patience is not None and bool(history) and best_epoch(held_out_losses(history), patience)[1]
    )


def run_epochs(
    step_fn: step_lib.TrainStep,
    state: TrainState,
    examples: Sequence[SFTExample],
    config: SFTConfig,
    *,
    pad: int,
    history: Sequence[dict] = (),
    evaluate: Callable[[TrainState], float] | None = None,
    patience: int | None = None,
) -> Iterator[tuple[TrainState, list[dict]]]:
    """Trains up to ``config.epochs`` epochs, early-stopped on a held-out loss; yields after each.

    Epoch ``e`` visits the examples in the order ``np.random.default_rng([config.seed, e])``
    permutes them to, so a run resumed after epoch ``e - 1`` repeats it exactly. Each
    epoch appends a record ``{"epoch", "train_loss" (mean ``sft/loss`` of its steps),
    "held_out_nll" (``evaluate(state)``, or None)}`` to the history.

    Args:
      step_fn: the compiled update (``make_sft_step``); it consumes (donates) the state.
      state: the train state to continue from.
      examples: the training pairs.
      config: the epochs, batching and shuffle seed.
      pad: the padding id.
      history: the records of the epochs already run (a resumed run continues after them).
      evaluate: ``evaluate(state) -> held-out loss`` after each epoch (e.g. ``mean_nll``
        on a held-out slice); None records no held-out loss.
      patience: stop once the last ``patience`` epochs all came after the lowest held-out
        loss (``best_epoch``; also checked on ``history`` first); None trains every epoch.

    Yields:
      (the state after the epoch, the history up to it). Save or export the state before
      asking for the next epoch, whose first step donates it.
    """
    history = list(history)
    while len(history) < config.epochs and not _stops(history, patience):
        epoch = len(history)
        order = np.random.default_rng([config.seed, epoch]).permutation(len(examples))
        losses = []
        for batch in batches([examples[i] for i in order], config, pad):
            state, metrics = step_fn(state, batch)
            losses.append(float(metrics["sft/loss"]))
        held = None if evaluate is None else float(evaluate(state))
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), "held_out_nll": held})
        yield state, list(history)


def train_sft(
    model: nnx.Module,
    tokenizer,
    records: Iterable[dict[str, Any]],
    config: SFTConfig,
    *,
    writer=None,
    enable_thinking: bool = False,
) -> tuple[TrainState, list[dict[str, float]]]:
    """Fine-tunes the model's LoRA adapters on every step of the records for ``config.epochs``.

    Args:
      model: a model with LoRA adapters; afterwards they hold (copies of) the result.
      tokenizer: the policy's tokenizer.
      records: episode records (e.g. ``runner.load_records(path)``).
      config: the run's settings.
      writer: optional ``MetricsWriter``; one line per optimizer step.
      enable_thinking: passed to the chat template.

    Returns:
      (the final train state, per step a dict of float metrics).
    """
    records = list(records)
    examples = samples_from_records(
        records, tokenizer, enable_thinking=enable_thinking, skip_unparsed=config.skip_unparsed
    )
    total_steps = sum(len(r["steps"]) for r in records)
    skipped = total_steps - len(examples)
    if skipped:
        logging.warning("SFT skips %d of %d steps that failed to parse", skipped, total_steps)
    kept = [e for e in examples if len(e.prompt_ids) + len(e.completion_ids) <= config.max_length]
    dropped = len(examples) - len(kept)
    if dropped:
        logging.warning("SFT drops %d of %d pairs longer than max_length", dropped, len(examples))
    if not kept:
        raise ValueError(
            f"no training pair fits max_length={config.max_length} ({len(examples)} pairs)"
        )
    pad = pad_id(tokenizer)
    step_fn = make_sft_step(model, config)
    state = step_lib.init_state(model, config.optimizer())
    rng = np.random.default_rng(config.seed)
    history = []
    for epoch in range(config.epochs):
        order = rng.permutation(len(kept))
        for batch in batches([kept[i] for i in order], config, pad):
            state, metrics = step_fn(state, batch)
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            metrics.update(
                {
                    "sft/epoch": float(epoch),
                    "sft/dropped_pairs": float(dropped),
                    "sft/skipped_unparsed": float(skipped),
                }
            )
            history.append(metrics)
            if writer is not None:
                writer.write(len(history), metrics)
    # The model gets copies, so donating the returned state later leaves it intact.
    step_lib.sync_model(model, dataclasses.replace(state, lora=jax.tree.map(jnp.copy, state.lora)))
    return state, history
