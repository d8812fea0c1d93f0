"""Tests of the AST anonymiser: scoping, strings, docstrings, annotations, behaviour."""

import ast
import re

import pytest

from pau_jax.data import anonymize


def _run(code: str, name: str, *args):
    namespace: dict = {}
    exec(compile(code, "<test>", "exec"), namespace)
    return namespace[name](*args)


def test_renames_entry_and_parameters_but_not_strings_or_attributes():
    code = (
        "def count_s(s, text):\n"
        '    """Counts s."""\n'
        "    return text.count(s) + len('s text') + len(f'{s}')\n"
    )
    result = anonymize.anonymize(code, "count_s")
    assert result.header == "def test_func(arg0, arg1):"
    assert result.original_arg_names == ("s", "text")
    assert "'s text'" in result.code
    assert "arg1.count(arg0)" in result.code
    assert "Counts" not in result.code
    for args in [("a", "banana"), ("s", "s s"), ("", "x")]:
        assert _run(code, "count_s", *args) == _run(result.code, "test_func", *args)


def test_string_replacement_would_change_behaviour_but_ast_does_not():
    # Whole-word text replacement also rewrites the string literal 'n'.
    code = "def f(n):\n    return 'n' * n\n"
    naive = re.sub(r"\bn\b", "arg0", code.replace("def f(", "def test_func("))
    result = anonymize.anonymize(code, "f")
    assert _run(result.code, "test_func", 3) == _run(code, "f", 3) == "nnn"
    assert _run(naive, "test_func", 3) == "arg0arg0arg0"


def test_shadowing_scopes_keep_their_own_names():
    code = (
        "def f(x, y):\n"
        "    g = lambda x: x + 1\n"
        "    squares = [x * x for x in range(y)]\n"
        "    def inner(x):\n"
        "        return x * 10\n"
        "    def outer_ref():\n"
        "        return x\n"
        "    class Box:\n"
        "        x = 100\n"
        "        def get(self):\n"
        "            return x\n"
        "    return g(x), squares, inner(x), outer_ref(), Box.x, Box().get()\n"
    )
    result = anonymize.anonymize(code, "f")
    tree = ast.parse(result.code)
    lam = next(n for n in ast.walk(tree) if isinstance(n, ast.Lambda))
    assert lam.args.args[0].arg == "x"
    inner = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "inner")
    assert inner.args.args[0].arg == "x"
    box = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
    assert isinstance(box.body[0], ast.Assign) and box.body[0].targets[0].id == "x"
    for args in [(2, 3), (-1, 0), (5, 1)]:
        assert _run(code, "f", *args) == _run(result.code, "test_func", *args)


def test_nonlocal_global_recursion_and_keyword_calls():
    code = (
        "counter = 0\n"
        "def fact(n):\n"
        "    global counter\n"
        "    counter += 1\n"
        "    def bump():\n"
        "        nonlocal n\n"
        "        n = n - 1\n"
        "        return n\n"
        "    if n <= 1:\n"
        "        return 1\n"
        "    m = n\n"
        "    return m * fact(n=bump())\n"
    )
    result = anonymize.anonymize(code, "fact")
    assert "nonlocal arg0" in result.code
    assert "test_func(arg0=bump())" in result.code
    assert "global counter" in result.code
    for n in [0, 1, 5, 7]:
        assert _run(code, "fact", n) == _run(result.code, "test_func", n)


def test_keeps_helpers_and_imports_and_drops_docstrings_and_annotations():
    code = (
        '"""Module docstring."""\n'
        "import math\n"
        "from typing import List\n"
        "def helper(v: float) -> float:\n"
        '    """helper doc"""\n'
        "    return math.sqrt(v)\n"
        "def norm(values: List[float]) -> float:\n"
        '    """Euclidean norm."""\n'
        "    total: float = 0.0\n"
        "    pending: int\n"
        "    for v in values:\n"
        "        total += v * v\n"
        "    return helper(total)\n"
    )
    result = anonymize.anonymize(code, "norm")
    tree = ast.parse(result.code)
    assert not any(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in ast.walk(tree))
    assert not any(isinstance(n, ast.AnnAssign) for n in ast.walk(tree))
    assert all(a.annotation is None for a in ast.walk(tree) if isinstance(a, ast.arg))
    assert all(f.returns is None for f in ast.walk(tree) if isinstance(f, ast.FunctionDef))
    assert "import math" in result.code and "def helper(v):" in result.code
    assert _run(result.code, "test_func", [3.0, 4.0]) == 5.0


def test_positional_only_header():
    result = anonymize.anonymize("def f(a, /, b):\n    return a - b\n", "f")
    assert result.header == "def test_func(arg0, /, arg1):"
    assert _run(result.code, "test_func", 5, 2) == 3


@pytest.mark.parametrize(
    "code, reason",
    [
        ("def f(a, b=1):\n    return a\n", "unsupported signature"),
        ("def f(*a):\n    return a\n", "unsupported signature"),
        ("async def f(a):\n    return a\n", "async"),
        ("def g(a):\n    return a\n", "not found"),
        ("arg0 = 1\ndef f(a):\n    return a + arg0\n", "collision"),
        ("def f(a):\n    return test_func(a)\n", "collision"),
        ("def f(a:\n", "syntax"),
    ],
)
def test_unsupported_code_is_rejected_with_a_reason(code, reason):
    with pytest.raises(anonymize.AnonymizeError, match=reason):
        anonymize.anonymize(code, "f")
