"""Statement and branch coverage of a function's source from executed lines and arcs, by coverage.py's rules."""

import dataclasses
import importlib
import os
import tempfile
from collections.abc import Iterable
from typing import Any

from pau_jax.sandbox.config import CoverageRecord


def _coverage() -> Any:
    """coverage.py, imported on first use (it is slow to import and workers rarely need it)."""
    return importlib.import_module("coverage")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoverageSummary:
    """Coverage numbers of a source, as coverage.py's ``report`` computes them.

    Attributes:
      n_statements: executable statements.
      n_executed: statements executed.
      n_branches: possible branch destinations (exits of lines with more than one exit).
      n_executed_branches: branch destinations taken.
      missing_lines: statements never executed.
      missing_branch_arcs: (line, destination) branches never taken.
    """

    n_statements: int
    n_executed: int
    n_branches: int
    n_executed_branches: int
    missing_lines: frozenset[int]
    missing_branch_arcs: frozenset[tuple[int, int]]

    @property
    def statement_percent(self) -> float:
        """Executed statements in percent (100 when there are none)."""
        return 100.0 * self.n_executed / self.n_statements if self.n_statements else 100.0

    @property
    def branch_percent(self) -> float:
        """Taken branches in percent (100 when there are none)."""
        return 100.0 * self.n_executed_branches / self.n_branches if self.n_branches else 100.0


class SourceAnalysis:
    """coverage.py's static analysis of one source: its statements and possible branches.

    Attributes:
      statements: line numbers of executable statements.
      branch_arcs: possible (line, destination) arcs leaving lines that have more than one
        exit, excluding those coverage.py does not count.
    """

    def __init__(self, source: str):
        handle, path = tempfile.mkstemp(suffix=".py", prefix="pau_source_")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as f:
                f.write(source)
            coverage = _coverage()
            reporter_class = importlib.import_module("coverage.python").PythonFileReporter
            self._coverage = coverage.Coverage(data_file=None, branch=True, config_file=False)
            self._reporter = reporter_class(path, coverage=self._coverage)
            self.statements = frozenset(self._reporter.lines())
            arcs = self._reporter.arcs()
            exits = self._reporter.exit_counts()
            excluded = self._reporter.excluded_lines()
            self._reporter.no_branch_lines()
        finally:
            os.remove(path)
        self._filename = self._reporter.filename
        branch_lines = {line for line, count in exits.items() if count > 1}
        self.branch_arcs = frozenset(
            a for a in arcs if a[0] in branch_lines and a[1] not in excluded
        )

    def summarize(self, records: Iterable[CoverageRecord]) -> CoverageSummary:
        """Coverage of the union of the given calls' records.

        Args:
          records: per-call records from ``Executor.call(..., measure_coverage=True)``.

        Returns:
          The numbers coverage.py would report for a run that made exactly these calls.
        """
        arcs: set[tuple[int, int]] = set()
        for record in records:
            arcs.update(record.arcs)
        data = _coverage().CoverageData(no_disk=True)
        data.add_arcs({self._filename: arcs})
        results = importlib.import_module("coverage.results")
        analysis = results.analysis_from_file_reporter(data, 0, self._reporter, self._filename)
        numbers = analysis.numbers
        missing_arcs = analysis.missing_branch_arcs()
        return CoverageSummary(
            n_statements=numbers.n_statements,
            n_executed=numbers.n_executed,
            n_branches=numbers.n_branches,
            n_executed_branches=numbers.n_executed_branches,
            missing_lines=frozenset(analysis.missing),
            missing_branch_arcs=frozenset(
                (a, b) for a, dests in missing_arcs.items() for b in dests
            ),
        )


def analyse_source(source: str) -> SourceAnalysis:
    """coverage.py's analysis of ``source`` (statements and possible branch arcs).

    Raises:
      coverage.exceptions.NotPython: the source does not parse.
    """
    return SourceAnalysis(source)
