"""The full test split from the offline source files: survivors, behaviour, validators, coverage."""

import pathlib
import statistics

import pytest
import record_checks

from pau_jax.data import benchmark, build, sources
from pau_jax.sandbox import Executor

SOURCES_DIR = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "sources"


@pytest.mark.slow
@pytest.mark.skipif(
    not (SOURCES_DIR / "cruxeval.jsonl").is_file(), reason=f"offline sources not in {SOURCES_DIR}"
)
def test_full_test_split(tmp_path):
    paths = sources.locate(SOURCES_DIR, [f.key for f in sources.SOURCE_FILES])
    tasks = benchmark.evaluation_split_tasks(paths, benchmark.DEFAULT)
    result = build.build_records(tasks, benchmark.DEFAULT.pipeline, workers=2, progress=False)
    records = result.records
    assert len(records) + len(result.exclusions) == 1221
    assert len(records) >= 741
    assert statistics.fmean(r.statement_coverage for r in records) >= 0.99
    assert statistics.fmean(r.branch_coverage for r in records) >= 0.99
    with Executor(workers=2) as executor:
        record_checks.check_behaviour(records, tasks, executor)
        record_checks.check_validators(records, executor)
    record_checks.check_coverage(records, tmp_path)
