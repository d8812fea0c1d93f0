"""The AAC run mode: rollouts with the actor, step rewards from the frozen critic, GRPO on LoRA.

``train`` reads top to bottom: open the run (``training.run``: mesh → actor
with adapters → checkpointer) → tasks (``tasks.load_tasks``) → learner →
resume → per step: sampler layout → task groups → ``rollout.collect`` →
``samples.make_batch`` (or ``make_micro_batches``) → learner layout → train
step → sync → optional evaluation → log → checkpoint → PEFT adapter export;
each stage that takes more than a line is a function below it (``_run_settings``, ``_learner``,
``_critic``) or in ``steps`` (``StepLoop``: rollout, update, log, checkpoint). Every argument is keyword-only
and gin-bindable (``pau_jax.experiment.train``). Distillation is its own run
mode (``sft.distill.distill``).

Resuming: a run directory that already holds a checkpoint continues from its
latest step, with the train state, the data position and the sampling seeds it
had, so an interrupted run and an uninterrupted one take the same steps. Each
step writes one metrics row (training and, when due, evaluation metrics) before
its checkpoint is started; a resumed run drops the rows of the steps after its
checkpoint and takes them again, so every step is logged once. The checkpoint
also keeps the step's metrics, so a rerun of a finished run reports them. The
run holds its directory while it runs (``run_claim``): a second process writing
into it stops with one line, and so does a rerun whose settings differ from those
of the run's first start (``fingerprint.json``; ``_fingerprint`` says what may change).
"""

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence

from pau_jax import metrics_writer, parallel, run_claim
from pau_jax.env import prompts
from pau_jax.env.episode import EpisodeConfig
from pau_jax.env.runner import EpisodeSpec
from pau_jax.policy import backends
from pau_jax.policy.backends import SELF
from pau_jax.rl import credit, learner
from pau_jax.rl.critic import CRITIC_PROMPT_VERSION, CriticConfig
from pau_jax.rl.learner import LearnerConfig
from pau_jax.rl.rewards import RewardConfig
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.rl.steps import StepLoop
from pau_jax.sandbox import Executor
from pau_jax.tasks import DatasetConfig, DemoTasksConfig, load_tasks
from pau_jax.training import run as run_lib
from pau_jax.training.run import ActorConfig


def _critic(critic, r: run_lib.Run, critic_config: CriticConfig, specs):
    """``critic(seed) -> policy``: the frozen base model (``'self'``) or another backend.

    ``'self'`` and a served critic (``HTTPBackendConfig``, from ``_served_critic``)
    sample with the step's seed; another backend is built once and keeps its own.

    ``'self'`` gets a new prefix cache each step, on purpose: the critic's prompts of two
    steps share only their first 47 tokens (Qwen2.5's template, the system text and
    ``Function header:`` and ``def``; measured with the real tokenizer) unless a task comes back, and
    one call already prefills what its prompts share once (``share_within_call``), so a
    cache kept across steps would save well under a second of prefill a step while
    holding its blocks through the learner's update, the step's memory peak.
    """
    if critic == SELF:
        sampling, gib = critic_config.sampling, critic_config.prefix_cache_gib
        return lambda seed: r.base_policy(
            dataclasses.replace(sampling, seed=seed), prefix_cache_gib=gib
        )
    if isinstance(critic, backends.HTTPBackendConfig):
        return lambda seed: backends.build_policy(
            dataclasses.replace(critic, http=dataclasses.replace(critic.http, seed=seed)), specs
        )
    policy = backends.build_policy(critic, specs)
    return lambda seed: policy


def _served_critic(critic, critic_config: CriticConfig):
    """``critic``, a served one (``HTTPBackendConfig``) sampling as ``critic_config.sampling``.

    Its endpoint is sent the critic's temperature and ``max_new_tokens`` (the
    released critic: temperature 1, 300 tokens). The seat's ``HTTPConfig`` may
    leave them at their defaults or repeat them; another value is refused.
    """
    if not isinstance(critic, backends.HTTPBackendConfig):
        return critic
    sampling, http = critic_config.sampling, critic.http
    defaults = {f.name: f.default for f in dataclasses.fields(http)}
    wanted = {"temperature": sampling.temperature, "max_tokens": sampling.max_new_tokens}
    for field, value in wanted.items():
        given = getattr(http, field)
        if given not in (defaults[field], value):
            raise ValueError(
                f"the critic seat's HTTPConfig.{field}={given} differs from the critic's sampling "
                f"({value}); set it once, in CriticConfig.sampling (gin: critic/SamplingConfig)"
            )
    return dataclasses.replace(critic, http=dataclasses.replace(http, **wanted))


def _from_run(name: str, config, field: str, value):
    """``value`` for a field that must equal a setting of the run; its default defers to it."""
    given = getattr(config, field)
    default = {f.name: f.default for f in dataclasses.fields(config)}[field]
    if given not in (default, value):
        raise ValueError(
            f"{name}={given} differs from the run's {value}; leave it at its default "
            f"({default}): the run sets it"
        )
    return value


def _resume(r: run_lib.Run, state, seed: int) -> tuple[object, int, dict]:
    """(train state, task position, metrics of the step) of this run's latest checkpoint.

    The fresh state, position 0 and no metrics when the run has no checkpoint.
    """
    latest = r.checkpointer.latest_step()
    if latest is None:
        return state, 0, {}
    state, extra = r.checkpointer.restore(latest, state)
    if extra.get("seed") != seed or extra.get("mode", "grpo") != "grpo":
        raise ValueError(
            f"{r.out} holds a checkpoint of another run (seed={extra.get('seed')}, "
            f"mode={extra.get('mode', 'grpo')}); use a new run_dir"
        )
    print(
        f"[train] resuming from step {latest} (task position {extra['data_position']})",
        flush=True,
    )
    if "last_metrics" in extra:  # JSON text: the metrics may hold NaN, which JSON values may not.
        last = json.loads(extra["last_metrics"])
    else:  # A checkpoint of an older version: the step's row of metrics.jsonl.
        rows = [row for row in metrics_writer.read_rows(r.out) if row["step"] == latest]
        last = {
            name: value
            for row in rows
            for name, value in row.items()
            if name not in ("step", "time") and not name.startswith("eval/")
        }
    return state, int(extra["data_position"]), last


def train(
    *,
    run_dir: str,
    actor: ActorConfig = ActorConfig(),
    seed: int = 0,
    dataset: DatasetConfig | DemoTasksConfig | None = None,
    tasks: Sequence[EpisodeSpec] | None = None,
    references: Mapping | None = None,
    episode_config: EpisodeConfig = EpisodeConfig(max_steps=40),
    rollout_config: RolloutConfig = RolloutConfig(),
    critic="self",
    critic_config: CriticConfig = CriticConfig(),
    reward_config: RewardConfig | None = None,
    advantage_fn: Callable = credit.final_plus_mean,
    learner_config: LearnerConfig = LearnerConfig(),
    epochs: float = 5.0,
    steps: int | None = None,
    pad_to_multiple: int = 64,
    rows_multiple: int = 8,
    checkpoint_every: int = 10,
    max_checkpoints: int | None = 3,
    eval_every: int = 0,
    eval_fn: Callable | None = None,
    mesh_config: parallel.MeshConfig | None = None,
    sandbox_workers: int = 4,
) -> dict:
    """Trains the actor's LoRA adapters with AAC; returns a summary.

    Args:
      run_dir: where checkpoints/, metrics, adapter/ and summary.json go (with
        ``fingerprint.json`` and ``run.lock``, ``run_claim``).
      actor: the model and its adapters (``training.run.ActorConfig``).
      seed: seeds the random model, the LoRA init, the task order and the sampling.
      dataset: the training tasks (``tasks.DatasetConfig`` / ``DemoTasksConfig``;
        None: the embedded demo tasks).
      tasks, references: explicit episode specs and their ``TaskReference``s
        (task id -> reference); override ``dataset``.
      episode_config: the protocol; ``max_steps`` is T_max.
      rollout_config: batch, group and sampling settings of the actor; its sampling
        temperature is also the learner's (``GRPOConfig.temperature`` is set from it).
      critic: ``'self'`` (the frozen base model, the paper's setup) or a backend of
        ``pau_jax.policy.backends`` (an endpoint is sent the critic's sampling).
      critic_config: the critic's prompts and sampling, with a fresh seed each step.
      reward_config: the reward schedule (None: defaults); its ``max_steps`` is set
        from ``episode_config.max_steps`` (T_max, one setting).
      advantage_fn: the credit function (``@pau_jax.rl.credit.final_plus_mean``, ...).
      learner_config: optimiser and GRPO constants. At learning rate 0 (a control run)
        the update is skipped: it could not change the adapters; the step's metrics then
        have no ``train/*`` or ``grpo/*`` entries.
      epochs: passes over the training tasks (used when ``steps`` is None).
      steps: number of training steps; overrides ``epochs``.
      pad_to_multiple: batch sequence length is rounded up to a multiple of this.
      rows_multiple: batch rows are rounded up to a multiple of this (and of the
        micro-batch size and the data-parallel devices) so that few shapes compile.
      checkpoint_every: save every N steps (and at the last step).
      max_checkpoints: checkpoints kept; None keeps all.
      eval_every: call ``eval_fn`` every N steps; 0 never.
      eval_fn: ``eval_fn(step=, model=, tokenizer=, executor=) -> dict`` of metrics.
      mesh_config: a device mesh; None runs on the default device. The model is
        loaded in the learner layout and moved to the sampler layout for rollouts
        when the two differ (``time/reshard_s``); in a multi-process run each
        process plays its share of the batch's tasks and only process 0 writes files.
      sandbox_workers: sandbox worker processes.
    """
    cfg = _run_settings(
        critic, critic_config, episode_config, rollout_config, learner_config, reward_config
    )
    source = dataset or DemoTasksConfig()
    if tasks is not None:  # Explicit tasks: a digest of them and of their references.
        source = run_claim.digest((tasks, references))
    settings = _fingerprint(actor=actor, seed=seed, tasks=source, advantage_fn=advantage_fn, **cfg)
    with (
        run_claim.claim(run_dir, kind="train", settings=settings, primary=parallel.is_primary()),
        run_lib.open_run(
            run_dir, actor, seed=seed, mesh_config=mesh_config, max_checkpoints=max_checkpoints
        ) as r,
        Executor(workers=sandbox_workers) as executor,
    ):
        specs, refs = _tasks(dataset, tasks, references, executor, episode_config)
        critic_for = _critic(cfg["critic"], r, critic_config, specs)
        state, train_step, position, last = _learner(r, cfg["learner_config"], seed)
        rows = math.lcm(rows_multiple, learner_config.micro_batch_size or 1, _batch_shards(r))
        k = rollout_config.tasks_per_batch
        total = steps if steps is not None else math.ceil(epochs * len(specs) / k)
        loop = StepLoop(r, executor, specs, refs, critic_for, train_step, seed, total, rows)
        step, position, last = loop.run(
            state,
            position,
            last,
            settings=dict(cfg, advantage_fn=advantage_fn, pad_to_multiple=pad_to_multiple),
            checkpoint_every=checkpoint_every,
            evaluation=(eval_fn, eval_every),
        )
        summary = {"mode": "grpo", "steps": step, "data_position": position}
        summary.update(credit=credit.describe(advantage_fn), last_metrics=last)
        return r.finish(summary)


def _run_settings(
    critic, critic_config, episode_config, rollout_config, learner_config, reward_config
):
    """The run's configs, by `train`'s argument names, with what the run sets: one setting each.

    The learner scores at the actor's sampling temperature; the rewards use the
    episode's T_max; a served critic samples as ``critic_config`` (``_served_critic``).
    Refuses a critic that is neither ``'self'`` nor a seat, and episodes without a
    step limit.
    """
    if critic != SELF and not hasattr(critic, "build"):
        raise ValueError(
            f"critic must be '{SELF}' (the frozen base model, the paper's critic) or a seat "
            f"of pau_jax.policy.backends (e.g. HTTPBackendConfig for an endpoint), got {critic!r}"
        )
    if episode_config.max_steps is None:
        raise ValueError("training needs a step limit: EpisodeConfig.max_steps (T_max, gin T_MAX)")
    temperature = _from_run(
        "GRPOConfig.temperature",
        learner_config.grpo,
        "temperature",
        rollout_config.sampling.temperature,
    )
    grpo_config = dataclasses.replace(learner_config.grpo, temperature=temperature)
    learner_config = dataclasses.replace(learner_config, grpo=grpo_config)
    reward_config = reward_config or RewardConfig()
    t_max = _from_run(
        "RewardConfig.max_steps", reward_config, "max_steps", episode_config.max_steps
    )
    reward_config = dataclasses.replace(reward_config, max_steps=t_max)
    return {
        "episode_config": episode_config,
        "rollout_config": rollout_config,
        "critic": _served_critic(critic, critic_config),
        "critic_config": critic_config,
        "reward_config": reward_config,
        "learner_config": learner_config,
    }


def _fingerprint(**settings) -> dict:
    """What produces a training run's steps: the settings its run directory is claimed with.

    Left out, as they may change when a run resumes: how many steps to run (``epochs``,
    ``steps``), the batch shapes (``pad_to_multiple``, ``rows_multiple``: padding changes
    no loss), checkpointing (``checkpoint_every``, ``max_checkpoints``), the evaluation
    during training (``eval_every``, ``eval_fn``: logged, not trained on), the device
    mesh (``mesh_config``) and ``sandbox_workers``; and the fields of
    ``run_claim.RESUMABLE_FIELDS``.
    """
    prompt_versions = {
        "episode": prompts.PROMPT_VERSION,
        "multi_turn": prompts.MULTI_TURN_PROMPT_VERSION,
        "critic": CRITIC_PROMPT_VERSION,
    }
    return {**settings, "prompt_versions": prompt_versions}


def _tasks(dataset, tasks, references, executor, episode_config):
    """(specs, references): the explicit ones, else those of ``dataset`` (default: the demo tasks)."""
    if tasks is not None:
        return list(tasks), references
    return load_tasks(dataset or DemoTasksConfig(), executor, episode_config)


def _learner(r: run_lib.Run, learner_config: LearnerConfig, seed: int):
    """(train state, compiled train step, task position, last metrics), resumed when the run has a checkpoint.

    The state (and the step's shardings) follow the run's mesh; the actor holds the state's adapters.
    """
    state = learner.init_state(r.model, learner_config)
    shardings = {}
    if r.mesh is not None:
        state = parallel.shard_state(state, r.mesh)
        shardings = parallel.train_step_shardings(r.model, state, r.mesh)
    train_step = learner.make_train_step(r.model, learner_config, **shardings)
    state, position, last = _resume(r, state, seed)
    learner.sync_model(r.model, state)
    return state, train_step, position, last


def _batch_shards(r: run_lib.Run) -> int:
    """Devices the rows of a batch are split over (the mesh axes of the logical `batch` axis)."""
    if r.mesh is None:
        return 1
    return math.prod(r.mesh.shape[a] for a in parallel.batch_sharding(r.mesh).spec[0] or ())
