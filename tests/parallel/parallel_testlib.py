"""Shared by the mesh tests: an 8-row GRPO batch for the tiny LoRA model, a learner config, runners.

Importing this module imports JAX, so processes that need fake devices set
``XLA_FLAGS`` before importing it.
"""

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "rl"))

import rl_testlib as lib  # noqa: E402

from pau_jax import parallel  # noqa: E402
from pau_jax.rl import grpo, learner  # noqa: E402
from pau_jax.training import logprobs as logprobs_lib

# Every sharded dimension of lib.CONFIG divides 8: D 32, N*H 32, K*H 16, F 64, V 96.
CONFIG = lib.CONFIG
# A large epsilon keeps AdamW's first update a smooth function of the gradient,
# so float noise from a different reduction order cannot flip an update's sign.
LEARNER = learner.LearnerConfig(
    learning_rate=1e-2,
    adam_eps=1e-2,
    micro_batch_size=4,
    grpo=grpo.GRPOConfig(beta=0.05, temperature=0.9),
)
ROWS = 8


def batch_arrays() -> dict[str, np.ndarray]:
    """An [8, 10] left-padded batch with sampler log-probs near the tiny policy's own."""
    halves = [lib.batch_arrays(seed=s) for s in (4, 5)]
    arrays = {k: np.concatenate([h[k] for h in halves]) for k in halves[0]}
    logp, _ = jax.jit(
        lambda m, ids, mask: logprobs_lib.token_logprobs(m, ids, mask, temperature=0.9),
    )(lib.tiny_model(), arrays["input_ids"], arrays["attention_mask"])
    noise = np.random.default_rng(9).uniform(-0.3, 0.3, logp.shape)
    arrays["sampler_logprobs"] = (np.asarray(logp) + noise).astype(np.float32)
    return arrays


def lora_leaves(state) -> list[np.ndarray]:
    return [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(state.lora)]


def train_unsharded(arrays: dict[str, np.ndarray], steps: int) -> tuple[list[float], list]:
    """Losses and final LoRA arrays of ``steps`` updates on one device, no mesh."""
    model = lib.tiny_model()
    step = learner.make_train_step(model, LEARNER)
    state = learner.init_state(model, LEARNER)
    batch = learner.Batch(**{k: jnp.asarray(v) for k, v in arrays.items()})
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["train/loss"]))
    return losses, lora_leaves(state)


def train_on_mesh(mesh, local_arrays: dict[str, np.ndarray], steps: int):
    """(losses, final LoRA state) of ``steps`` updates with the learner layout on ``mesh``.

    ``local_arrays`` are this process's rows of the global batch.
    """
    model = parallel.shard_model(lib.tiny_model(), mesh)
    state = parallel.shard_state(learner.init_state(model, LEARNER), mesh)
    step = learner.make_train_step(
        model, LEARNER, **parallel.train_step_shardings(model, state, mesh)
    )
    batch = parallel.shard_batch(learner.Batch(**local_arrays), mesh)
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["train/loss"]))
    return losses, state
