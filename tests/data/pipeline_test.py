"""End-to-end record construction on a fixed subset of the real source files, in the sandbox."""

import dataclasses
import pathlib

import pytest
import record_checks

from pau_jax.data import benchmark, build, pipeline, sources
from pau_jax.sandbox import Executor

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES_DIR = ROOT.parent / "shared" / "data" / "sources"
KEYS = [f.key for f in sources.SOURCE_FILES]
CONFIG = pipeline.PipelineConfig(
    max_candidates=150, min_statement_coverage=0.0, min_branch_coverage=0.0
)

pytestmark = pytest.mark.skipif(
    not (SOURCES_DIR / "cruxeval.jsonl").is_file(), reason=f"offline sources not in {SOURCES_DIR}"
)


def _subset():
    tasks = sources.evaluation_tasks(sources.locate(SOURCES_DIR, KEYS))
    by_source = {}
    for task in tasks:
        by_source.setdefault(task.source, []).append(task)
    # A fixed spread over each source: 8 CRUXEval, 6 MBPP, 6 HumanEval.
    picks = {"cruxeval": 8, "mbpp": 6, "humaneval": 6}
    subset = []
    for source, count in picks.items():
        items = by_source[source]
        subset += items[:: len(items) // count][:count]
    return subset


@pytest.fixture(scope="module")
def subset():
    return _subset()


@pytest.fixture(scope="module")
def built(subset):
    return build.build_records(subset, CONFIG, workers=2, progress=False)


@pytest.fixture(scope="module")
def executor():
    with Executor(workers=2) as ex:
        yield ex


def test_most_of_the_subset_survives(built, subset):
    assert len(built.records) + len(built.exclusions) == len(subset)
    assert len(built.records) >= len(subset) * 0.6
    for reason in {e.reason for e in built.exclusions}:
        assert reason in pipeline.REASONS


def test_anonymisation_preserves_behaviour_on_every_source_test(built, subset, executor):
    record_checks.check_behaviour(built.records, subset, executor)


def test_validators_accept_stored_inputs_and_reject_wrong_types(built, executor):
    record_checks.check_validators(built.records, executor)


def test_coverage_figures_agree_with_coverage_py(built, tmp_path):
    record_checks.check_coverage(built.records, tmp_path)


def test_two_builds_give_identical_records(built, subset):
    again = build.build_records(subset[::2], CONFIG, workers=2, progress=False)
    first = {r.task_id: r for r in built.records}
    assert again.records
    for record in again.records:
        assert record == first[record.task_id]
    assert {e.task_id for e in again.exclusions} <= {e.task_id for e in built.exclusions}


def _task(code, test, entry="f", task_id="X/1"):
    return sources.SourceTask(
        task_id=task_id,
        source="synthetic",
        entry_point=entry,
        code=code,
        description="",
        description_origin="none",
        test_code="def __pau_source_test(candidate):\n    f = candidate\n    " + test + "\n",
        test_inputs=(),
    )


@pytest.mark.parametrize(
    "code, test, reason",
    [
        ("import os\ndef f(x):\n    return os.getcwd()\n", "assert f(1)", pipeline.UNSAFE),
        ("def f(x, y=1):\n    return x\n", "assert f(1) == 1", pipeline.UNSUPPORTED),
        ("def f(x):\n    return x\n", "assert f(1) == 2", pipeline.SOURCE_TESTS_FAIL),
        (
            "import time\ndef f(x):\n    return x + time.perf_counter_ns() % 1000\n",
            "assert f(1) >= 1",
            pipeline.NONDETERMINISTIC,
        ),
        (
            "def f(x):\n    return f.__name__ * x\n",
            "assert f(1) == 'f'",
            pipeline.BEHAVIOUR_CHANGED,
        ),
        (
            "def f(x):\n    return 7\n",
            "assert f(1) == 7\n    assert f(2) == 7",
            pipeline.FEW_OUTPUTS,
        ),
        (
            "def f(x):\n    if isinstance(x, str):\n        return 'never'\n    return x + 1\n",
            "assert f(1) == 2\n    assert f(5) == 6",
            pipeline.LOW_COVERAGE,
        ),
    ],
)
def test_exclusion_reasons(code, test, reason):
    config = dataclasses.replace(CONFIG, max_candidates=60, min_statement_coverage=1.0)
    result = build.build_records([_task(code, test)], config, workers=1, progress=False)
    assert not result.records
    assert [e.reason for e in result.exclusions] == [reason]


def test_train_split_has_no_test_function_after_normalisation():
    paths = sources.locate(SOURCES_DIR, KEYS)
    test_tasks = sources.evaluation_tasks(paths)
    train = benchmark.training_split_tasks(paths, benchmark.DEFAULT)
    copy = dataclasses.replace(
        test_tasks[900],
        task_id="MBPP/9999",
        code=test_tasks[900].code.replace(test_tasks[900].entry_point, "renamed_copy"),
        entry_point="renamed_copy",
    )
    kept, dropped = benchmark.drop_test_duplicates([*train, copy], test_tasks)
    assert "MBPP/9999" in {e.task_id for e in dropped}
    test_forms = {benchmark.normalized_code(t.code, t.entry_point) for t in test_tasks}
    assert not any(benchmark.normalized_code(t.code, t.entry_point) in test_forms for t in kept)
    assert len(kept) >= 400
