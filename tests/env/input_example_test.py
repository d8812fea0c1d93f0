"""The generation prompt's example input: the function's arity, values shaped like its examples."""

import ast

import pytest

from pau_jax.env import input_example
from pau_jax.sandbox import parse_call_args


@pytest.mark.parametrize(
    "shown",
    [
        ((1,),),
        (([1, 2, 3],),),
        (("hello", 5),),
        (({"a": [1.5]}, None, True),),
        ((b"xyz", (1, "q"), {3, 4}),),
        (([], ""),),
    ],
)
def test_example_has_the_arity_and_shape_and_differs(shown):
    text = input_example.example_input(len(shown[0]), shown)
    args = parse_call_args(text, len(shown[0]))
    assert len(args) == len(shown[0])
    for got, seen in zip(args, shown[0], strict=True):
        assert type(got) is type(seen)
        if isinstance(seen, (list, tuple, set, dict, str, bytes)):
            assert len(got) == len(seen) or not seen
    assert args != shown[0]


def test_one_argument_keeps_its_trailing_comma():
    assert input_example.example_input(1, (([1, 2],),)) == "([4, 5],)"
    assert ast.literal_eval(input_example.example_input(1, (([1, 2],),))) == ([4, 5],)


def test_without_examples_the_arity_still_holds():
    for n in range(7):
        assert len(parse_call_args(input_example.example_input(n), n)) == n
    # An example of another arity (a malformed record) is not used.
    assert input_example.example_input(2, ((1,),)) == "(3, 'abc')"
