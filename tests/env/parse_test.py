"""Table tests for the phase-output parsers."""

import pytest

from pau_jax.env import parse, text_blocks

INPUT_CASES = [
    # (model output, ok, extracted argument text)
    ("```\n(1, 'a')\n```", True, "(1, 'a')"),
    ("```python\n([1, 2, 3],)\n```", True, "([1, 2, 3],)"),
    ("<think>try (0, 0) first?</think>\n```\n(5, 7)\n```", True, "(5, 7)"),
    ("I will try this.\n```\n(1, 2)\n```\nActually better:\n```py\n(3, 4)\n```", True, "(3, 4)"),
    ("Input: (2, 'xyz')", True, "(2, 'xyz')"),
    ("Some words first.\n**Input:** `[1, 2]`", True, "[1, 2]"),
    ("[1, 2, 3]", True, "[1, 2, 3]"),
    ("`'hello'`", True, "'hello'"),
    ("", False, ""),
    ("<think>only thinking, never answered", False, ""),
    ("I think we should try\nsomething bigger\nlike a long list", False, ""),
]


@pytest.mark.parametrize("text,ok,args_text", INPUT_CASES)
def test_extract_input(text, ok, args_text):
    got = parse.extract_input(text)
    assert got.ok == ok
    if ok:
        assert got.args_text == args_text
    else:
        assert got.reason


REVISION_CASES = [
    # (model output, ok, hypothesis, stop)
    (
        "Hypothesis: returns the sum of a and b.\nDecision: STOP",
        True,
        "returns the sum of a and b.",
        True,
    ),
    ("Hypothesis: sorts the list\nDecision: CONTINUE", True, "sorts the list", False),
    (
        "<think>Maybe it is reversing. STOP? no.</think>Hypothesis: reverses a string\nDecision: continue",
        True,
        "reverses a string",
        False,
    ),
    ("**Hypothesis:** doubles x\n**Decision:** STOP", True, "doubles x", True),
    ("It doubles its input.\nSTOP", True, "It doubles its input.", True),
    ("Hypothesis: doubles x", False, "doubles x", False),
    ("Decision: STOP", False, "", True),
    (
        "Hypothesis: counts vowels (CONTINUE was my first plan)\nDecision: STOP",
        True,
        "counts vowels (CONTINUE was my first plan)",
        True,
    ),
    ("Revised hypothesis: squares n\nDecision: STOP\nThanks!", True, "squares n", True),
]


@pytest.mark.parametrize("text,ok,hypothesis,stop", REVISION_CASES)
def test_parse_revision(text, ok, hypothesis, stop):
    got = parse.parse_revision(text)
    assert got.ok == ok, got
    assert got.hypothesis == hypothesis
    if ok or got.reason == "empty hypothesis":
        assert got.stop == stop
    if not ok:
        assert got.reason


def test_strip_think_removes_blocks_and_open_tail():
    assert parse.strip_think is text_blocks.strip_think  # still read from `parse`
    assert text_blocks.strip_think("<think>a</think>b<think>c</think>d") == "bd"
    assert text_blocks.strip_think("x <think> unfinished") == "x"
    assert text_blocks.strip_think("</think>answer") == "answer"


def test_a_fence_is_code_whose_string_literals_may_hold_fences_and_think_tags():
    reply = "<think>plan</think>```\n('```', '<think>', '</think>')\n```"
    assert text_blocks.strip_think(reply) == "```\n('```', '<think>', '</think>')\n```"
    args = "('```', '<think>', '</think>')"
    assert parse.extract_input(reply).args_text == args
    assert parse.input_candidates(reply)[0] == args
    # A quote that never closes (prose in a fence) leaves the first ``` as the end, as before.
    prose = "```\n(1, 'a)```\nmore text\n```\n(2, 3)\n```"
    assert parse.extract_input(prose).args_text == "(2, 3)"
    assert (
        text_blocks.strip_think("```\nit's <think>x</think>\n```")
        == "```\nit's <think>x</think>\n```"
    )
    assert text_blocks.strip_think("```\nno end <think>x") == "```\nno end"


def test_a_call_inside_a_string_literal_is_no_call():
    assert parse.input_candidates("```\n('f(1)',)\n```")[0] == "('f(1)',)"
    call = "```python\ntest_func('test_func(1, 2)', [3])\n```"
    assert parse.input_candidates(call)[0] == "'test_func(1, 2)', [3]"
    assert parse.input_candidates("Try test_func('a') or f(2).") == ["2", "'a'"]


def test_parse_description():
    assert parse.parse_description("<think>hmm</think>Description: adds one") == "adds one"
    assert parse.parse_description("adds one to x") == "adds one to x"


DESCRIPTION_CASES = [
    # (model output, description)
    ("Description: adds one", "adds one"),
    ("Sure!\nDescription:\nSquares n.\n", "Squares n."),
    ("Description: first\nDescription: second", "second"),
    ("Final description: reverses the list", "reverses the list"),
    ("<think>Description: no</think>", ""),
    ("<think>plan</think>It returns the maximum.", "It returns the maximum."),
    ("", ""),
    ("**Description:** adds one", "adds one"),
]


@pytest.mark.parametrize("text,description", DESCRIPTION_CASES)
def test_parse_description_table(text, description):
    assert parse.parse_description(text) == description


LENIENT_CASES = [
    # (model output, candidates in order): what the strict parser misses or misreads.
    ("```python\ntest_func([1, 2], 3)\n```", ["[1, 2], 3"]),
    ("```python\nprint(test_func('abc'))\n```", ["'abc'"]),
    (
        "```python\ndef test_func(arg0):\n    return arg0\n\nresult = test_func([3, 1])\n```",
        ["[3, 1]"],
    ),
    ("```python\ndef test_func(arg0, arg1):\n    return arg0 + arg1\n```", []),
    (">>> test_func(5, 'x')", ["5, 'x'"]),
    ("I will call test_func(3, 'a(b') next.", ["3, 'a(b'"]),
    ("```\ntest_func(arg1=2, arg0=[1])\n```", ["[1], 2"]),
    ("```\narg0 = [1, 2]\narg1 = 'z'\n```", ["[1, 2], 'z'"]),
    ("Input: f(7)", ["7"]),
    ("```\n(1, 2)\n```", ["(1, 2)"]),
    ("```\n(1, 2, 3)\n```\nor better\n```\n(4, 5)\n```", ["(4, 5)", "(1, 2, 3)"]),
    ("[1, 2, 3]", ["[1, 2, 3]"]),
    ("", []),
    ("I think we should try\nsomething bigger", []),
    # Replies of Qwen2.5-Coder-0.5B-Instruct: one inline code span holds the arguments.
    (
        "The next call should be `(1.0, 2.0)`.",
        ["The next call should be `(1.0, 2.0)`.", "(1.0, 2.0)"],
    ),
    (
        "The arguments for the next call should be `('(()(())((())))',)`.\n\nThis call is "
        "most informative. The function `test_func` returns a list.",
        ["('(()(())((())))',)"],
    ),
    # Two spans that are not bare names: ambiguous, so neither is read.
    ("Try `[1, 2]` and then `[3]`\nnext time.", []),
]


@pytest.mark.parametrize("text,candidates", LENIENT_CASES)
def test_input_candidates(text, candidates):
    assert parse.input_candidates(text) == candidates


def test_strict_parser_misreads_what_the_lenient_one_reads():
    # The strict parser takes a fenced call or definition as the argument text itself.
    assert parse.extract_input("```python\ntest_func([1, 2], 3)\n```").args_text == (
        "test_func([1, 2], 3)"
    )
    assert parse.input_candidates("```python\ntest_func([1, 2], 3)\n```") == ["[1, 2], 3"]


def test_no_input_reason_names_a_definition():
    assert "defines a function" in parse.no_input_reason("```\ndef test_func(a):\n  pass\n```")
    assert parse.no_input_reason("<think>x</think>") == "empty output"
    assert parse.no_input_reason("just words\nmore words").startswith("no input found")
    # The expected form has the function's arity.
    assert "```(arg0,)```" in parse.no_input_reason("just words\nmore words", 1)
    assert "```(arg0, arg1, arg2)```" in parse.no_input_reason("just words\nmore words", 3)
