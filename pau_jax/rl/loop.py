"""The AAC training loop: rollouts with the actor, step rewards from the frozen critic, GRPO on LoRA.

``train`` reads top to bottom: mesh → model (learner layout) → LoRA → tasks →
either the SFT ablations (``sft.distill.run``: teacher episodes, then behaviour
cloning) or the AAC loop (``_grpo``: learner → resume → per step: sampler
layout → task groups → ``rollout.collect`` → ``samples.make_batch`` → learner
layout → train step → sync → log → checkpoint → optional evaluation) → PEFT
adapter export. Every argument is keyword-only and gin-bindable
(``pau_jax.experiment.train``).

Resuming: a run directory that already holds a checkpoint continues from its
latest step, with the train state, the data position and the sampling seeds it
had, so an interrupted run and an uninterrupted one take the same steps.
"""

import dataclasses
import json
import math
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from pau_jax import checkpoint as checkpoint_lib
from pau_jax import metrics_writer, parallel
from pau_jax.env.episode import EpisodeConfig
from pau_jax.evaluation.runner import EpisodeSpec
from pau_jax.models import lora
from pau_jax.policy.http import HTTPConfig, HTTPPolicy
from pau_jax.policy.local import LocalPolicy, SamplingConfig
from pau_jax.rl import credit, learner, samples
from pau_jax.rl import critic as critic_lib
from pau_jax.rl import rollout as rollout_lib
from pau_jax.rl.critic import CriticConfig
from pau_jax.rl.learner import LearnerConfig
from pau_jax.rl.rewards import RewardConfig
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.sandbox import Executor
from pau_jax.sft import distill
from pau_jax.sft.trainer import SFTConfig

# Sampler calls one training step may make (rounds of its episodes); seeds of steps never overlap.
_SEEDS_PER_STEP = 10_000
SELF = "self"


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


def _load_model(run_dir: pathlib.Path, checkpoint, model_config, tokenizer, dtype, seed, mesh):
    """(model, tokenizer, checkpoint path): a checkpoint dir, or a random model written as one.

    With a mesh the weights are loaded straight into the learner layout.
    """
    from flax import nnx

    from pau_jax import models
    from pau_jax.models import qwen3
    from pau_jax.tokenizer import load_tokenizer, save_offline_tokenizer

    if checkpoint is None:
        if model_config is None:
            raise ValueError("train needs checkpoint= (an HF dir) or model_config= (random model)")
        checkpoint = run_dir / "base_model"
        if parallel.is_primary() and not (checkpoint / "config.json").exists():
            fresh = qwen3.Qwen3ForCausalLM(model_config, rngs=nnx.Rngs(seed))
            qwen3.save_hf(fresh, model_config, checkpoint)
            save_offline_tokenizer(checkpoint)
            del fresh
        parallel.barrier("base_model")
    model, _ = models.load_hf(checkpoint, dtype=dtype, mesh=mesh, rules=parallel.LEARNER_RULES)
    return model, load_tokenizer(tokenizer or checkpoint), str(checkpoint)


def _describe(policy) -> str:
    """A policy's class name, with the wrapped policy's (e.g. ``PrivilegedTeacher(LocalPolicy)``)."""
    inner = getattr(policy, "policy", None)
    name = type(policy).__name__
    return f"{name}({type(inner).__name__})" if inner is not None else name


def _load_tasks(executor, episode_config, dataset_config, data_dir, split):
    """(specs, references): the embedded demo tasks, or a built split of the `pau` dataset."""
    if dataset_config is None:
        from pau_jax import demo_tasks

        specs = demo_tasks.demo_specs(executor, episode_config)
        references = {
            t.task_id: critic_lib.Reference(description=t.description, code=t.code)
            for t in demo_tasks.DEMO_TASKS
        }
        return specs, references
    from pau_jax.evaluation import tasks

    if data_dir is None:
        raise ValueError("dataset_config needs data_dir (the TFDS data_dir the split was built in)")
    records = tasks.load_split(dataset_config, split, data_dir)
    return tasks.from_records(records, episode_config)


def _grpo(
    *,
    model,
    tokenizer,
    mesh,
    to_layout,
    base_policy,
    specs,
    references,
    executor,
    checkpointer,
    writer,
    seed,
    episode_config,
    rollout_config,
    critic_config,
    critic_endpoint,
    reward_config,
    advantage_fn,
    learner_config,
    total,
    epochs,
    pad_to_multiple,
    rows_multiple,
    checkpoint_every,
    eval_every,
    eval_fn,
    out,
) -> tuple[int, int, dict]:
    """The AAC loop of ``train`` (arguments as there); returns (step, data position, last metrics)."""
    # Learner (shardings from the mesh rules), and the state of an earlier run of this directory.
    state = learner.init_state(model, learner_config)
    shardings = {}
    if mesh is not None:
        state = parallel.shard_state(state, mesh)
        shardings = parallel.train_step_shardings(model, state, mesh)
    train_step = learner.TrainStep(model, learner_config, **shardings)
    position = 0
    latest = checkpointer.latest_step()
    if latest is not None:
        state, extra = checkpointer.restore(latest, state)
        if extra.get("seed") != seed or extra.get("mode", "grpo") != "grpo":
            raise ValueError(
                f"{out} holds a checkpoint of another run (seed={extra.get('seed')}, "
                f"mode={extra.get('mode', 'grpo')}); use a new run_dir"
            )
        position = int(extra["data_position"])
        print(f"[train] resuming from step {latest} (task position {position})", flush=True)
    learner.sync_model(model, state)
    shards = 1  # Rows are split over the mesh axes of the logical `batch` axis.
    if mesh is not None:
        shards = math.prod(mesh.shape[a] for a in parallel.batch_sharding(mesh).spec[0] or ())
    rows = math.lcm(rows_multiple, learner_config.micro_batch_size or 1, shards)
    critic = HTTPPolicy(critic_endpoint) if critic_endpoint is not None else None
    critic_sampling = SamplingConfig(
        max_new_tokens=critic_config.max_new_tokens,
        temperature=critic_config.temperature,
        enable_thinking=rollout_config.enable_thinking,
    )

    k = rollout_config.tasks_per_batch
    total = total if total is not None else math.ceil(epochs * len(specs) / k)
    step, last = int(state.step), {}
    while step < total:
        t0 = time.perf_counter()
        reshard_s = to_layout(parallel.SAMPLER_RULES)
        batch_tasks = [specs[i] for i in task_order(seed, position, len(specs), k)]
        actor = LocalPolicy(model, tokenizer, rollout_config.sampling(rollout_seed(seed, step)))
        step_critic = critic or base_policy(
            dataclasses.replace(critic_sampling, seed=critic_seed(seed, step))
        )
        rollout = rollout_lib.collect(
            parallel.process_split(batch_tasks),
            actor=actor.complete,
            critic=step_critic,
            executor=executor,
            references=references,
            config=rollout_config,
            episode_config=episode_config,
            reward_config=reward_config,
            critic_config=critic_config,
            advantage_fn=advantage_fn,
        )
        t1 = time.perf_counter()
        batch = samples.make_batch(
            rollout.samples, pad_to_multiple=pad_to_multiple, rows_multiple=rows
        )
        batch = parallel.pad_to_largest_batch(batch)
        reshard_s += to_layout(parallel.LEARNER_RULES)
        if mesh is not None:
            batch = parallel.shard_batch(batch, mesh)
        state, train_metrics = train_step(state, batch)
        learner.sync_model(model, state)
        position += k
        step += 1
        last = parallel.mean_metrics(dict(rollout.metrics))
        last.update({name: float(value) for name, value in train_metrics.items()})
        last.update(
            {
                "train/batch_rows": float(batch.input_ids.shape[0]),
                "train/batch_length": float(batch.input_ids.shape[1]),
                "time/rollout_seconds": t1 - t0,
                "time/update_seconds": time.perf_counter() - t1,
            }
        )
        if mesh is not None:
            last["time/reshard_s"] = reshard_s
        writer.write(step, last)
        print(
            f"[train] step {step}/{total} loss={last['train/loss']:.4f} "
            f"reward={last['rollout/reward_mean']:.3f}",
            flush=True,
        )
        if step % checkpoint_every == 0 or step == total:
            extra = {"seed": seed, "data_position": position, "step": step, "mode": "grpo"}
            checkpointer.save(step, state, extra=extra)
        if eval_fn is not None and eval_every and step % eval_every == 0:
            found = eval_fn(step=step, model=model, tokenizer=tokenizer, executor=executor)
            writer.write(step, {f"eval/{name}": float(v) for name, v in found.items()})
    return step, position, last


def train(
    *,
    run_dir: str,
    checkpoint: str | None = None,
    model_config=None,
    tokenizer: str | None = None,
    dtype: str = "float32",
    seed: int = 0,
    lora_rank: int = 16,
    lora_alpha: float = 16.0,
    lora_targets: Sequence[str] = lora.DEFAULT_TARGETS,
    episode_config: EpisodeConfig = EpisodeConfig(max_steps=40),
    rollout_config: RolloutConfig | None = None,
    critic_config: CriticConfig | None = None,
    critic_endpoint: HTTPConfig | None = None,
    reward_config: RewardConfig | None = None,
    advantage_fn: Callable = credit.return_to_go,
    learner_config: LearnerConfig | None = None,
    sft_config: SFTConfig | None = None,
    teacher=None,
    teacher_privileged: bool = False,
    teacher_show_code: bool = False,
    teacher_episodes_per_task: int = 1,
    mesh_config: parallel.MeshConfig | None = None,
    epochs: float = 5.0,
    steps: int | None = None,
    pad_to_multiple: int = 64,
    rows_multiple: int = 8,
    checkpoint_every: int = 10,
    max_checkpoints: int | None = 3,
    eval_every: int = 0,
    eval_fn: Callable | None = None,
    dataset_config: str | None = None,
    data_dir: str | None = None,
    split: str = "train",
    tasks: Sequence[EpisodeSpec] | None = None,
    references: Mapping | None = None,
    sandbox_workers: int = 4,
) -> dict:
    """Trains the actor's LoRA adapters with AAC (or SFT on a teacher); returns a summary.

    Args:
      run_dir: where checkpoints/, metrics, adapter/ and summary.json go.
      checkpoint: a Hugging Face directory (any architecture of ``pau_jax.models.load_hf``);
        None builds a random Qwen3 from ``model_config`` and writes it (with the
        offline tokenizer) to run_dir/base_model.
      model_config: a ``Qwen3Config`` for the random model.
      tokenizer: a tokenizer path or 'qwen3-offline'; default the checkpoint's own.
      dtype: parameter dtype of the base weights.
      seed: seeds the random model, the LoRA init, the task order and the sampling.
      lora_rank, lora_alpha, lora_targets: the adapters (paper: 16, 16, all linear).
      episode_config: the protocol; ``max_steps`` is T_max.
      rollout_config: batch, group and sampling settings of the actor (None: defaults).
      critic_config: the critic's prompts and budget (None: defaults).
      critic_endpoint: an OpenAI-compatible critic; None uses the local base model.
      reward_config: the reward schedule (``max_steps`` must equal T_max; None: defaults).
      advantage_fn: the credit function (``@pau_jax.rl.credit.return_to_go``, ...).
      learner_config: optimiser and GRPO constants (None: defaults).
      sft_config: when set, no GRPO: the run fine-tunes the LoRA on the teacher's
        episodes of the training tasks (DISTILL, CodeARC-SFT; see ``sft.distill``).
      teacher: the teacher's backend (a ``*BackendConfig`` of
        ``pau_jax.evaluation.pipeline``), or 'self' for the actor's own base model
        sampled with the rollout settings (self-distillation, said in the summary);
        required with ``sft_config``.
      teacher_privileged: wrap the teacher in ``PrivilegedTeacher`` (CodeARC-SFT):
        it sees the gold description; the recorded prompts do not.
      teacher_show_code: the privileged teacher also sees the source.
      teacher_episodes_per_task: teacher episodes per training task.
      mesh_config: a device mesh; None runs on the default device. The model is
        loaded in the learner layout and moved to the sampler layout for rollouts
        when the two differ (``time/reshard_s``); in a multi-process run each
        process plays its share of the batch's tasks and only process 0 writes files.
      epochs: passes over the training tasks (used when ``steps`` is None).
      steps: number of training steps; overrides ``epochs``.
      pad_to_multiple: batch sequence length is rounded up to a multiple of this.
      rows_multiple: batch rows are rounded up to a multiple of this (and of the
        micro-batch size and the data-parallel devices) so that few shapes compile.
      checkpoint_every: save every N steps (and at the last step).
      max_checkpoints: checkpoints kept; None keeps all.
      eval_every: call ``eval_fn`` every N steps; 0 never.
      eval_fn: ``eval_fn(step=, model=, tokenizer=, executor=) -> dict`` of metrics.
      dataset_config: 'default' or 'debug' to train on a built `pau` split; None
        uses ``tasks`` or the embedded demo tasks.
      data_dir: the TFDS data_dir of ``dataset_config``.
      split: the split to train on.
      tasks: explicit episode specs (with ``references``: task id -> object with
        ``.description`` and ``.code``); overrides the dataset.
      references: privileged information of ``tasks``.
      sandbox_workers: sandbox worker processes.
    """
    rollout_config = rollout_config or RolloutConfig()
    critic_config = critic_config or CriticConfig()
    reward_config = reward_config or RewardConfig()
    learner_config = learner_config or LearnerConfig()
    if learner_config.grpo.temperature != rollout_config.temperature:
        raise ValueError(
            f"GRPOConfig.temperature={learner_config.grpo.temperature} differs from "
            f"RolloutConfig.temperature={rollout_config.temperature}; the learner must score "
            "tokens at the sampling temperature (aac.gin binds both to %TEMPERATURE)"
        )
    if sft_config is None and teacher_privileged:
        raise ValueError("teacher_privileged needs sft_config (the teacher only serves SFT)")
    out = pathlib.Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    primary = parallel.is_primary()

    # Mesh, model (learner layout) and adapters.
    mesh = parallel.make_mesh(mesh_config) if mesh_config is not None else None
    model, tokenizer_, base_path = _load_model(
        out, checkpoint, model_config, tokenizer, dtype, seed, mesh
    )
    n_adapted = lora.apply_lora(
        model, rank=lora_rank, alpha=lora_alpha, targets=lora_targets, seed=seed
    )
    if mesh is not None:
        parallel.shard_model(model, mesh)
    relayout = mesh is not None and parallel.layouts_differ(model, mesh)
    mesh_text = "" if mesh is None else f"; mesh {dict(mesh.shape)} (relayout {relayout})"
    print(f"[train] base model {base_path}; LoRA on {n_adapted} modules{mesh_text}", flush=True)

    def to_layout(rules) -> float:
        return parallel.reshard(model, mesh, rules) if relayout else 0.0

    def base_policy(sampling: SamplingConfig) -> LocalPolicy:
        # The same base arrays with the adapters zeroed (no second copy); rebuilt after a move.
        return LocalPolicy(critic_lib.critic_model(model), tokenizer_, sampling)

    checkpointer = checkpoint_lib.Checkpointer(out / "checkpoints", max_to_keep=max_checkpoints)
    writer = metrics_writer.MetricsWriter(out)
    with Executor(workers=sandbox_workers) as executor:
        if tasks is None:
            specs, refs = _load_tasks(executor, episode_config, dataset_config, data_dir, split)
        else:
            specs, refs = list(tasks), references

        if sft_config is not None:  # DISTILL / CodeARC-SFT: behaviour cloning, no GRPO.
            to_layout(parallel.SAMPLER_RULES)
            if teacher is None:
                raise ValueError(
                    "the SFT ablations need a teacher: set --gin.TEACHER=<a *BackendConfig> "
                    "(the paper's DISTILL teacher is GPT-4o-mini through an endpoint) or "
                    "--gin.TEACHER=\"'self'\" for self-distillation from the base model"
                )
            if teacher == SELF:
                teacher_policy = base_policy(rollout_config.sampling(rollout_seed(seed, 0)))
            elif isinstance(teacher, str):
                raise ValueError(f"teacher must be a *BackendConfig or '{SELF}', got {teacher!r}")
            else:
                from pau_jax.evaluation import pipeline

                teacher_policy = pipeline.build_policy(teacher, specs)
            if teacher_privileged:
                from pau_jax.sft.teacher import PrivilegedTeacher

                teacher_policy = PrivilegedTeacher(
                    teacher_policy,
                    distill.teacher_references(specs, refs or {}),
                    show_code=teacher_show_code,
                )
            if teacher == SELF:
                print(
                    "[train] SELF-DISTILLATION: the teacher is the actor's own base model",
                    flush=True,
                )
            print(f"[train] SFT on the episodes of teacher {_describe(teacher_policy)}", flush=True)
            result = distill.run(
                model=model,
                tokenizer=tokenizer_,
                teacher_policy=teacher_policy,
                specs=specs,
                executor=executor,
                episode_config=episode_config,
                sft_config=sft_config,
                run_dir=out,
                checkpointer=checkpointer,
                writer=writer,
                seed=seed,
                episodes_per_task=teacher_episodes_per_task,
                enable_thinking=rollout_config.enable_thinking,
                before_training=lambda: to_layout(parallel.LEARNER_RULES),
                primary=primary,
                barrier=parallel.barrier,
            )
            step, position, last = result["steps"], 0, result["last_metrics"]
        else:
            step, position, last = _grpo(
                model=model,
                tokenizer=tokenizer_,
                mesh=mesh,
                to_layout=to_layout,
                base_policy=base_policy,
                specs=specs,
                references=refs,
                executor=executor,
                checkpointer=checkpointer,
                writer=writer,
                seed=seed,
                episode_config=episode_config,
                rollout_config=rollout_config,
                critic_config=critic_config,
                critic_endpoint=critic_endpoint,
                reward_config=reward_config,
                advantage_fn=advantage_fn,
                learner_config=learner_config,
                total=steps,
                epochs=epochs,
                pad_to_multiple=pad_to_multiple,
                rows_multiple=rows_multiple,
                checkpoint_every=checkpoint_every,
                eval_every=eval_every,
                eval_fn=eval_fn,
                out=out,
            )
    checkpointer.close()
    writer.close()

    # The trained adapters in PEFT format.
    if primary:
        lora.export_peft(model, out / "adapter", base_model_name_or_path=base_path)
    summary = {
        "mode": "sft" if sft_config is not None else "grpo",
        "steps": step,
        "data_position": position,
        "teacher": _describe(teacher_policy) if sft_config is not None else None,
        "self_distillation": sft_config is not None and teacher == SELF,
        "lora_modules": n_adapted,
        "seconds": round(time.perf_counter() - started, 2),
        "last_metrics": last,
    }
    if primary:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"[train] done: {step} steps; adapter: {out / 'adapter'}", flush=True)
    return summary
