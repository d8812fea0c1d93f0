"""GRPO on LoRA adapters: the learner's config, batch and train step over ``training.step``.

    train_step = learner.make_train_step(model, config)   # after lora.apply_lora(model, ...)
    state = learner.init_state(model, config)       # optimizer state built here, before compiling
    for batch in batches:
        state, metrics = train_step(state, batch)   # the train state is donated
        learner.sync_model(model, state)            # adapters back into the model for sampling

The update itself is ``training.step.make_train_step`` with the GRPO loss
(``grpo.GRPOLoss``); this module only maps ``LearnerConfig`` onto it. The base
weights are one set of arrays shared by the policy, the reference of the KL term
(the same base with every adapter zeroed) and the critic.
"""

import dataclasses

import jax
from flax import nnx

from pau_jax.rl import grpo
from pau_jax.rl.grpo import GRPOConfig
from pau_jax.training import step as step_lib
from pau_jax.training.step import TrainState, sync_model

__all__ = ["Batch", "LearnerConfig", "TrainState", "init_state", "make_train_step", "sync_model"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig(step_lib.OptimizerConfig):
    """Optimiser (``training.step.OptimizerConfig``: learning rate 1e-6, weight decay 0.01,
    clipping at norm 1, torch's AdamW moments) and batching of the LoRA update (paper values).

    Attributes:
      micro_batch_size: rows per micro-batch; None = the whole batch at once.
        The batch size must be a multiple of it.
      logits_chunk_tokens: positions whose [chunk, V] logits exist at once.
      remat: recompute each decoder layer's activations in the backward pass instead
        of keeping them (same loss and gradients; memory of one layer's activations per
        micro-batch instead of all layers', about a third more compute). Without it a
        micro-batch of two 1,500-token rows of Qwen2.5-0.5B needs ~34 GB.
      remat_min_tokens: with ``remat``, only micro-batches of at least this many tokens
        (rows x padded length) recompute; shorter ones keep their activations and skip
        the extra forward. 0: every micro-batch.
      grpo: the loss's constants.
    """

    micro_batch_size: int | None = None
    logits_chunk_tokens: int = 1024
    remat: bool = False
    remat_min_tokens: int = 0
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)

    def __post_init__(self):
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {self.micro_batch_size}")
        if self.logits_chunk_tokens < 1:
            raise ValueError(f"logits_chunk_tokens must be >= 1, got {self.logits_chunk_tokens}")
        if self.remat_min_tokens < 0:
            raise ValueError(f"remat_min_tokens must be >= 0, got {self.remat_min_tokens}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    """Training sequences: per row one step of an episode (prompt + reply) or a whole episode.

    Attributes:
      input_ids: [B, T] int32.
      attention_mask: [B, T], 1 for real tokens (left padding allowed).
      loss_mask: [B, T] float32, 1 on sampled tokens.
      advantages: [B] per sequence or [B, T] per token.
      sampler_logprobs: [B, T] log-probs of the tokens under the sampler,
        aligned as in ``grpo`` (column t scores token t).
      sequence_tokens: [B, T] float32, per loss token the number of loss tokens of its
        step (its sequence), so a row of several steps aggregates as one row per step
        (``grpo``); None: each row is one sequence.
      sequences: [B] float32, steps with a loss token per row (None with ``sequence_tokens``).
      score_positions: [B, P] int32, the columns with a loss token, 0-padded: the loss
        scores only these (``training.logprobs.token_logprobs``'s ``positions``), so the
        vocabulary head never runs on prompt and tool tokens; every loss column must be
        listed. None: every column is scored.
      mask_table, mask_index: the structured-decoding masks of the scored columns:
        [B, R, W] uint32 per row its packed allowed sets (entry 0 allows every token) and
        [B, P] int32 an entry per ``score_positions`` column, so each sampled token is
        scored under the mask it was drawn with (``rl.samples.make_batch``); None: no mask.
    """

    input_ids: jax.Array
    attention_mask: jax.Array
    loss_mask: jax.Array
    advantages: jax.Array
    sampler_logprobs: jax.Array
    sequence_tokens: jax.Array | None = None
    sequences: jax.Array | None = None
    score_positions: jax.Array | None = None
    mask_table: jax.Array | None = None
    mask_index: jax.Array | None = None


def init_state(model: nnx.Module, config: LearnerConfig) -> TrainState:
    """Step 0: copies of the model's adapters and their fresh optimizer state."""
    return step_lib.init_state(model, config.optimizer())


def make_train_step(
    model: nnx.Module,
    config: LearnerConfig,
    *,
    in_shardings=None,
    out_shardings=None,
    mesh: jax.sharding.Mesh | None = None,
) -> step_lib.TrainStep:
    """The compiled GRPO update ``train_step(state, batch) -> (state, metrics)`` of one model.

    Args:
      model: a model with LoRA adapters.
      config: optimiser, batching and loss constants.
      in_shardings, out_shardings, mesh: as ``training.step.make_train_step``
        (``parallel.train_step_shardings`` returns all three).
    """
    return step_lib.make_train_step(
        grpo.GRPOLoss(
            config=config.grpo,
            chunk_tokens=config.logits_chunk_tokens,
            remat=config.remat,
            remat_min_tokens=config.remat_min_tokens,
        ),
        config.optimizer(),
        model=model,
        micro_batch_size=config.micro_batch_size,
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        mesh=mesh,
    )
