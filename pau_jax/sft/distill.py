"""The SFT branch of a training run (DISTILL, CodeARC-SFT): teacher episodes, then behaviour cloning.

``run`` is what ``rl.loop.train`` does instead of GRPO when it is given an
``SFTConfig``: the teacher plays every training task
(``episodes_per_task`` times) with ``evaluation.runner.run_episodes``, the
records go to ``<run_dir>/teacher_episodes.jsonl`` (a rerun skips the episodes
already there), and the actor's LoRA adapters are fine-tuned on every step of
them with ``trainer.train_sft``. For CodeARC-SFT the teacher is wrapped in
``teacher.PrivilegedTeacher``: it sees the gold description (and optionally
the source) while the recorded prompts stay the agent's own.

A run directory that already holds the SFT checkpoint is not trained again:
the adapters are restored from it.
"""

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

from pau_jax.evaluation import runner
from pau_jax.rl import learner
from pau_jax.sft import teacher as teacher_lib
from pau_jax.sft import trainer
from pau_jax.sft.trainer import SFTConfig

EPISODES_FILE = "teacher_episodes.jsonl"


def teacher_references(specs: Sequence, references: Mapping) -> list[teacher_lib.Reference]:
    """``PrivilegedTeacher`` references of the specs' tasks (one per distinct task).

    Args:
      specs: ``runner.EpisodeSpec``s.
      references: task id -> object with ``.description`` and ``.code``.

    Raises:
      ValueError: a task has no reference.
    """
    out, seen = [], set()
    for spec in specs:
        task = spec.task
        if task.task_id in seen:
            continue
        if task.task_id not in references:
            raise ValueError(f"task {task.task_id!r} has no reference (gold description)")
        ref = references[task.task_id]
        out.append(
            teacher_lib.Reference(
                header=task.header,
                examples=tuple(task.examples),
                description=ref.description,
                code=getattr(ref, "code", "") or spec.code,
            )
        )
        seen.add(task.task_id)
    return out


def episode_specs(specs: Sequence, episodes_per_task: int) -> list:
    """The teacher's episodes: each task ``episodes_per_task`` times, ids ``<task id>#<k>``."""
    if episodes_per_task < 1:
        raise ValueError(f"episodes_per_task must be >= 1, got {episodes_per_task}")
    if episodes_per_task == 1:
        return list(specs)
    return [
        dataclasses.replace(spec, episode_id=f"{spec.task.task_id}#{k}")
        for spec in specs
        for k in range(episodes_per_task)
    ]


def collect(
    specs: Sequence,
    policy,
    executor,
    episode_config,
    path: pathlib.Path,
    *,
    primary: bool = True,
    barrier=None,
) -> list[dict]:
    """Runs the episodes not yet in ``path``; returns all records of ``specs`` in it.

    Every process runs the same episodes (a sharded local teacher needs all of
    them in every sampler call); only the primary one writes ``path``, which
    must lie on a filesystem every process sees (as the checkpoints do).

    Args:
      specs: the teacher's episodes (unique episode ids).
      policy: the teacher (``policy(conversations) -> replies``).
      executor: the sandbox ``Executor``.
      episode_config: the protocol.
      path: the JSONL file of the records.
      primary: whether this process writes the file.
      barrier: called with a name where processes must meet (None: one process).
    """
    done = runner.finished_ids(path)
    pending = [s for s in specs if s.episode_id not in done]
    if pending:
        print(f"[sft] teacher: {len(pending)} episodes ({len(done)} already in {path.name})")
        runner.run_episodes(
            pending, policy, executor, episode_config, out_path=path if primary else None
        )
    if barrier is not None:
        barrier("teacher_episodes")
    wanted = {s.episode_id for s in specs}
    records = [r for r in runner.load_records(path) if r.get("episode_id") in wanted]
    if len(records) != len(wanted):
        raise ValueError(f"{path} holds {len(records)} of the {len(wanted)} teacher episodes")
    return records


def run(
    *,
    model,
    tokenizer,
    teacher_policy,
    specs: Sequence,
    executor,
    episode_config,
    sft_config: SFTConfig,
    run_dir: pathlib.Path,
    checkpointer,
    writer,
    seed: int,
    episodes_per_task: int = 1,
    enable_thinking: bool = False,
    before_training=None,
    primary: bool = True,
    barrier=None,
) -> dict:
    """Collects teacher episodes and fine-tunes the model's LoRA on them (or restores the result).

    Args:
      model: the actor with LoRA adapters; afterwards they hold the result.
      tokenizer: the actor's tokenizer (its chat template renders the prompts).
      teacher_policy: the teacher, already wrapped for privileged information if wanted.
      specs: the training tasks.
      executor: the sandbox ``Executor``.
      episode_config: the protocol.
      sft_config: optimiser and batching of the fine-tuning.
      run_dir: where ``teacher_episodes.jsonl`` goes.
      checkpointer: a ``checkpoint.Checkpointer``; the final state is saved as
        step = number of optimizer steps.
      writer: the run's ``MetricsWriter``.
      seed: the run's seed (stored with the checkpoint and checked on resume).
      episodes_per_task: teacher episodes per training task.
      enable_thinking: passed to the chat template.
      before_training: called once after the episodes, before the first update
        (e.g. to move the model into the learner layout).
      primary: whether this process writes files.
      barrier: called with a name where processes must meet.

    Returns:
      {"steps", "episodes", "pairs", "last_metrics"}.
    """
    state = learner.init_state(model, sft_config.learner_config())
    latest = checkpointer.latest_step()
    if latest is not None:
        state, extra = checkpointer.restore(latest, state)
        if extra.get("seed") != seed or extra.get("mode") != "sft":
            raise ValueError(
                f"{run_dir} holds a checkpoint of another run (seed={extra.get('seed')}, "
                f"mode={extra.get('mode')}); use a new run_dir"
            )
        learner.sync_model(model, state)
        print(f"[sft] already trained ({latest} steps); restored the adapters", flush=True)
        return {"steps": latest, "episodes": extra.get("episodes"), "last_metrics": {}}

    path = pathlib.Path(run_dir) / EPISODES_FILE
    records = collect(
        episode_specs(specs, episodes_per_task),
        teacher_policy,
        executor,
        episode_config,
        path,
        primary=primary,
        barrier=barrier,
    )
    if before_training is not None:
        before_training()
    state, history = trainer.train_sft(
        model, tokenizer, records, sft_config, writer=writer, enable_thinking=enable_thinking
    )
    steps = len(history)
    pairs = sum(
        1
        for r in records
        for step in r["steps"]
        if step.get("parse_ok", True) or not sft_config.skip_unparsed
    )
    extra = {"seed": seed, "mode": "sft", "step": steps, "episodes": len(records)}
    checkpointer.save(steps, state, extra=extra)
    last = history[-1] if history else {}
    print(
        f"[sft] {steps} steps on {pairs} pairs from {len(records)} teacher episodes; "
        f"loss {last.get('sft/loss', float('nan')):.4f}",
        flush=True,
    )
    return {"steps": steps, "episodes": len(records), "pairs": pairs, "last_metrics": last}
