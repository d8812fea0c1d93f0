"""The distillation run mode (DISTILL, CodeARC-SFT): teacher episodes, then behaviour cloning.

``distill`` (gin: ``pau_jax.experiment.distill``) opens a training run like AAC
does (``training.run``), lets the teacher play every training task
(``episodes_per_task`` times) with ``env.runner.run_episodes``, keeps the
records in ``<run_dir>/teacher_episodes.jsonl`` (a rerun skips the episodes
already there), and fine-tunes the actor's LoRA adapters on every step of them
with ``trainer.train_sft``. For CodeARC-SFT the teacher is wrapped in
``teacher.PrivilegedTeacher``: it sees the gold description (and optionally the
source) while the recorded prompts stay the agent's own.

A run directory that already holds the SFT checkpoint is not trained again:
the adapters are restored from it. The run holds its directory while it runs
(``run_claim``, as AAC training does): a second process writing into it stops with
one line, and so does a rerun with other settings than its first start's.
"""

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

from pau_jax import parallel, run_claim
from pau_jax.env import prompts, runner
from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy import backends
from pau_jax.policy.backends import SELF
from pau_jax.policy.config import SamplingConfig
from pau_jax.sandbox import Executor
from pau_jax.sft import trainer
from pau_jax.sft.teacher import PrivilegedTeacher
from pau_jax.sft.trainer import SFTConfig
from pau_jax.tasks import DatasetConfig, DemoTasksConfig, load_tasks
from pau_jax.training import run as run_lib
from pau_jax.training import step as step_lib
from pau_jax.training.run import ActorConfig

EPISODES_FILE = "teacher_episodes.jsonl"


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


def imitate(
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
    state = step_lib.init_state(model, sft_config.optimizer())
    latest = checkpointer.latest_step()
    if latest is not None:
        state, extra = checkpointer.restore(latest, state)
        if extra.get("seed") != seed or extra.get("mode") != "sft":
            raise ValueError(
                f"{run_dir} holds a checkpoint of another run (seed={extra.get('seed')}, "
                f"mode={extra.get('mode')}); use a new run_dir"
            )
        step_lib.sync_model(model, state)
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


def _fingerprint(**settings) -> dict:
    """What produces a distillation run's episodes and adapters: the settings its run
    directory is claimed with (``run_claim``).

    Left out, as they may change when a run resumes: ``max_checkpoints``,
    ``mesh_config``, ``sandbox_workers``, and the fields of ``run_claim.RESUMABLE_FIELDS``.
    """
    prompt_versions = {
        "episode": prompts.PROMPT_VERSION,
        "multi_turn": prompts.MULTI_TURN_PROMPT_VERSION,
    }
    return {**settings, "prompt_versions": prompt_versions}


def _describe(policy) -> str:
    """A policy's class name, with the wrapped policy's (e.g. ``PrivilegedTeacher(LocalPolicy)``)."""
    inner = getattr(policy, "policy", None)
    name = type(policy).__name__
    return f"{name}({type(inner).__name__})" if inner is not None else name


def _check_teacher(teacher) -> None:
    if teacher is None:
        raise ValueError(
            "distillation needs a teacher: set --gin.TEACHER=<a *BackendConfig> "
            "(the paper's DISTILL teacher is GPT-4o-mini through an endpoint) or "
            "--gin.TEACHER=\"'self'\" for self-distillation from the base model"
        )
    if isinstance(teacher, str) and teacher != SELF:
        raise ValueError(f"teacher must be a *BackendConfig or '{SELF}', got {teacher!r}")


def _teacher_policy(r, teacher, self_sampling: SamplingConfig, seed: int, specs):
    """The teacher's policy: the actor's base model ('self', seeded by the run) or a backend."""
    if teacher != SELF:
        return backends.build_policy(teacher, specs)
    print("[sft] SELF-DISTILLATION: the teacher is the actor's own base model", flush=True)
    return r.base_policy(dataclasses.replace(self_sampling, seed=self_sampling.seed + seed))


def distill(
    *,
    run_dir: str,
    teacher=None,
    actor: ActorConfig = ActorConfig(),
    seed: int = 0,
    dataset: DatasetConfig | DemoTasksConfig | None = None,
    tasks: Sequence | None = None,
    references: Mapping | None = None,
    episode_config: EpisodeConfig = EpisodeConfig(max_steps=40),
    sft_config: SFTConfig = SFTConfig(),
    self_sampling: SamplingConfig = SamplingConfig(temperature=1.0),
    privileged: bool = False,
    show_code: bool = False,
    episodes_per_task: int = 1,
    enable_thinking: bool = False,
    max_checkpoints: int | None = 3,
    mesh_config: parallel.MeshConfig | None = None,
    sandbox_workers: int = 4,
) -> dict:
    """Fine-tunes the actor's LoRA adapters on a teacher's episodes; returns a summary.

    Args:
      run_dir: where teacher_episodes.jsonl, checkpoints/, adapter/ and summary.json go.
      teacher: the teacher's backend (``pau_jax.policy.backends``), or 'self' for the
        actor's own base model sampled with ``self_sampling`` (self-distillation,
        said in the summary). Required.
      actor, seed, dataset, tasks, references, episode_config, max_checkpoints,
        mesh_config, sandbox_workers: as ``rl.loop.train``.
      sft_config: optimiser and batching of the fine-tuning.
      self_sampling: the 'self' teacher's sampling (its seed is the run's seed).
      privileged: wrap the teacher in ``PrivilegedTeacher`` (CodeARC-SFT): it sees the
        gold description; the recorded prompts do not.
      show_code: the privileged teacher also sees the source.
      episodes_per_task: teacher episodes per training task.
      enable_thinking: passed to the chat template when the pairs are rendered.
    """
    _check_teacher(teacher)
    source = dataset or DemoTasksConfig()
    if tasks is not None:  # Explicit tasks: a digest of them and of their references.
        source = run_claim.digest((tasks, references))
    settings = _fingerprint(
        actor=actor, seed=seed, tasks=source, episode_config=episode_config,
        sft_config=sft_config, teacher=teacher, privileged=privileged, show_code=show_code,
        self_sampling=self_sampling if teacher == SELF else None,
        episodes_per_task=episodes_per_task, enable_thinking=enable_thinking,
    )  # fmt: skip
    with (
        run_claim.claim(run_dir, kind="distill", settings=settings, primary=parallel.is_primary()),
        run_lib.open_run(
            run_dir,
            actor,
            seed=seed,
            mesh_config=mesh_config,
            max_checkpoints=max_checkpoints,
            tag="sft",
        ) as r,
        Executor(workers=sandbox_workers) as executor,
    ):
        if tasks is None:
            specs, refs = load_tasks(dataset or DemoTasksConfig(), executor, episode_config)
        else:
            specs, refs = list(tasks), references or {}
        r.to_layout(parallel.SAMPLER_RULES)
        policy = _teacher_policy(r, teacher, self_sampling, seed, specs)
        if privileged:
            policy = PrivilegedTeacher(policy, specs, refs, show_code=show_code)
        print(f"[sft] SFT on the episodes of teacher {_describe(policy)}", flush=True)
        result = imitate(
            model=r.model,
            tokenizer=r.tokenizer,
            teacher_policy=policy,
            specs=specs,
            executor=executor,
            episode_config=episode_config,
            sft_config=sft_config,
            run_dir=r.out,
            checkpointer=r.checkpointer,
            writer=r.writer,
            seed=seed,
            episodes_per_task=episodes_per_task,
            enable_thinking=enable_thinking,
            before_training=lambda: r.to_layout(parallel.LEARNER_RULES),
            primary=r.primary,
            barrier=parallel.barrier,
        )
        return r.finish(
            {
                "mode": "sft",
                "steps": result["steps"],
                "data_position": 0,
                "teacher": _describe(policy),
                "self_distillation": teacher == SELF,
                "last_metrics": result["last_metrics"],
            }
        )
