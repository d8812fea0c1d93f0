"""Checks of built records against independent runs (sandbox, source tests, coverage.py)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from pau_jax.data import argtypes
from pau_jax.data.execution import run_many
from pau_jax.sandbox import values

ROOT = pathlib.Path(__file__).resolve().parents[2]


def check_behaviour(records, tasks, executor):
    """Source tests pass on the anonymised code; outputs equal the original's on test inputs."""
    tasks = {t.task_id: t for t in tasks}
    for record in records:
        task = tasks[record.task_id]
        # The original is defined first: some tests call it by name as a reference.
        checker = "\n\n".join(
            [
                task.code,
                record.anonymized_code,
                task.test_code,
                "def __check():\n    __pau_source_test(test_func)\n    return True\n",
            ]
        )
        assert executor.call(checker, (), entry="__check", timeout_s=60).ok, record.task_id
        inputs = list(task.test_inputs)
        original = run_many(executor, task.code, inputs, entry=task.entry_point, timeout_s=5)
        renamed = run_many(executor, record.anonymized_code, inputs, entry="test_func", timeout_s=5)
        for a, b in zip(original, renamed):
            # A time-out says nothing about behaviour.
            assert a.unstable or b.unstable or a.same_behaviour(b), record.task_id


def check_validators(records, executor):
    """Stored inputs pass the validator with the stored outputs; wrong types raise TypeError."""
    for record in records:
        examples = record.shown + record.heldout
        results = executor.call_many(
            record.code, [values.decode(e.args) for e in examples], timeout_s=2
        )
        for example, result in zip(examples, results):
            assert result.ok, (record.task_id, example.args, result.error_message)
            assert result.encoded == example.output
        good = values.decode(examples[0].args)
        for i, type_text in enumerate(record.arg_types):
            spec = argtypes.parse(type_text)
            wrong = next(
                v for v in (12345, "wrong", b"bytes", 1.5, None) if not argtypes.matches(v, spec)
            )
            args = list(good)
            args[i] = wrong
            result = executor.call(record.code, tuple(args), timeout_s=2)
            assert not result.ok and result.error_type == "TypeError", record.task_id
            assert result.error_message.startswith(f"arg{i} must be {type_text}, got ")


_COVERAGE_SCRIPT = """
import importlib.util, json, sys
import coverage
from pau_jax.sandbox import values

items = json.load(open(sys.argv[1]))
out = {}
for i, item in enumerate(items):
    path = f"{sys.argv[2]}/measured_{i}.py"
    with open(path, "w") as f:
        f.write(item["code"])
    cov = coverage.Coverage(data_file=None, branch=True, config_file=False, include=[path])
    cov.start()
    spec = importlib.util.spec_from_file_location(f"measured_{i}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for args in item["inputs"]:
        module.test_func(*values.decode(args))
    cov.stop()
    report = f"{sys.argv[2]}/report_{i}.json"
    cov.json_report(outfile=report)
    totals = json.load(open(report))["totals"]
    out[item["task_id"]] = totals
print(json.dumps(out))
"""


def check_coverage(records, tmp_path):
    """Stored coverage equals coverage.py's report of a separate run of the held-out inputs."""
    items = [
        {"task_id": r.task_id, "code": r.anonymized_code, "inputs": [e.args for e in r.heldout]}
        for r in records
    ]
    (tmp_path / "items.json").write_text(json.dumps(items))
    script = tmp_path / "measure.py"
    script.write_text(_COVERAGE_SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "items.json"), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    totals = json.loads(run.stdout.strip().splitlines()[-1])
    for record in records:
        t = totals[record.task_id]
        assert record.n_statements == t["num_statements"]
        assert record.n_branches == t["num_branches"]
        assert record.statement_coverage == pytest.approx(t["covered_lines"] / t["num_statements"])
        if t["num_branches"]:
            expected = t["covered_branches"] / t["num_branches"]
            assert record.branch_coverage == pytest.approx(expected), record.task_id
