"""Statement and branch coverage of a piece of code, computed with coverage.py's own analysis."""

import dataclasses
import os
import tempfile
from collections.abc import Iterable

import coverage
from coverage.python import PythonFileReporter
from coverage.results import analysis_from_file_reporter


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoverageFigures:
    """Coverage of a set of executions, as `coverage report --branch` counts it.

    Attributes:
      statements: fraction of statements executed (1.0 when there are none).
      branches: fraction of branch exits taken (1.0 when there are no branches).
      n_statements: number of statements.
      n_branches: number of branch exits.
      missing_statements: statement lines never executed.
      missing_branches: branch arcs (from_line, to_line) never taken.
    """

    statements: float
    branches: float
    n_statements: int
    n_branches: int
    missing_statements: tuple[int, ...]
    missing_branches: tuple[tuple[int, int], ...]


class CodeCoverage:
    """Static structure of one code text, and coverage figures for executions of it.

    Args:
      code: the Python module whose executions are measured (line numbers refer to it).
    """

    def __init__(self, code: str):
        self._dir = tempfile.TemporaryDirectory(prefix="pau_cov_")
        self.path = os.path.join(self._dir.name, "measured.py")
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(code)
        self._cov = coverage.Coverage(data_file=None, branch=True, config_file=False)
        self._reporter = PythonFileReporter(self.path, self._cov)
        parser = self._reporter.parser
        self.statements = frozenset(parser.statements)
        no_branch = self._reporter.no_branch_lines()
        branch_lines = {
            line
            for line, count in parser.exit_counts().items()
            if count > 1 and line not in no_branch
        }
        self.branch_arcs = frozenset(arc for arc in parser.arcs() if arc[0] in branch_lines)

    def close(self) -> None:
        self._dir.cleanup()

    def __enter__(self) -> "CodeCoverage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def translate(
        self, lines: Iterable[int], arcs: Iterable[tuple[int, int]]
    ) -> tuple[frozenset[int], frozenset[tuple[int, int]]]:
        """Maps raw traced lines and arcs to statement lines and arcs between statements."""
        parser = self._reporter.parser
        raw_arcs = list(arcs)
        return (
            frozenset(parser.translate_lines(lines)) & self.statements,
            frozenset(parser.translate_arcs(raw_arcs)),
        )

    def figures(self, lines: Iterable[int], arcs: Iterable[tuple[int, int]]) -> CoverageFigures:
        """Coverage figures of executions that traced `lines` and raw `arcs` (unions)."""
        data = coverage.CoverageData(no_disk=True)
        raw_arcs = sorted(set(arcs))
        if raw_arcs:
            data.add_arcs({self.path: raw_arcs})
        else:
            data.touch_file(self.path)
            data.add_arcs({self.path: []})
        analysis = analysis_from_file_reporter(data, 2, self._reporter, self.path)
        numbers = analysis.numbers
        missing_branches = sorted(
            (a, b) for a, bs in analysis.missing_branch_arcs().items() for b in bs
        )
        n_s, n_b = numbers.n_statements, numbers.n_branches
        return CoverageFigures(
            statements=1.0 if n_s == 0 else (n_s - numbers.n_missing) / n_s,
            branches=1.0 if n_b == 0 else (n_b - numbers.n_missing_branches) / n_b,
            n_statements=n_s,
            n_branches=n_b,
            missing_statements=tuple(sorted(analysis.missing)),
            missing_branches=tuple(missing_branches),
        )
