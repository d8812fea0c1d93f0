"""Checks the Bazel-style BUILD files against the source tree.

Bazel cannot run here, so every BUILD file is evaluated as Starlark (a Python
subset) with stub rule functions, and the declared sources are compared with
the files that exist.
"""

import pytest
from buildfiles import COVERED_DIRS, ROOT, _build_files, _evaluate


def _declared_sources():
    declared = set()
    for build in _build_files():
        for _, kwargs in _evaluate(build):
            for src in kwargs.get("srcs", []):
                if src.startswith(":"):
                    continue
                declared.add((build.parent / src).resolve())
    return declared


def test_build_files_parse_and_rules_are_named():
    builds = _build_files()
    assert builds, "no BUILD files found"
    for build in builds:
        rules = _evaluate(build)
        assert rules, f"{build.relative_to(ROOT)} declares no rules"
        names = [kwargs["name"] for _, kwargs in rules]
        assert len(names) == len(set(names)), f"duplicate rule names in {build}"


def test_every_listed_source_exists():
    missing = [str(p.relative_to(ROOT)) for p in _declared_sources() if not p.exists()]
    assert not missing, f"BUILD lists files that do not exist: {missing}"


def test_every_python_file_is_listed():
    declared = _declared_sources()
    unlisted = []
    for top in COVERED_DIRS:
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            if path.resolve() not in declared:
                unlisted.append(str(path.relative_to(ROOT)))
    assert not unlisted, f"Python files missing from BUILD files: {sorted(unlisted)}"


def test_every_test_file_is_a_py_test():
    tests = set()
    for build in _build_files():
        for kind, kwargs in _evaluate(build):
            if kind == "py_test":
                tests.update((build.parent / s).resolve() for s in kwargs["srcs"])
    for path in (ROOT / "tests").rglob("*_test.py"):
        assert path.resolve() in tests, f"{path.relative_to(ROOT)} has no py_test rule"


def test_checker_catches_a_missing_file(tmp_path):
    bad = tmp_path / "BUILD"
    bad.write_text('py_library(name = "x", srcs = ["nope.py"])\n')
    rules = _evaluate(bad)
    srcs = [tmp_path / s for _, kw in rules for s in kw["srcs"]]
    assert not all(p.exists() for p in srcs)
    with pytest.raises(ValueError):
        (tmp_path / "BUILD2").write_text('py_library(srcs = ["a.py"])\n')
        _evaluate(tmp_path / "BUILD2")
