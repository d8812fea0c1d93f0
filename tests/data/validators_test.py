"""Tests of validator synthesis and insertion (executed in-process: the code is our own)."""

import random

import pytest

from pau_jax.data import argtypes, mutations, validators


def _validator(arg_names, specs):
    namespace: dict = {}
    exec(validators.validator_source(arg_names, specs), namespace)
    return namespace[validators.VALIDATOR_NAME]


OBSERVED = [
    ([1, 2], "ab", {"k": (1, 2.5)}, None),
    ([], "", {}, 4),
    ([7], "xyz", {"a": (0, 1.0), "b": (3, -1.5)}, None),
]


def _specs():
    return [argtypes.join_all(argtypes.infer(row[i]) for row in OBSERVED) for i in range(4)]


def test_accepts_every_observed_input():
    check = _validator(["arg0", "arg1", "arg2", "arg3"], _specs())
    for row in OBSERVED:
        assert check(*row) is None


@pytest.mark.parametrize(
    "position, bad, expected",
    [
        (0, (1, 2), "arg0 must be list[int], got tuple"),
        (0, [1, "2"], "arg0 must be list[int], got list"),
        (0, [True], "arg0 must be list[int], got list"),
        (1, b"ab", "arg1 must be str, got bytes"),
        (2, {"k": (1, 2)}, "arg2 must be dict[str, tuple[int, float]], got dict"),
        (2, {1: (1, 2.0)}, "arg2 must be dict[str, tuple[int, float]], got dict"),
        (3, "4", "arg3 must be None | int, got str"),
    ],
)
def test_rejects_wrong_types_naming_argument_and_type(position, bad, expected):
    check = _validator(["arg0", "arg1", "arg2", "arg3"], _specs())
    args = list(OBSERVED[0])
    args[position] = bad
    with pytest.raises(TypeError) as info:
        check(*args)
    assert str(info.value) == expected


def test_generated_code_agrees_with_matches_on_random_values():
    rng = random.Random(0)
    gen = mutations.Generator(mutations.Pools(), rng)
    specs = [
        argtypes.parse(t)
        for t in ("list[int]", "tuple[str, ...]", "dict[int, set[str]]", "float | None")
    ]
    candidates = [
        argtypes.parse(t)
        for t in (
            "list[int | str]",
            "tuple[str | int, ...]",
            "dict[int, set[str]] | list[int]",
            "float | int | None",
        )
    ]
    check = _validator(["a", "b", "c", "d"], specs)
    agreements = 0
    for _ in range(300):
        args = [gen.fresh(c) for c in candidates]
        expected = all(argtypes.matches(v, s) for v, s in zip(args, specs))
        try:
            check(*args)
            accepted = True
        except TypeError:
            accepted = False
        assert accepted == expected, args
        agreements += accepted
    assert 0 < agreements < 300


def test_attach_calls_validator_first_and_keeps_behaviour():
    code = "import math\ndef helper(x):\n    return math.floor(x)\ndef test_func(arg0):\n    return helper(arg0) * 2\n"
    source = validators.attach(
        code, validators.validator_source(["arg0"], [argtypes.parse("float")])
    )
    namespace: dict = {}
    exec(source, namespace)
    assert namespace["test_func"](2.7) == 4
    with pytest.raises(TypeError, match="arg0 must be float, got int"):
        namespace["test_func"](2)
    lines = source.splitlines()
    body_start = lines.index("def test_func(arg0):")
    assert lines[body_start + 1].strip() == "validate_input_args(arg0)"


def test_any_type_adds_no_check():
    source = validators.validator_source(["arg0"], [argtypes.ANY])
    namespace: dict = {}
    exec(source, namespace)
    assert namespace["validate_input_args"](object()) is None


@pytest.mark.parametrize(
    "observed, good, bad",
    [
        ([[[]], []], [[], [1]], [1]),
        ([[([1, 2],)], []], [([],), ([3],)], [([1.5],)]),
        ([[{}]], [{}, {"a": 1}], [[]]),
    ],
)
def test_nested_and_empty_containers(observed, good, bad):
    spec = argtypes.join_all(argtypes.infer(v) for v in observed)
    check = _validator(["arg0"], [spec])
    for value in [*observed, good]:
        assert check(value) is None
        assert argtypes.matches(value, spec)
    with pytest.raises(TypeError, match="arg0 must be"):
        check(bad)
    assert not argtypes.matches(bad, spec)


def test_recursive_function_is_validated_only_at_the_outer_call():
    code = (
        "def test_func(arg0):\n"
        "    if isinstance(arg0, dict):\n"
        "        return 1 + max(map(test_func, arg0.values()), default=0)\n"
        "    return 0\n"
    )
    spec = argtypes.join_all(argtypes.infer(v) for v in [{"a": 1}, {"b": {"c": 2}}])
    source = validators.attach(code, validators.validator_source(["arg0"], [spec]))
    namespace: dict = {}
    exec(source, namespace)
    assert namespace["test_func"]({"b": {"c": 2}}) == 2
    with pytest.raises(TypeError, match="arg0 must be"):
        namespace["test_func"](5)
    assert "_test_func" in namespace and "def test_func(arg0):" in source
