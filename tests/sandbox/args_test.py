"""Tests of parse_call_args: literal-only parsing of an agent's argument text."""

import pytest

from pau_jax.sandbox import ArgumentParseError, parse_call_args


@pytest.mark.parametrize(
    "text, expected",
    [
        ("5", (5,)),
        ("(5)", (5,)),
        ("(5,)", (5,)),
        (" 'abc' ", ("abc",)),
        ("[1, 2, 3]", ([1, 2, 3],)),
        ("([1, 2, 3])", ([1, 2, 3],)),
        ("([1, 2, 3],)", ([1, 2, 3],)),
        ("(1, 2)", ((1, 2),)),
        ("((1, 2),)", ((1, 2),)),
        ("{'a': (1, 2)}", ({"a": (1, 2)},)),
        ("{1, 2}", ({1, 2},)),
        ("()", ((),)),
        ("None", (None,)),
        ("-3.5e2", (-350.0,)),
        ("b'\\x00'", (b"\x00",)),
        ("1+2j", (1 + 2j,)),
        ("set()", (set(),)),
    ],
)
def test_one_parameter_never_spreads(text, expected):
    assert parse_call_args(text, 1) == expected
    assert type(parse_call_args(text, 1)[0]) is type(expected[0])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1, 2", (1, 2)),
        ("(1, 2)", (1, 2)),
        ("[1], 'x'", ([1], "x")),
        ("([1], 'x')", ([1], "x")),
        ("(1, 2),", None),
    ],
)
def test_several_parameters(text, expected):
    if expected is None:
        with pytest.raises(ArgumentParseError, match="got 1 argument; the function takes 2"):
            parse_call_args(text, 2)
    else:
        assert parse_call_args(text, 2) == expected


def test_no_parameters():
    assert parse_call_args("", 0) == ()
    assert parse_call_args("  ()  ", 0) == ()
    with pytest.raises(ArgumentParseError, match="got 1 argument; the function takes 0"):
        parse_call_args("5", 0)


@pytest.mark.parametrize(
    "text, n, message",
    [
        ("1, 2, 3", 2, "got 3 arguments; the function takes 2"),
        ("[1, 2]", 2, "got 1 argument; the function takes 2"),
        ("", 1, "no arguments given"),
        ("__import__('os').system('ls')", 1, "must be Python literals"),
        ("x", 1, "must be Python literals"),
        ("[1, 2", 1, "not valid Python"),
        ("lambda: 0", 1, "must be Python literals"),
        ("2 ** 1000", 1, "must be Python literals"),
        ("'a' * 10", 1, "must be Python literals"),
        ("[" * 40 + "]" * 40, 1, "nested 40 levels deep; the limit is 32"),
        ("[" * 300 + "]" * 300, 1, "not valid Python|nested"),
        ("1" * 5000, 1, "not valid Python|literals"),
        ("x" * 20_000, 1, "characters long; the limit is 10000"),
    ],
)
def test_errors_are_clear_value_errors(text, n, message):
    with pytest.raises(ArgumentParseError, match=message) as info:
        parse_call_args(text, n)
    assert isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_limits_are_configurable():
    assert parse_call_args("[[[1]]]", 1, max_depth=3) == ([[[1]]],)
    with pytest.raises(ArgumentParseError):
        parse_call_args("[[[1]]]", 1, max_depth=2)
    with pytest.raises(ArgumentParseError):
        parse_call_args("12345", 1, max_chars=4)
