"""The PAU benchmark's splits: which candidates go where, deduplication, descriptions, building."""

import ast
import builtins
import dataclasses
import pathlib

from absl import logging

from pau_jax.data import anonymize as anonymize_lib
from pau_jax.data import build, instruct_sources, pipeline, sources, verified_descriptions
from pau_jax.data.annotate import Annotator, AnnotatorConfig, AnnotatorError
from pau_jax.data.pipeline import Exclusion, PipelineConfig, Record

DUPLICATE = "duplicate of a test function"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchmarkConfig:
    """What one build of the benchmark contains.

    Attributes:
      name: config name ("default", "debug").
      per_source_limit: take at most this many candidates per source (None: all).
      instruct_sources: instruction datasets that may join the train split (keys of
        instruct_sources.INSTRUCT_SOURCES): those with a local copy in the manual
        directory, or all of them when reading from the hub is allowed.
      pipeline: record construction settings.
      workers: sandbox worker processes per executor.
      verified_min_fraction: a shipped verified description fills a record only if its
        coder matched at least this share of the held-out examples (`verified_descriptions.
        fill`; 1.0 keeps only those that matched all of them).
    """

    name: str
    per_source_limit: int | None = None
    instruct_sources: tuple[str, ...] = ("code_alpaca", "magicoder")
    pipeline: PipelineConfig = PipelineConfig()
    workers: int = 2
    verified_min_fraction: float = 0.5


DEFAULT = BenchmarkConfig(name="default")
DEBUG = BenchmarkConfig(
    name="debug",
    per_source_limit=10,
    instruct_sources=(),
    pipeline=PipelineConfig(max_candidates=120),
)
CONFIGS = {c.name: c for c in (DEFAULT, DEBUG)}


def _limit(tasks: list, limit: int | None) -> list:
    if limit is None:
        return tasks
    taken: dict[str, int] = {}
    kept = []
    for task in tasks:
        if taken.get(task.source, 0) < limit:
            taken[task.source] = taken.get(task.source, 0) + 1
            kept.append(task)
    return kept


def evaluation_split_tasks(paths: dict[str, pathlib.Path], config: BenchmarkConfig) -> list:
    """Candidates of the test split (CRUXEval, sanitized MBPP 11-510, HumanEval)."""
    return _limit(sources.evaluation_tasks(paths), config.per_source_limit)


def training_split_tasks(
    paths: dict[str, pathlib.Path],
    config: BenchmarkConfig,
    manual_dir: pathlib.Path | None = None,
    instruct_from_hub: bool = False,
) -> list:
    """Candidates of the train split: full MBPP ids 1-10 and 511-974, then instruction data.

    Args:
      paths: source files by key.
      config: which instruction datasets may be added.
      manual_dir: where local copies of instruction datasets are looked for (by their
        local_filename).
      instruct_from_hub: read instruction datasets without a local copy from the hub;
        otherwise they are left out (logged).
    """
    tasks = sources.load_mbpp_full(paths[sources.MBPP], sources.mbpp_train_ids())
    for key in config.instruct_sources:
        source = instruct_sources.INSTRUCT_SOURCES[key]
        local = pathlib.Path(manual_dir) / source.local_filename if manual_dir else None
        if local is not None and local.is_file():
            tasks += instruct_sources.load_instruct_tasks(source, str(local))
        elif instruct_from_hub:
            tasks += instruct_sources.load_instruct_tasks(source)
        else:
            logging.info(
                "train split without %s: no %s in the manual directory and hub reading is off",
                source.hub_id,
                source.local_filename,
            )
    return _limit(tasks, config.per_source_limit)


_BUILTINS = frozenset(dir(builtins))


def normalized_code(code: str, entry_point: str) -> str:
    """A form of a function that ignores names, docstrings, annotations and layout.

    The function is anonymised, then every non-builtin name is replaced by its order of
    first appearance, so that copies that differ only in naming compare equal.
    """
    try:
        tree = ast.parse(anonymize_lib.anonymize(code, entry_point).code)
    except (anonymize_lib.AnonymizeError, SyntaxError):
        tree = sources.parse_quietly(code)
    mapping: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in _BUILTINS:
            node.id = mapping.setdefault(node.id, f"v{len(mapping)}")
        elif isinstance(node, ast.arg):
            node.arg = mapping.setdefault(node.arg, f"v{len(mapping)}")
        elif isinstance(node, ast.FunctionDef):
            node.name = mapping.setdefault(node.name, f"v{len(mapping)}")
    return ast.dump(tree, annotate_fields=False)


def drop_test_duplicates(train: list, test: list) -> tuple[list, list[Exclusion]]:
    """Removes training candidates whose normalised code equals a test candidate's."""
    test_forms = {normalized_code(t.code, t.entry_point) for t in test}
    kept, dropped = [], []
    for task in train:
        if normalized_code(task.code, task.entry_point) in test_forms:
            dropped.append(Exclusion(task_id=task.task_id, source=task.source, reason=DUPLICATE))
        else:
            kept.append(task)
    return kept, dropped


def add_descriptions(
    records: tuple[Record, ...], annotator: Annotator | None
) -> tuple[Record, ...]:
    """Writes missing gold descriptions with the annotator; without one they stay empty."""
    if annotator is None:
        return records
    out = []
    for record in records:
        if not record.description:
            try:
                text = annotator.describe(record.original_code)
            except AnnotatorError as e:
                logging.warning("no description for %s: %s", record.task_id, e)
            else:
                record = dataclasses.replace(
                    record,
                    description=text,
                    description_origin=f"annotator:{annotator.config.model}",
                )
        out.append(record)
    return tuple(out)


def build_splits(
    paths: dict[str, pathlib.Path],
    config: BenchmarkConfig,
    *,
    annotator_config: AnnotatorConfig | None = None,
    manual_dir: pathlib.Path | None = None,
    instruct_from_hub: bool = False,
    progress: bool = True,
) -> dict[str, build.BuildResult]:
    """Builds the test and train splits.

    Args:
      paths: source files by key (see sources.locate).
      config: benchmark config.
      annotator_config: endpoint for descriptions still missing after the shipped,
        verified ones (`verified_descriptions`); None leaves them empty.
      manual_dir: folder with local copies of instruction datasets.
      instruct_from_hub: read instruction datasets without a local copy from the hub.
      progress: show progress bars.

    Returns:
      split name -> build result (records and exclusions).
    """
    test_tasks = evaluation_split_tasks(paths, config)
    train_tasks, duplicates = drop_test_duplicates(
        training_split_tasks(paths, config, manual_dir, instruct_from_hub),
        sources.evaluation_tasks(paths),
    )
    annotator = Annotator(annotator_config) if annotator_config else None
    verified = verified_descriptions.read()
    results = {}
    for name, tasks in (("test", test_tasks), ("train", train_tasks)):
        result = build.build_records(
            tasks,
            config.pipeline,
            workers=config.workers,
            progress=progress,
            description=f"pau/{config.name} {name}",
        )
        extra = tuple(duplicates) if name == "train" else ()
        # Shipped, execution-verified descriptions first; the annotator only for what is left.
        records = verified_descriptions.fill(
            result.records, verified, min_fraction=config.verified_min_fraction
        )
        results[name] = build.BuildResult(
            records=add_descriptions(records, annotator),
            exclusions=result.exclusions + extra,
        )
    return results


REASONS = (*pipeline.REASONS, DUPLICATE)
