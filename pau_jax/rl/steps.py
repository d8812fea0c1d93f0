"""One AAC training step after another: rollout, update, metrics, log, checkpoint.

`StepLoop.run` is the loop of `loop.train` once the run is open: per step the sampler
layout, the step's task group (`task_order`, seeded so a resumed run continues it), the
actor at the step's seed (`rollout_seed`; the critic's `critic_seed`) → `rollout.collect`
→ the GRPO update (skipped at learning rate 0: a control run) → the metrics row → the
checkpoint every `checkpoint_every` steps.
"""

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from pau_jax import parallel
from pau_jax.env.runner import EpisodeSpec
from pau_jax.policy import backends
from pau_jax.policy.local import LocalPolicy
from pau_jax.rl import learner, samples
from pau_jax.rl import rollout as rollout_lib
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.training import run as run_lib

# Sampler calls one training step may make (rounds of its episodes); seeds of steps never overlap.
_SEEDS_PER_STEP = 10_000


def task_order(seed: int, position: int, n_tasks: int, count: int) -> list[int]:
    """Task indices ``position .. position + count`` of an endless sequence of seeded epochs.

    Epoch ``e`` is ``np.random.default_rng((seed, e)).permutation(n_tasks)``, so
    the order depends only on (seed, position): a resumed run continues it.
    """
    if n_tasks < 1:
        raise ValueError("there are no training tasks")
    out = []
    for p in range(position, position + count):
        epoch, offset = divmod(p, n_tasks)
        out.append(int(np.random.default_rng((seed, epoch)).permutation(n_tasks)[offset]))
    return out


def rollout_seed(seed: int, step: int) -> int:
    """Base sampling seed of training step ``step`` (0-based); call n of the step adds n."""
    return (seed * 1_000_003 + step) * _SEEDS_PER_STEP


def critic_seed(seed: int, step: int) -> int:
    """Base sampling seed of the critic at training step ``step``: the upper half of its block.

    The actor's calls of a step use ``rollout_seed + n`` (n < _SEEDS_PER_STEP / 2), the
    critic's ``critic_seed + n``, so a sampling critic never repeats its random stream
    across steps and never shares one with the actor.
    """
    return rollout_seed(seed, step) + _SEEDS_PER_STEP // 2


def actor_policy(r: run_lib.Run, rollout_config: RolloutConfig, seed: int) -> LocalPolicy:
    """The actor's sampler at a step's base seed, with a fresh prefix cache (new weights).

    It records each token's structured-decoding mask, if any, for the learner.
    """
    return LocalPolicy(
        r.model,
        r.tokenizer,
        rollout_config.sampling_for(seed),
        prefix_cache=backends.prefix_cache(rollout_config.prefix_cache_gib),
        record_masks=True,
    )


@dataclasses.dataclass
class StepLoop:
    """The training steps of one `train` call: rollouts, update, metrics, checkpoints."""

    r: Any
    executor: Any
    specs: Sequence[EpisodeSpec]
    refs: Mapping
    critic_for: Callable
    train_step: Any
    seed: int
    total: int
    rows: int

    def run(self, state, position, last, *, settings, checkpoint_every, evaluation):
        """Runs steps until `total`; returns (steps done, data position, last metrics).

        ``settings``: the run's configs by `train`'s argument names (as `_run_settings`
        completed them) and ``pad_to_multiple``; ``evaluation``: (eval_fn, eval_every).
        """
        r, seed, rollout_config = self.r, self.seed, settings["rollout_config"]
        k = rollout_config.tasks_per_batch
        step = int(state.step)
        while step < self.total:
            t0 = time.perf_counter()
            reshard_s = r.to_layout(parallel.SAMPLER_RULES)
            batch_tasks = [self.specs[i] for i in task_order(seed, position, len(self.specs), k)]
            rollout = rollout_lib.collect(
                parallel.process_split(batch_tasks),
                actor=actor_policy(r, rollout_config, rollout_seed(seed, step)),
                critic=self.critic_for(critic_seed(seed, step)),
                executor=self.executor,
                references=self.refs,
                config=rollout_config,
                episode_config=settings["episode_config"],
                reward_config=settings["reward_config"],
                critic_config=settings["critic_config"],
                advantage_fn=settings["advantage_fn"],
            )
            t1 = time.perf_counter()
            state, train_metrics, batch, learner_s = update_unless_control(
                r,
                self.train_step,
                state,
                rollout,
                settings["learner_config"],
                settings["pad_to_multiple"],
                self.rows,
            )
            position, step = position + k, step + 1
            last = _metrics(rollout, train_metrics, batch, t0, t1, reshard_s + learner_s, r.mesh)
            _log(
                r,
                step,
                self.total,
                last,
                self.executor,
                eval_fn=evaluation[0],
                eval_every=evaluation[1],
            )
            if step % checkpoint_every == 0 or step == self.total:
                _save(r, step, state, seed=seed, position=position, last=last)
        return step, position, last


def update_unless_control(r, train_step, state, rollout, learner_config, pad_to_multiple, rows):
    """``_update``, or at learning rate 0 only the step count (a control run's rollouts).

    AdamW at learning rate 0 moves nothing (weight decay is scaled by it too): a control
    run is its rollouts, without the update's cost.
    """
    if learner_config.learning_rate == 0:
        return dataclasses.replace(state, step=state.step + 1), {}, [], 0.0
    return _update(r, train_step, state, rollout, pad_to_multiple=pad_to_multiple, rows=rows)


def _update(r: run_lib.Run, train_step, state, rollout, *, pad_to_multiple: int, rows: int):
    """One GRPO update on a rollout's samples: (state, train metrics, batches, reshard seconds).

    Without a mesh and with micro-batches, the rows go longest first in micro-batches of
    their own lengths (``samples.make_micro_batches``); otherwise in one batch, padded to
    the largest of all processes'. The actor is moved to the learner layout, and the new
    adapters synced into it.
    """
    micro = train_step.micro_batch_size
    if r.mesh is None and micro:
        batches = samples.make_micro_batches(
            rollout.samples, micro_batch_size=micro, pad_to_multiple=pad_to_multiple
        )
    else:
        batch = samples.make_batch(
            rollout.samples, pad_to_multiple=pad_to_multiple, rows_multiple=rows
        )
        batches = [parallel.pad_to_largest_batch(batch)]
    reshard_s = r.to_layout(parallel.LEARNER_RULES)
    if r.mesh is not None:
        batches = [parallel.shard_batch(batches[0], r.mesh)]
    state, train_metrics = train_step(state, batches if len(batches) > 1 else batches[0])
    learner.sync_model(r.model, state)
    return state, train_metrics, batches, reshard_s


def _log(
    r: run_lib.Run, step: int, total: int, last: dict, executor, *, eval_fn, eval_every: int
) -> None:
    """Prints the step, runs ``eval_fn`` every ``eval_every`` steps, writes the step's metrics row."""
    loss = f"loss={last['train/loss']:.4f}" if "train/loss" in last else "no update (lr 0)"
    print(
        f"[train] step {step}/{total} {loss} reward={last['rollout/reward_mean']:.3f}", flush=True
    )
    row = dict(last)
    if eval_fn is not None and eval_every and step % eval_every == 0:
        found = eval_fn(step=step, model=r.model, tokenizer=r.tokenizer, executor=executor)
        row.update({f"eval/{name}": float(v) for name, v in found.items()})
    # One row per step, written before the step's checkpoint starts: a resumed run
    # keeps the rows up to its checkpoint and redoes the later steps (training.run).
    r.writer.write(step, row)


def _save(r: run_lib.Run, step: int, state, *, seed: int, position: int, last: dict) -> None:
    """Starts the step's checkpoint: the train state, the data position and the step's metrics."""
    extra = {
        "seed": seed,
        "data_position": position,
        "step": step,
        "mode": "grpo",
        "last_metrics": json.dumps(last),
    }
    r.checkpointer.save(step, state, extra=extra)


def _metrics(rollout, train_metrics, batch, t0: float, t1: float, reshard_s: float, mesh) -> dict:
    out = parallel.mean_metrics(dict(rollout.metrics))
    out.update({name: float(value) for name, value in train_metrics.items()})
    if batch:
        out.update(
            {
                "train/batch_rows": float(sum(b.input_ids.shape[0] for b in batch)),
                "train/batch_length": float(max(b.input_ids.shape[1] for b in batch)),
                "train/batch_tokens": float(sum(b.input_ids.size for b in batch)),
            }
        )
    out["time/rollout_seconds"] = t1 - t0
    out["time/update_seconds"] = time.perf_counter() - t1
    if mesh is not None:
        out["time/reshard_s"] = reshard_s
    return out
