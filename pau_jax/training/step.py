"""The one jitted update of a model's LoRA adapters; an algorithm supplies only its loss.

    loss = grpo.GRPOLoss(config)                       # or sft.trainer.NLLLoss(), ...
    optimizer = step.OptimizerConfig(learning_rate=1e-6)
    train_step = step.make_train_step(loss, optimizer, model=model, micro_batch_size=4)
    state = step.init_state(model, optimizer)
    for batch in batches:
        state, metrics = train_step(state, batch)      # the train state is donated
        step.sync_model(model, state)                  # adapters back into the model

A loss is a hashable callable ``loss(model, batch) -> (loss_sum, denominator,
stats)`` with a ``metrics(loss_sum, denominator, stats) -> dict`` method. The
batch is any pytree of [B, ...] arrays the loss understands. It is split into
micro-batches of ``micro_batch_size`` rows run in a ``lax.scan``, or is given as
a list of micro-batches, each padded to its own length (one call per micro-batch);
each contributes the gradient of its loss *sum*, its denominator and its statistics,
and the summed gradient is divided once by the summed denominator, so the update
equals the full-batch update. Statistics are scalars combined over micro-batches
by their name: ``*_min`` by minimum, ``*_max`` by maximum, all others by sum.

Only the ``nnx.LoRAParam`` arrays are trained; the optimizer state exists for
them alone. The base weights are read from the model once, passed to every call
as an argument that is neither donated nor written, and shared with the sampler
and the frozen critic.
"""

import contextlib
import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """Global-norm clipping followed by AdamW (torch's defaults for the moments).

    An algorithm's config extends it (``rl.learner.LearnerConfig``, ``sft.trainer.SFTConfig``),
    so the optimiser's fields are declared once.

    Attributes:
      learning_rate: AdamW learning rate.
      weight_decay: AdamW decoupled weight decay.
      max_grad_norm: gradients are clipped to this global norm before AdamW.
      adam_b1, adam_b2, adam_eps: AdamW moments and epsilon.
    """

    learning_rate: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8

    def optimizer(self) -> "OptimizerConfig":
        """Only the optimiser's fields: the static key of the compiled step, so configs that
        differ elsewhere (batching, loss constants) share one program."""
        return OptimizerConfig(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(OptimizerConfig)}
        )

    def build(self) -> optax.GradientTransformation:
        return optax.chain(
            optax.clip_by_global_norm(self.max_grad_norm),
            optax.adamw(
                self.learning_rate,
                b1=self.adam_b1,
                b2=self.adam_b2,
                eps=self.adam_eps,
                weight_decay=self.weight_decay,
            ),
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenBatch:
    """Sequences and the tokens a loss is taken on (what supervised losses need).

    Attributes:
      input_ids: [B, T] int32.
      attention_mask: [B, T], 1 for real tokens (left padding allowed).
      loss_mask: [B, T] float32, 1 on the tokens the loss is taken on.
    """

    input_ids: jax.Array
    attention_mask: jax.Array
    loss_mask: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainState:
    """What a train step updates: the step count, the adapters and their optimizer state."""

    step: jax.Array
    lora: nnx.State
    opt_state: optax.OptState


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """(graph definition, LoRA state, everything else) of a model; the arrays are the model's own."""
    graphdef, lora_state, base_state = nnx.split(model, nnx.LoRAParam, ...)
    if not jax.tree.leaves(lora_state):
        raise ValueError("the model has no LoRA adapters; call lora.apply_lora(model, ...) first")
    return graphdef, lora_state, base_state


def reference_model(model: nnx.Module) -> nnx.Module:
    """The base of a LoRA model as a second model object over the very same base arrays.

    Every adapter of the returned model is zero (it adds exactly 0) and every other
    array *is* the model's own (no copy): the KL reference, the frozen AAC critic and
    a self-distillation teacher; training the adapters never changes it.
    """
    graphdef, lora_state, base_state = split_model(model)
    return nnx.merge(graphdef, jax.tree.map(jnp.zeros_like, lora_state), base_state)


def init_state(model: nnx.Module, optimizer: OptimizerConfig) -> TrainState:
    """Step 0: copies of the model's adapters and their freshly initialised optimizer state.

    The adapters are copied so that donating the state to a train step leaves
    the model's own arrays valid.
    """
    _, lora_state, _ = split_model(model)
    lora_state = jax.tree.map(jnp.array, lora_state)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        lora=lora_state,
        opt_state=optimizer.build().init(lora_state),
    )


def sync_model(model: nnx.Module, state: TrainState) -> None:
    """Writes the state's adapters into the model (e.g. before sampling with it).

    The model then shares the state's arrays; the next train step donates
    them, so call this again after every step before using the model.
    """
    nnx.update(model, state.lora)


def _combine(name: str, a: jax.Array, b: jax.Array) -> jax.Array:
    if name.endswith("_min"):
        return jnp.minimum(a, b)
    if name.endswith("_max"):
        return jnp.maximum(a, b)
    return a + b


def _identity(name: str, shape: jax.ShapeDtypeStruct) -> jax.Array:
    if name.endswith("_min"):
        return jnp.full(shape.shape, jnp.inf, shape.dtype)
    if name.endswith("_max"):
        return jnp.full(shape.shape, -jnp.inf, shape.dtype)
    return jnp.zeros(shape.shape, shape.dtype)


def _micro_loss_and_grads(graphdef, loss_fn, base, lora, micro):
    """(LoRA gradients of the loss sum, loss sum, denominator, statistics) of one micro-batch."""

    def micro_loss(lora, micro):
        loss_sum, denominator, stats = loss_fn(nnx.merge(graphdef, lora, base), micro)
        return loss_sum, (denominator, stats)

    (loss_sum, (denominator, stats)), grads = jax.value_and_grad(micro_loss, has_aux=True)(
        lora, micro
    )
    return grads, loss_sum, denominator, stats


def _add(carry, part):
    """Sums of (gradients, loss sum, denominator) and statistics combined by name."""
    grads, loss_sum, denominator, stats = carry
    part_grads, part_sum, part_denominator, part_stats = part
    return (
        jax.tree.map(jnp.add, grads, part_grads),
        loss_sum + part_sum,
        denominator + part_denominator,
        {k: _combine(k, stats[k], part_stats[k]) for k in stats},
    )


def _empty_carry(graphdef, loss_fn, base, lora, micro):
    """Zero sums and the statistics' identities, shaped as one micro-batch's results."""
    _, _, _, stats_shape = jax.eval_shape(
        functools.partial(_micro_loss_and_grads, graphdef, loss_fn, base), lora, micro
    )
    zero = jnp.zeros((), jnp.float32)
    stats = {k: _identity(k, v) for k, v in stats_shape.items()}
    return jax.tree.map(jnp.zeros_like, lora), zero, zero, stats


def _finish(loss_fn, optimizer: OptimizerConfig, state, carry):
    """The optimizer step on the summed gradients / summed denominator, and the metrics."""
    grads, loss_sum, denominator, stats = carry
    grads = jax.tree.map(lambda g: g / jnp.maximum(denominator, 1.0), grads)
    updates, opt_state = optimizer.build().update(grads, state.opt_state, state.lora)
    new_state = TrainState(
        step=state.step + 1,
        lora=optax.apply_updates(state.lora, updates),
        opt_state=opt_state,
    )
    out = loss_fn.metrics(loss_sum, denominator, stats)
    out["train/grad_norm"] = optax.tree.norm(grads)
    out["train/update_norm"] = optax.tree.norm(updates)
    return new_state, out


def _update(graphdef, loss_fn, optimizer: OptimizerConfig, micro_batch_size, base, state, batch):
    rows = jax.tree.leaves(batch)[0].shape[0]
    size = micro_batch_size or rows
    if rows % size:
        raise ValueError(
            f"batch of {rows} rows is not a multiple of micro_batch_size={size}; "
            "pad the batch (rows with an all-zero loss mask) or change micro_batch_size"
        )

    def accumulate(carry, micro):
        return _add(carry, _micro_loss_and_grads(graphdef, loss_fn, base, state.lora, micro)), None

    micro_batches = jax.tree.map(lambda x: x.reshape(rows // size, size, *x.shape[1:]), batch)
    first = jax.tree.map(lambda x: x[0], micro_batches)
    carry = _empty_carry(graphdef, loss_fn, base, state.lora, first)
    if size == rows:
        carry, _ = accumulate(carry, batch)
    else:
        carry, _ = jax.lax.scan(accumulate, carry, micro_batches)
    return _finish(loss_fn, optimizer, state, carry)


def _accumulate(graphdef, loss_fn, base, lora, carry, micro):
    """``carry`` + one micro-batch's gradients and sums (a list of micro-batches, one call each)."""
    return _add(carry, _micro_loss_and_grads(graphdef, loss_fn, base, lora, micro))


# One compiled program per (model structure, loss, optimizer, micro-batch size), shared by
# every unsharded train step: a resumed or repeated fine-tuning in one process compiles once.
_shared_update = jax.jit(_update, static_argnums=(0, 1, 2, 3), donate_argnums=(5,))
# A list of micro-batches of their own lengths: one accumulation program per micro-batch shape
# (the carry donated), one empty carry per model, one optimizer step.
_shared_accumulate = jax.jit(_accumulate, static_argnums=(0, 1), donate_argnums=(4,))
_shared_empty = jax.jit(_empty_carry, static_argnums=(0, 1))
_shared_finish = jax.jit(_finish, static_argnums=(0, 1), donate_argnums=(2,))


class TrainStep:
    """The compiled update ``train_step(state, batch) -> (state, metrics)`` of one model.

    Built by ``make_train_step``, which documents the arguments.

    Attributes:
      jitted: ``(base, state, batch) -> (state, metrics)``.
      base: the model's non-LoRA state (its own arrays).
      loss_fn: the loss.
      optimizer: the optimizer's config.
      micro_batch_size: rows per micro-batch of one batch (None: the whole batch).
    """

    def __init__(
        self,
        loss_fn: Callable,
        optimizer: OptimizerConfig,
        *,
        model: nnx.Module,
        micro_batch_size: int | None = None,
        in_shardings=None,
        out_shardings=None,
        mesh: jax.sharding.Mesh | None = None,
    ):
        """The jitted update of ``model``'s adapters under ``loss_fn`` (``make_train_step``).

        Args:
          loss_fn: hashable ``loss_fn(model, batch) -> (loss_sum, denominator, stats)``
            with a ``metrics(loss_sum, denominator, stats)`` method (a frozen dataclass).
          optimizer: the optimizer's config (or an algorithm's config that extends it).
          model: a model with LoRA adapters.
          micro_batch_size: rows per micro-batch; None = the whole batch at once.
          in_shardings: optional shardings of ``(base, state, batch)`` for ``jax.jit``;
            None lets jit follow the inputs (``parallel.train_step_shardings`` gives all three).
          out_shardings: optional shardings of ``(state, metrics)``.
          mesh: optional mesh made current while tracing, so the model's activation
            sharding constraints apply.
        """
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {micro_batch_size}")
        graphdef, _, self.base = split_model(model)
        optimizer = optimizer.optimizer()  # An algorithm's config keys the program by these only.
        self.loss_fn, self.optimizer, self.mesh = loss_fn, optimizer, mesh
        self.micro_batch_size = micro_batch_size
        statics = (graphdef, loss_fn, optimizer, micro_batch_size)
        if in_shardings is None and out_shardings is None:
            self._jit, self._statics = _shared_update, statics
        else:
            shardings = {}
            if in_shardings is not None:
                shardings["in_shardings"] = in_shardings
            if out_shardings is not None:
                shardings["out_shardings"] = out_shardings
            self._statics = ()
            self._jit = jax.jit(
                functools.partial(_update, *statics), donate_argnums=(1,), **shardings
            )
        self.jitted = functools.partial(self._jit, *self._statics)

    def _tracing_mesh(self):
        return contextlib.nullcontext() if self.mesh is None else jax.set_mesh(self.mesh)

    def lower(self, state: TrainState, batch):
        """The lowered program of one step (``.compile().memory_analysis()`` etc.)."""
        with self._tracing_mesh():
            return self._jit.lower(*self._statics, self.base, state, batch)

    def __call__(self, state: TrainState, batch) -> tuple[TrainState, dict]:
        """One optimizer step on ``batch``; ``state`` is consumed (donated).

        ``batch`` is one batch (split into micro-batches of ``micro_batch_size`` rows in a
        ``lax.scan``) or a list of micro-batches of their own lengths
        (``rl.samples.make_micro_batches``): one call per micro-batch, compiled once per
        shape, then one optimizer step; the update equals that on one batch of all rows.
        """
        if isinstance(batch, (list, tuple)):
            return self._micro_batches(state, batch)
        with self._tracing_mesh():
            return self.jitted(self.base, state, batch)

    def _micro_batches(self, state: TrainState, batches) -> tuple[TrainState, dict]:
        """One optimizer step on the gradients summed over ``batches``."""
        if not self._statics:
            raise ValueError(
                "a list of micro-batches runs without explicit shardings; pass one batch to a "
                "train step built with in_shardings or out_shardings"
            )
        if not batches:
            raise ValueError("the list of micro-batches is empty; pass at least one")
        graphdef, loss_fn, optimizer, _ = self._statics
        with self._tracing_mesh():
            carry = _shared_empty(graphdef, loss_fn, self.base, state.lora, batches[0])
            for micro in batches:
                carry = _shared_accumulate(graphdef, loss_fn, self.base, state.lora, carry, micro)
            return _shared_finish(loss_fn, optimizer, state, carry)


# The compiled update ``train_step(state, batch) -> (state, metrics)`` of a model's adapters:
# call it, or ``.lower(state, batch)`` it for memory analysis (arguments: ``TrainStep``).
make_train_step = TrainStep
