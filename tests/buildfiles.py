"""Reads the Bazel-style BUILD files: each is evaluated as Starlark (a Python subset) with stub rules."""

import glob as globlib
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Directories whose Python files must each be listed in some BUILD file.
COVERED_DIRS = ("pau_jax", "tests", "benchmarks", "data_builders")


def _build_files():
    return sorted(
        p for p in ROOT.rglob("BUILD") if ".venv" not in p.parts and "venv" not in p.parts
    )


def _evaluate(build_path: pathlib.Path):
    """Runs one BUILD file with stub rules; returns a list of (rule, kwargs)."""
    rules = []
    pkg_dir = build_path.parent

    def rule(kind):
        def record(**kwargs):
            if "name" not in kwargs:
                raise ValueError(f"{build_path}: {kind} without a name")
            rules.append((kind, kwargs))

        return record

    def glob(patterns, exclude=()):
        found = set()
        for pattern in patterns:
            for path in globlib.glob(str(pkg_dir / pattern), recursive=True):
                found.add(str(pathlib.Path(path).relative_to(pkg_dir)))
        for pattern in exclude:
            for path in globlib.glob(str(pkg_dir / pattern), recursive=True):
                found.discard(str(pathlib.Path(path).relative_to(pkg_dir)))
        return sorted(found)

    env = {
        "__builtins__": {"True": True, "False": False, "None": None},
        "py_library": rule("py_library"),
        "py_binary": rule("py_binary"),
        "py_test": rule("py_test"),
        "filegroup": rule("filegroup"),
        "package": lambda **_: None,
        "glob": glob,
    }
    source = build_path.read_text()
    exec(compile(source, str(build_path), "exec"), env)  # Starlark subset, no imports.
    return rules
