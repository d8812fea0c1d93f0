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


def test_value_shapes_name_types_and_container_items():
    shape = input_example.value_shape
    assert shape(True) == ("bool",) and shape(3) == ("int",) and shape(2.5) == ("float",)
    assert shape("a") == ("str",) and shape(b"a") == ("bytes",) and shape(None) == ("none",)
    assert shape(float("inf")) == ("any",) and shape(set()) == ("any",)
    assert shape([1, 2]) == ("list", ("int",))
    assert shape([1, "a"]) == ("list", ("alt", (("int",), ("str",))))
    assert shape((1, [2])) == ("tuple", ("alt", (("int",), ("list", ("int",)))))
    assert shape({"k": [1.5]}) == ("dict", ("str",), ("list", ("float",)))
    assert shape([]) == ("list", ("any",)) and shape([[[1]]]) == ("list", ("list", ("any",)))
    shapes = input_example.argument_shapes(2, [([1], "a"), ([], "b"), (3,)])
    assert shapes == (("alt", (("list", ("any",)), ("list", ("int",)))), ("str",))
    assert input_example.argument_shapes(2, [(1,)]) == ()


def test_placeholder_forms_follow_the_shown_shapes():
    form = input_example.placeholder_example
    assert form(2, [([1.0, 2.5], 0.3)]) == "([<float>, ...], <float>)"
    assert form(1, [("abc",)]) == "(<str>,)"
    assert form(2, [({"a": 1}, None), ({"b": 2}, 3)]) == "({<str>: <int>, ...}, <int> or None)"
    assert form(1, [((1, "a"),)]) == "((<int or str>, ...),)"
    assert form(2, [({1, 2}, b"x")]) == "({<int>, ...}, <bytes>)"
    # Without a shown example of the arity: one generic placeholder per argument.
    assert form(3) == "(<value>, <value>, <value>)" and form(2, [(1,)]) == "(<value>, <value>)"


@pytest.mark.parametrize("shown", [((1,),), (([1, 2], "a"),), (({"k": 1.5}, None, True),)])
def test_a_copied_placeholder_form_is_not_a_call(shown):
    text = input_example.placeholder_example(len(shown[0]), shown)
    with pytest.raises(ValueError):
        parse_call_args(text, len(shown[0]))


def test_the_generation_prompt_shows_the_form_and_copies_of_it_are_counted():
    from pau_jax.env import prompts

    form = input_example.placeholder_example(2, [([1, 2], "a")])
    view = prompts.EpisodeView(
        header="def test_func(arg0, arg1):", examples=(), n_params=2, input_example=form
    )
    as_values = prompts.generate_messages(view)[-1]["content"]
    as_form = prompts.generate_messages(
        prompts.EpisodeView(
            header=view.header, examples=(), n_params=2, input_example=form, example_is_form=True
        )
    )[-1]["content"]
    assert "For example:" in as_values and "The form to fill in:" in as_form
    assert f"```\n{form}\n```" in as_form and "in place of every <...>" in as_form
    messages = [{"role": "user", "content": as_form}]
    assert input_example.copies_example(messages, form)
    assert not input_example.copies_example(messages, "([3, 4], 'b')")
