"""Where episodes come from: task sources, one reference type, one loader for every run mode.

A task source is a small frozen config; ``load_tasks`` turns it into episode
specs (what the agent sees and the code that answers its calls) and references
(what the critic, a privileged teacher and the graders know besides):

    specs, references = tasks.load_tasks(tasks.DemoTasksConfig(), executor, EpisodeConfig())

Training, distillation and evaluation all call ``load_tasks``; a new source is a
config class here with a ``load`` method, and a module that builds its specs and
``TaskReference``s (``docs/extending.md``); ``load_tasks`` has no branch per source.
"""

import dataclasses

from pau_jax.env.episode import EpisodeConfig
from pau_jax.tasks.reference import TaskReference

__all__ = ["DatasetConfig", "DemoTasksConfig", "TaskReference", "load_tasks"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoTasksConfig:
    """The tasks embedded in `pau_jax.tasks.demo` (no dataset needed)."""

    limit: int | None = None

    def load(self, executor, episode_config: EpisodeConfig):
        """(episode specs, task id -> ``TaskReference``) of the first ``limit`` demo tasks."""
        from pau_jax.tasks import demo

        specs, references = demo.load(executor, episode_config)
        return specs[: self.limit] if self.limit is not None else specs, references


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    """A built split of the TFDS `pau` dataset.

    Attributes:
      config: builder config ('default', 'debug').
      split: 'test' or 'train'.
      data_dir: the TFDS data_dir it was built into.
      limit: the first `limit` items (by task id, after `sources` and `per_source`); None:
        all.
      sources: keep only items of these source benchmarks ('humaneval', 'mbpp',
        'cruxeval'); None: all.
      per_source: keep the first `per_source` items (by task id) of each source, so a
        small evaluation mixes the benchmarks; None: all.
      build_if_missing: build it into `data_dir` first when absent (from
        `manual_dir`, or the builder's dummy data for the debug config).
      manual_dir: folder of source files for `build_if_missing`.
    """

    config: str = "default"
    split: str = "test"
    data_dir: str = "~/tensorflow_datasets"
    limit: int | None = None
    sources: tuple[str, ...] | None = None
    per_source: int | None = None
    build_if_missing: bool = False
    manual_dir: str | None = None

    def __post_init__(self):
        if self.per_source is not None and self.per_source < 1:
            raise ValueError(f"per_source must be >= 1 or None, got {self.per_source}")

    def load(self, executor, episode_config: EpisodeConfig):
        """(episode specs, task id -> ``TaskReference``) of the split's items (see ``load_tasks``)."""
        from pau_jax.tasks import pau_dataset

        if self.build_if_missing:
            pau_dataset.ensure_built(self.data_dir, config=self.config, manual_dir=self.manual_dir)
        records = pau_dataset.load_split(self.config, self.split, self.data_dir)
        if self.sources is not None:
            known = {r.source for r in records}
            unknown = sorted(set(self.sources) - known)
            if unknown:
                raise ValueError(
                    f"sources {unknown} are not in pau/{self.config} {self.split} "
                    f"(it has {sorted(known)})"
                )
            records = [r for r in records if r.source in self.sources]
        if self.per_source is not None:
            taken: dict[str, int] = {}
            kept = []
            for record in records:
                taken[record.source] = taken.get(record.source, 0) + 1
                if taken[record.source] <= self.per_source:
                    kept.append(record)
            records = kept
        if self.limit is not None:
            records = records[: self.limit]
        return pau_dataset.from_records(records, episode_config)


def load_tasks(source, executor, config: EpisodeConfig):
    """(episode specs, task id -> ``TaskReference``) of a task source.

    Args:
      source: a ``DatasetConfig`` or ``DemoTasksConfig`` (any config with
        ``load(executor, episode_config) -> (specs, references)``).
      executor: the sandbox (the demo tasks compute their examples' outputs in it).
      config: the episode protocol (how shown examples are displayed).

    Raises:
      TypeError: an unknown source.
      ValueError: ``sources`` names a benchmark the split does not have.
      FileNotFoundError: the split is not built.
    """
    if not callable(getattr(source, "load", None)):
        raise TypeError(
            f"the task source must be a DatasetConfig or DemoTasksConfig, got {source!r}"
        )
    return source.load(executor, config)
