"""Coverage figures agree with coverage.py measuring a real run of the same code."""

import importlib.util
import sys

import coverage
import pytest

from pau_jax.data.measure import CodeCoverage

CODE = """def helper(v):
    return [x
            for x in v
            if x > 0]

def test_func(arg0, arg1):
    total = 0
    for item in arg0:
        if item % 2 == 0 and item > arg1:
            total += item
        elif item < 0:
            total -= 1
        else:
            continue
    while total > 100:
        total //= 2
    try:
        return total, helper(arg0)
    except TypeError:
        return None
"""


def _coverage_py(tmp_path, inputs):
    path = tmp_path / "measured_mod.py"
    path.write_text(CODE)
    cov = coverage.Coverage(data_file=None, branch=True, config_file=False, include=[str(path)])
    tracer = sys.gettrace()
    cov.start()
    try:
        spec = importlib.util.spec_from_file_location("measured_mod", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for args in inputs:
            module.test_func(*args)
    finally:
        cov.stop()
        sys.settrace(tracer)
    _, statements, _, missing, _ = cov.analysis2(str(path))
    analysis = cov._analyze(str(path))
    return cov.get_data(), str(path), len(statements), len(missing), analysis.numbers


@pytest.mark.parametrize(
    "inputs",
    [
        [([2, 4], 0)],
        [([2, -3, 5], 1), ([], 0)],
        [([200, 300, -1, 7], 0), ([1], 5)],
    ],
)
def test_figures_match_coverage_py(tmp_path, inputs):
    data, path, n_statements, n_missing, numbers = _coverage_py(tmp_path, inputs)
    with CodeCoverage(CODE) as measured:
        figures = measured.figures(data.lines(path), data.arcs(path))
        assert figures.n_statements == n_statements == len(measured.statements)
        assert figures.statements == pytest.approx((n_statements - n_missing) / n_statements)
        assert figures.n_branches == numbers.n_branches == len(measured.branch_arcs)
        expected_branches = (numbers.n_branches - numbers.n_missing_branches) / numbers.n_branches
        assert figures.branches == pytest.approx(expected_branches)
        lines, arcs = measured.translate(data.lines(path), data.arcs(path))
        assert lines == measured.statements - set(figures.missing_statements)
        assert (measured.branch_arcs - arcs) == set(figures.missing_branches)
