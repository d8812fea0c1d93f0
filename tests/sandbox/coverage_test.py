"""Coverage measured in the sandbox agrees with coverage.py run independently on the same calls."""

import json
import subprocess
import sys
import textwrap

import pytest

from pau_jax.sandbox import analyse_source

TIMEOUT = 30.0

SOURCES = {
    "branches": (
        textwrap.dedent(
            """\
            def test_func(x, y):
                if x > y:
                    r = x - y
                elif x == y:
                    r = 0
                else:
                    r = y - x
                for i in range(3):
                    if i == r:
                        break
                else:
                    r += 100
                return r
            """
        ),
        [(5, 2), (1, 4)],
    ),
    "loops_and_exceptions": (
        textwrap.dedent(
            """\
            import math

            def helper(v):
                try:
                    return math.sqrt(v)
                except ValueError:
                    return None
                finally:
                    pass

            def test_func(xs):
                total = 0
                seen = {
                    x
                    for x in xs
                    if x % 2
                }
                while xs and total < 10:
                    total += xs.pop()
                roots = [helper(v) for v in seen]
                return (total, sorted(r for r in roots if r is not None))
            """
        ),
        [([1, 2, 3, -5],), ([],), ([4, 4, 4, 4],)],
    ),
    "nested_and_early_exit": (
        textwrap.dedent(
            """\
            def test_func(s, k=2):
                def inner(c):
                    return c.upper() if c.isalpha() else c

                if not s:
                    return ''
                out = []
                for i, c in enumerate(s):
                    if i >= k and c == ' ':
                        continue
                    out.append(inner(c))
                assert len(out) <= len(s)
                return ''.join(out)
            """
        ),
        [("ab c1 ",), ("",), ("xy", 5)],
    ),
}

_INDEPENDENT = """
import coverage, importlib.util, json, sys
path, inputs = sys.argv[1], json.loads(sys.argv[2])
cov = coverage.Coverage(data_file=None, branch=True, config_file=False, include=[path])
cov.start()
spec = importlib.util.spec_from_file_location("measured", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
for args in inputs:
    module.test_func(*args)
cov.stop()
_, statements, _, missing, _ = cov.analysis2(path)
stats = cov.branch_stats(path)
data = cov.get_data()
print(json.dumps({
    "statements": statements,
    "missing": missing,
    "n_branches": sum(total for total, _ in stats.values()),
    "n_taken": sum(taken for _, taken in stats.values()),
    "lines": sorted(data.lines(data.measured_files().pop())),
    "arcs": sorted(data.arcs(data.measured_files().pop())),
}))
"""


def _independent(tmp_path, source, inputs):
    path = tmp_path / "measured.py"
    path.write_text(source)
    out = subprocess.run(
        [sys.executable, "-c", _INDEPENDENT, str(path), json.dumps(inputs)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_coverage_agrees_with_coverage_py(executor, tmp_path, name):
    source, inputs = SOURCES[name]
    results = executor.call_many(source, inputs, timeout_s=TIMEOUT, measure_coverage=True)
    assert all(r.ok for r in results), results
    records = [r.coverage for r in results]
    analysis = analyse_source(source)
    summary = analysis.summarize(records)
    expected = _independent(tmp_path, source, inputs)

    assert sorted(analysis.statements) == expected["statements"]
    assert summary.n_statements == len(expected["statements"])
    assert sorted(summary.missing_lines) == expected["missing"]
    assert summary.n_executed == len(expected["statements"]) - len(expected["missing"])
    assert summary.n_branches == expected["n_branches"] == len(analysis.branch_arcs)
    assert summary.n_executed_branches == expected["n_taken"]
    assert sorted(set().union(*(r.lines for r in records))) == expected["lines"]
    assert sorted(set().union(*(r.arcs for r in records))) == [tuple(a) for a in expected["arcs"]]
    assert 0 < summary.branch_percent <= 100 and 0 < summary.statement_percent <= 100


def test_single_call_coverage_and_percentages(executor, tmp_path):
    source, inputs = SOURCES["branches"]
    first = executor.call(source, inputs[0], timeout_s=TIMEOUT, measure_coverage=True)
    expected = _independent(tmp_path, source, inputs[:1])
    assert sorted(first.coverage.lines) == expected["lines"]
    summary = analyse_source(source).summarize([first.coverage])
    n_statements = len(expected["statements"])
    assert summary.statement_percent == pytest.approx(
        100.0 * (n_statements - len(expected["missing"])) / n_statements
    )
    assert summary.branch_percent == pytest.approx(
        100.0 * expected["n_taken"] / expected["n_branches"]
    )
    assert summary.branch_percent < 100.0


def test_coverage_is_per_call_and_absent_when_not_asked(executor):
    source, inputs = SOURCES["branches"]
    a, b = executor.call_many(source, inputs, timeout_s=TIMEOUT, measure_coverage=True)
    assert a.coverage.lines != b.coverage.lines
    assert 3 in a.coverage.lines and 3 not in b.coverage.lines
    plain = executor.call(source, inputs[0], timeout_s=TIMEOUT)
    assert plain.coverage is None and plain.value == a.value


def test_coverage_of_a_failing_call(executor):
    source = "def test_func(x):\n    if x:\n        raise ValueError('no')\n    return 1\n"
    result = executor.call(source, (1,), timeout_s=TIMEOUT, measure_coverage=True)
    assert result.error_type == "ValueError"
    assert {1, 2, 3} <= result.coverage.lines and 4 not in result.coverage.lines


def test_analysis_of_invalid_source_fails():
    from coverage.exceptions import NotPython

    with pytest.raises(NotPython):
        analyse_source("def broken(:\n")
