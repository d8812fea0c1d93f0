"""Building a split: every source task through the pipeline, in parallel, with a report."""

import collections
import concurrent.futures
import dataclasses
import statistics
from collections.abc import Callable, Sequence

import tqdm

from pau_jax.data import execution, pipeline
from pau_jax.data.pipeline import Exclusion, PipelineConfig, Record
from pau_jax.data.sources import SourceTask


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildResult:
    """Records in source-task order, and the exclusions."""

    records: tuple[Record, ...]
    exclusions: tuple[Exclusion, ...]

    def report(self) -> dict:
        """Counts per source, exclusion counts per reason, coverage distribution."""
        sources = sorted({r.source for r in self.records} | {e.source for e in self.exclusions})
        kept = collections.Counter(r.source for r in self.records)
        dropped = collections.Counter(e.source for e in self.exclusions)
        reasons = collections.Counter((e.source, e.reason) for e in self.exclusions)
        per_source = {s: {"candidates": kept[s] + dropped[s], "kept": kept[s]} for s in sources}
        found = {e.reason for e in self.exclusions}
        ordered = [r for r in pipeline.REASONS if r in found] + sorted(
            found - set(pipeline.REASONS)
        )
        exclusions = {
            reason: {s: reasons[(s, reason)] for s in sources if reasons[(s, reason)]}
            for reason in ordered
        }
        return {
            "per_source": per_source,
            "exclusions": exclusions,
            "statement_coverage": _distribution([r.statement_coverage for r in self.records]),
            "branch_coverage": _distribution([r.branch_coverage for r in self.records]),
            "heldout_per_item": _distribution([len(r.heldout) for r in self.records]),
            "excluded": {
                e.task_id: f"{e.reason}: {e.detail}" if e.detail else e.reason
                for e in self.exclusions
            },
        }


def _distribution(values: Sequence[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "mean": statistics.fmean(ordered),
        "min": ordered[0],
        "p10": ordered[len(ordered) // 10],
        "median": statistics.median(ordered),
        "max": ordered[-1],
        "fraction_at_max": sum(v == ordered[-1] for v in ordered) / len(ordered),
    }


def _build_one(task, executor, check_executor, config) -> Record | Exclusion:
    with execution.exclusive():
        return pipeline.build_record(task, executor, check_executor, config)


def default_executor_factory(workers: int) -> Callable[[], object]:
    """Factory of sandbox executors with `workers` worker processes each."""

    def make():
        from pau_jax.sandbox import Executor

        return Executor(workers=workers)

    return make


def build_records(
    tasks: Sequence[SourceTask],
    config: PipelineConfig,
    *,
    workers: int = 2,
    threads: int | None = None,
    progress: bool = True,
    executor_factory: Callable[[], object] | None = None,
    description: str = "building pau records",
) -> BuildResult:
    """Runs every task through the pipeline.

    Two executors are started: one for construction, one (separate worker processes) for
    the determinism check. Tasks run on `threads` threads so that the sandbox workers stay
    busy; results are collected in task order, so the output does not depend on timing.

    Args:
      tasks: source tasks.
      config: pipeline settings.
      workers: worker processes per executor.
      threads: concurrent tasks (default 2 * workers).
      progress: show a tqdm progress bar.
      executor_factory: makes an executor (a context manager); default pau_jax.sandbox.
      description: progress bar label.

    Returns:
      The records and the exclusions.
    """
    factory = executor_factory or default_executor_factory(workers)
    threads = threads or 2 * workers
    results: list[Record | Exclusion | None] = [None] * len(tasks)
    with factory() as executor, factory() as check_executor:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            futures = {
                pool.submit(_build_one, task, executor, check_executor, config): i
                for i, task in enumerate(tasks)
            }
            bar = tqdm.tqdm(total=len(tasks), desc=description, disable=not progress, unit="fn")
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
                bar.update(1)
            bar.close()
    records = tuple(r for r in results if isinstance(r, Record))
    exclusions = tuple(r for r in results if isinstance(r, Exclusion))
    return BuildResult(records=records, exclusions=exclusions)
