"""What an evaluation mode is given (`Context`) and gives back (`ModeRun`), and the scoring modes share."""

import dataclasses
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pau_jax.env import runner
from pau_jax.env.episode import EpisodeConfig
from pau_jax.evaluation import score
from pau_jax.policy import backends
from pau_jax.policy.backends import Seat
from pau_jax.tasks import DatasetConfig

if TYPE_CHECKING:
    from pau_jax.sandbox import Executor


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """The settings of one evaluation, as given to `pipeline.evaluate` (see its Args).

    Attributes:
      out: the run folder (`run_dir`).
      policy: the agent's backend config.
      dataset: the evaluated task source.
      train_dataset: the train split for the baselines that learn from one (None: derived
        from `dataset`).
      episode_config, call_timeout_s, max_parallel_calls: how episodes run.
      scoring: how runs are scored (`score.ScoringConfig`).
      batch_size: episodes or tasks per policy call (`pipeline.evaluate`).
      baselines: mode name -> that baseline's own settings (the memory baseline's
        `MemoryConfig`, the ft baseline's adapter trainer); each mode reads its entry.
    """

    out: pathlib.Path
    policy: Any
    dataset: Any
    train_dataset: Any
    episode_config: EpisodeConfig
    call_timeout_s: float
    max_parallel_calls: int
    scoring: score.ScoringConfig
    batch_size: int | None
    baselines: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Context:
    """Everything a mode's `run` reads: the settings, the tasks, the sandbox and the seats.

    Attributes:
      options: the settings of the evaluation.
      specs: the evaluated tasks' episode specs.
      references: task id -> `TaskReference` (what scoring compares against).
      ids: the evaluated task ids (records of other tasks in a resumed file are ignored).
      executor: the sandbox.
      seats: builds a backend config into a policy (`backends.Backends`).
      agent, judge, coder: the seats, each under its name (None where no mode uses it).
      train: (specs, references) of the train split, for the modes that need it; else None.
    """

    options: Options
    specs: Sequence[Any]
    references: Mapping[str, Any]
    ids: frozenset[str]
    executor: "Executor"
    seats: backends.Backends
    agent: Seat | None
    judge: Seat | None
    coder: Seat
    train: tuple[Sequence[Any], Mapping[str, Any]] | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModeRun:
    """What a mode produced.

    Attributes:
      runs: run name -> scored records (the mode, and `<mode>+observations` for the coder
        variant that sees the observed calls).
      baseline: what `metrics.json` records under `baselines[<mode>]` (None: nothing).
    """

    runs: dict[str, list[dict]]
    baseline: dict | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mode:
    """One evaluation mode: its `run`, the check of its requirements, and what it needs.

    Attributes:
      run: `run(context) -> ModeRun`.
      check: `check(modes, options)`, called before anything runs; raises `ValueError`
        when the mode's requirements are missing (None: nothing to check).
      needs_agent: the mode runs the agent (and so the judge grades it).
      needs_train: the mode learns from the train split (`Context.train`).
      compared_with: modes this one is compared with, paired by task, when both ran
        (`metrics.json` `comparisons["<mode> vs <other>"]`).
      ensembled_with: modes whose per-task best code match with this one is reported
        when both ran (`max_ensemble["max(<mode>, <other>)"]`).
    """

    run: Callable[[Context], ModeRun]
    check: Callable[[tuple[str, ...], Options], None] | None = None
    needs_agent: bool = True
    needs_train: bool = False
    compared_with: tuple[str, ...] = ()
    ensembled_with: tuple[str, ...] = ()


def episodes_path(context: Context, mode: str) -> pathlib.Path:
    """The resumable episode file of `mode`."""
    return context.options.out / f"{mode}_episodes.jsonl"


def train_dataset(options: Options):
    """The train split the baselines learn from."""
    if options.train_dataset is not None:
        return options.train_dataset
    if isinstance(options.dataset, DatasetConfig):
        return dataclasses.replace(options.dataset, split="train", limit=None)
    raise ValueError(
        "the memory and ft modes need the train split of the pau dataset: evaluate a "
        "DatasetConfig, or set train_dataset=DatasetConfig(split='train', ...)"
    )


def score_episodes(context: Context, mode: str) -> dict[str, list[dict]]:
    """Scores the episodes of `mode` (its episode file) once per coder variant.

    Returns:
      Run name -> scored records: `mode` and/or `<mode>+observations`, as
      `ScoringConfig.coder_observations` asks; the judge rates each episode once.
    """
    options = context.options
    path = episodes_path(context, mode)
    records = [r for r in runner.load_records(path) if r["task_id"] in context.ids]
    print(f"[eval] {mode}: {len(records)} episodes in {path.name}", flush=True)
    runs, judged, scoring = {}, None, options.scoring
    for with_obs in scoring.coder_observations:
        name = f"{mode}+observations" if with_obs else mode
        scored = score.score_into_file(
            records,
            context.references,
            options.out / f"{name}_scored.jsonl",
            judge_policy=context.judge,
            coder_policy=context.coder,
            executor=context.executor,
            with_observations=with_obs,
            judged=judged,
            attribute=scoring.attribute_failures,
            low_code_match=scoring.low_code_match,
            low_judge_score=scoring.low_judge_score,
            batch_size=scoring.batch_size,
            timeout_s=scoring.timeout_s,
        )
        judged = judged or {r["task_id"]: r for r in scored}
        runs[name] = scored
    return runs
