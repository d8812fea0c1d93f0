"""Tests of argument-type inference, joins and the text form."""

import pytest

from pau_jax.data import argtypes
from pau_jax.data.argtypes import TypeSpec


@pytest.mark.parametrize(
    "values, text",
    [
        ([1, 2, 3], "int"),
        ([1, 2.5], "float | int"),
        ([True, False], "bool"),
        ([[1, 2], []], "list[int]"),
        ([[]], "list[never]"),
        ([(1, "a"), (2, "b")], "tuple[int, str]"),
        ([(1, 2), (1, 2, 3)], "tuple[int, ...]"),
        ([{"a": [1]}, {"b": []}], "dict[str, list[int]]"),
        ([{1, 2}, set()], "set[int]"),
        ([None, 3], "None | int"),
        ([[1, "a"], [2.0]], "list[float | int | str]"),
        ([[[1]], [["x"]]], "list[list[int | str]]"),
        ([()], "tuple[()]"),
    ],
)
def test_inference_and_join(values, text):
    spec = argtypes.join_all(argtypes.infer(v) for v in values)
    assert str(spec) == text
    assert argtypes.parse(text) == spec
    assert all(argtypes.matches(v, spec) for v in values)


def test_bool_is_not_int_and_int_is_not_float():
    assert not argtypes.matches(True, TypeSpec("int"))
    assert not argtypes.matches(1, TypeSpec("float"))
    assert not argtypes.matches([1, True], argtypes.parse("list[int]"))
    assert not argtypes.matches((1, 2), argtypes.parse("list[int]"))
    assert not argtypes.matches((1,), argtypes.parse("tuple[int, int]"))
    assert argtypes.matches([], argtypes.parse("list[str]"))


def test_unsupported_values_are_refused():
    with pytest.raises(argtypes.UnsupportedTypeError):
        argtypes.infer(lambda: 1)
    with pytest.raises(argtypes.UnsupportedTypeError):
        argtypes.infer([object()])


@pytest.mark.parametrize("text", ["list[", "foo", "list[int] extra", "dict[int, ]"])
def test_parse_rejects_garbage(text):
    with pytest.raises(ValueError):
        argtypes.parse(text)
