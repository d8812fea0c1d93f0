"""The jitted GRPO update of a model's LoRA adapters: ``state, metrics = train_step(state, batch)``.

Only the ``nnx.LoRAParam`` arrays are trained; the optimizer state exists for
them alone. The base weights are one set of arrays shared by the policy (base
plus adapters), the reference of the KL term (the same base with every adapter
zeroed, which adds exactly 0) and the critic: the train step reads them and
never writes, copies or donates them.

    train_step = learner.TrainStep(model, config)   # after lora.apply_lora(model, ...)
    state = learner.init_state(model, config)       # optimizer state built here, before compiling
    for batch in batches:
        state, metrics = train_step(state, batch)   # the train state is donated
        learner.sync_model(model, state)            # adapters back into the model for sampling

A batch is split into micro-batches of ``micro_batch_size`` rows run in a
``lax.scan``; each contributes the gradient of its loss *sum* and its
denominator (``grpo.policy_loss``), and the summed gradient is divided once by
the summed denominator, so the update equals the full-batch update.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from pau_jax.rl import grpo
from pau_jax.rl.grpo import GRPOConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """Optimiser and batching of the LoRA update (paper values by default).

    Attributes:
      learning_rate: AdamW learning rate.
      weight_decay: AdamW decoupled weight decay.
      max_grad_norm: gradients are clipped to this global norm before AdamW.
      adam_b1, adam_b2, adam_eps: AdamW moments and epsilon (torch defaults).
      micro_batch_size: rows per micro-batch; None = the whole batch at once.
        The batch size must be a multiple of it.
      logits_chunk_tokens: positions whose [chunk, V] logits exist at once.
      grpo: the loss's constants.
    """

    learning_rate: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    micro_batch_size: int | None = None
    logits_chunk_tokens: int = 1024
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)

    def __post_init__(self):
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {self.micro_batch_size}")
        if self.logits_chunk_tokens < 1:
            raise ValueError(f"logits_chunk_tokens must be >= 1, got {self.logits_chunk_tokens}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    """Training sequences (prompt + sampled completion), one step of an episode per row.

    Attributes:
      input_ids: [B, T] int32.
      attention_mask: [B, T], 1 for real tokens (left padding allowed).
      loss_mask: [B, T] float32, 1 on completion tokens.
      advantages: [B] per sequence or [B, T] per token.
      sampler_logprobs: [B, T] log-probs of the tokens under the sampler,
        aligned as in ``grpo`` (column t scores token t).
    """

    input_ids: jax.Array
    attention_mask: jax.Array
    loss_mask: jax.Array
    advantages: jax.Array
    sampler_logprobs: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainState:
    """What a train step updates: the step count, the adapters and their optimizer state."""

    step: jax.Array
    lora: nnx.State
    opt_state: optax.OptState


def optimizer(config: LearnerConfig) -> optax.GradientTransformation:
    """Global-norm clipping followed by AdamW."""
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(
            config.learning_rate,
            b1=config.adam_b1,
            b2=config.adam_b2,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        ),
    )


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """(graph definition, LoRA state, everything else) of a model; the arrays are the model's own."""
    graphdef, lora_state, base_state = nnx.split(model, nnx.LoRAParam, ...)
    if not jax.tree.leaves(lora_state):
        raise ValueError("the model has no LoRA adapters; call lora.apply_lora(model, ...) first")
    return graphdef, lora_state, base_state


def init_state(model: nnx.Module, config: LearnerConfig) -> TrainState:
    """Step 0: copies of the model's adapters and their freshly initialised optimizer state.

    The adapters are copied so that donating the state to ``train_step`` leaves
    the model's own arrays valid.
    """
    _, lora_state, _ = split_model(model)
    lora_state = jax.tree.map(jnp.array, lora_state)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        lora=lora_state,
        opt_state=optimizer(config).init(lora_state),
    )


def sync_model(model: nnx.Module, state: TrainState) -> None:
    """Writes the state's adapters into the model (e.g. before sampling with it).

    The model then shares the state's arrays; the next ``train_step`` donates
    them, so call this again after every step before using the model.
    """
    nnx.update(model, state.lora)


def _micro_batch_loss(graphdef, config: LearnerConfig, base, lora, batch: Batch, ref_logp):
    model = nnx.merge(graphdef, lora, base)
    logp, entropy = grpo.token_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        temperature=config.grpo.temperature,
        chunk_tokens=config.logits_chunk_tokens,
    )
    loss_sum, denominator, stats = grpo.policy_loss(
        logp,
        batch.sampler_logprobs,
        batch.advantages,
        batch.loss_mask,
        config.grpo,
        ref_logp=ref_logp,
        entropy=entropy,
    )
    return loss_sum, (denominator, stats)


def _reference_logprobs(graphdef, config: LearnerConfig, base, lora, batch: Batch):
    """[B, T] log-probs of the base model: the same arrays with every adapter set to zero."""
    zero = jax.tree.map(jnp.zeros_like, lora)
    logp, _ = grpo.token_logprobs(
        nnx.merge(graphdef, zero, base),
        batch.input_ids,
        batch.attention_mask,
        temperature=config.grpo.temperature,
        chunk_tokens=config.logits_chunk_tokens,
    )
    return jax.lax.stop_gradient(logp)


def _update(graphdef, config: LearnerConfig, base, state: TrainState, batch: Batch):
    rows = batch.input_ids.shape[0]
    size = config.micro_batch_size or rows
    if rows % size:
        raise ValueError(
            f"batch of {rows} rows is not a multiple of micro_batch_size={size}; "
            "pad the batch (rows with an all-zero loss mask) or change micro_batch_size"
        )
    grad_fn = jax.value_and_grad(
        functools.partial(_micro_batch_loss, graphdef, config, base), has_aux=True
    )

    def accumulate(carry, micro):
        grads, loss_sum, denominator, stats = carry
        ref = None
        if config.grpo.beta > 0:
            ref = _reference_logprobs(graphdef, config, base, state.lora, micro)
        (part_sum, (part_denominator, part_stats)), part_grads = grad_fn(state.lora, micro, ref)
        return (
            jax.tree.map(jnp.add, grads, part_grads),
            loss_sum + part_sum,
            denominator + part_denominator,
            grpo.combine_stats(stats, part_stats),
        ), None

    zero = jnp.zeros((), jnp.float32)
    carry = (jax.tree.map(jnp.zeros_like, state.lora), zero, zero, grpo.empty_stats())
    if size == rows:
        carry, _ = accumulate(carry, batch)
    else:
        micro_batches = jax.tree.map(lambda x: x.reshape(rows // size, size, *x.shape[1:]), batch)
        carry, _ = jax.lax.scan(accumulate, carry, micro_batches)
    grads, loss_sum, denominator, stats = carry
    grads = jax.tree.map(lambda g: g / jnp.maximum(denominator, 1.0), grads)
    updates, opt_state = optimizer(config).update(grads, state.opt_state, state.lora)
    new_state = TrainState(
        step=state.step + 1,
        lora=optax.apply_updates(state.lora, updates),
        opt_state=opt_state,
    )
    out = grpo.metrics(loss_sum, denominator, stats)
    out["train/grad_norm"] = optax.tree.norm(grads)
    out["train/update_norm"] = optax.tree.norm(updates)
    return new_state, out


class TrainStep:
    """The compiled update ``train_step(state, batch) -> (state, metrics)`` of one model.

    The base weights are read from the model once, here, and passed to the
    jitted function on every call as an argument that is neither donated nor
    written. The train state is donated.

    Attributes:
      jitted: the ``jax.jit`` function ``(base, state, batch) -> (state, metrics)``.
      base: the model's non-LoRA state (its own arrays).
    """

    def __init__(
        self,
        model: nnx.Module,
        config: LearnerConfig,
        *,
        in_shardings=None,
        out_shardings=None,
        mesh: jax.sharding.Mesh | None = None,
    ):
        """Builds the jitted update.

        Args:
          model: a model with LoRA adapters.
          config: optimiser, batching and loss constants.
          in_shardings: optional shardings of ``(base, state, batch)`` for
            ``jax.jit`` (from the mesh rules); None lets jit follow the inputs.
          out_shardings: optional shardings of ``(state, metrics)``.
          mesh: optional mesh made current while tracing, so the model's
            activation sharding constraints apply (``parallel.train_step_shardings``
            returns all three).
        """
        graphdef, _, self.base = split_model(model)
        shardings = {}
        if in_shardings is not None:
            shardings["in_shardings"] = in_shardings
        if out_shardings is not None:
            shardings["out_shardings"] = out_shardings
        self.config = config
        self.mesh = mesh
        self.jitted = jax.jit(
            functools.partial(_update, graphdef, config), donate_argnums=(1,), **shardings
        )

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        """One optimizer step on ``batch``; ``state`` is consumed (donated)."""
        if self.mesh is None:
            return self.jitted(self.base, state, batch)
        with jax.set_mesh(self.mesh):
            return self.jitted(self.base, state, batch)
