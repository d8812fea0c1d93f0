"""Tests of the typed value codec: round trips, canonical form, display."""

import collections
import math
import pathlib
import subprocess
import sys

import pytest

from pau_jax.sandbox import values

NAN = float("nan")
ROOT = pathlib.Path(__file__).resolve().parents[2]

ROUND_TRIP = [
    None,
    True,
    False,
    0,
    -7,
    2**53,
    2**53 + 1,
    -(2**200) + 3,
    10**5000,
    0.1,
    -0.0,
    float("inf"),
    float("-inf"),
    1e300,
    5e-324,
    "",
    "5",
    "tab\t 'quote' \"dq\" \\ é 雪 \U0001f600 \x00",
    "\ud800 lone surrogate",
    b"",
    b"\x00\xffbytes",
    bytearray(b"ab"),
    complex(1.5, -0.0),
    complex(float("inf"), 2),
    [],
    (),
    (1,),
    [1, (2, [3, {4: (5,)}])],
    set(),
    {3, 1, 2},
    frozenset(),
    frozenset({(1, 2), frozenset({"a"})}),
    {},
    {(1, "a"): [1], 2: {3}, None: None, True: "t", 2.5: b"x", frozenset({1}): (), b"k": 1},
    {"nested": {"deeper": [{"x": (1, 2.0, "3", None)}]}},
    values.Opaque("mymod.Thing", "<Thing 1>"),
]


def _same(a, b):
    """Exact structural equality including types, with nan equal to itself."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, complex):
        return _same(a.real, b.real) and _same(a.imag, b.imag)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a == b and all(_same(v, b[k]) for k, v in a.items())
    return a == b


@pytest.mark.parametrize("value", ROUND_TRIP, ids=lambda v: type(v).__name__)
def test_round_trip_keeps_value_and_type(value):
    text = values.encode(value)
    back = values.decode(text)
    assert _same(back, value), (value, text, back)
    assert values.encode(back) == text


def test_nan_round_trips():
    assert math.isnan(values.decode(values.encode(NAN)))
    back = values.decode(values.encode([NAN, (NAN,)]))
    assert math.isnan(back[0]) and math.isnan(back[1][0]) and type(back[1]) is tuple


def test_encoding_is_json_with_type_tags():
    assert values.encode((1, "1", 1.0, True, None)) == '["tuple",1,"1",["float","1.0"],true,null]'
    assert values.encode([b"a"]) == '["list",["bytes","YQ=="]]'
    assert values.encode(2**60) == '["int","0x1000000000000000"]'


def test_equal_values_encode_equally_whatever_their_order():
    a = {"b": 1, "a": {3, 2, 1}, ("t",): frozenset({"x", "y"})}
    b = {("t",): frozenset({"y", "x"}), "a": {1, 2, 3}, "b": 1}
    assert values.encode(a) == values.encode(b)
    assert values.encode({1, 2, 3}) == values.encode({3, 2, 1})


def test_set_encoding_does_not_depend_on_the_hash_seed():
    code = (
        "import sys; sys.path.insert(0, '.');"
        "from pau_jax.sandbox import values;"
        "print(values.encode({'apple', 'pear', 'fig', 'kiwi', 'plum', ('a', 1)}))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={"PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in (1, 2)
    }
    assert len(outputs) == 1


def test_subclasses_encode_as_their_base_type():
    point = collections.namedtuple("Point", "x y")(1, 2)
    assert values.decode(values.encode(point)) == (1, 2)
    assert type(values.decode(values.encode(point))) is tuple
    counter = collections.Counter("aab")
    assert values.decode(values.encode(counter)) == {"a": 2, "b": 1}
    assert values.encode(collections.OrderedDict(b=1, a=2)) == values.encode({"a": 2, "b": 1})


def test_unknown_objects_become_opaque_without_addresses():
    class Thing:
        pass

    decoded = values.decode(values.encode(Thing()))
    assert isinstance(decoded, values.Opaque)
    assert decoded.type_name.endswith("Thing")
    assert " at 0x" not in decoded.text and decoded.text.startswith("<")
    assert values.encode(Thing()) == values.encode(Thing())


def test_cycles_and_depth_are_bounded():
    cyclic = [1]
    cyclic.append(cyclic)
    assert values.display(values.decode(values.encode(cyclic))) == "[1, [...]]"
    deep = []
    for _ in range(values.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(values.EncodingError, match="nested deeper"):
        values.encode(deep)
    with pytest.raises(values.EncodingError, match="more than 10 items"):
        values.encode(list(range(100)), max_items=10)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[",
        "1.5",
        "NaN",
        '{"a": 1}',
        '["nope", 1]',
        '["int", 5]',
        '["set", ["list", 1]]',
        '["dict", [1]]',
        '["bytes", "%%%"]',
        "[" * 5000 + "]" * 5000,
        "1" * 5000,
    ],
)
def test_malformed_text_raises_encoding_error(text):
    with pytest.raises(values.EncodingError):
        values.decode(text)


@pytest.mark.parametrize(
    "value",
    [
        None,
        5,
        "5",
        (1,),
        (),
        [1, "a", (2.5, None)],
        {"b": 1, "a": [1, 2]},
        b"x\x00",
        -0.0,
        float("nan"),
        complex(1, 2),
        {(1, 2): {3: "x"}},
        10**50,
    ],
    ids=repr,
)
def test_display_matches_repr_for_ordered_values(value):
    assert values.display(value) == repr(value)


def test_display_orders_sets_canonically():
    assert values.display({3, 10, 2}) == "{2, 3, 10}"
    assert values.display({"b", "a"}) == "{'a', 'b'}"
    assert values.display(frozenset()) == "frozenset()"
    assert values.display(set()) == "set()"
    assert values.display(frozenset({2, 1})) == "frozenset({1, 2})"
    mixed = values.display({1, "a", (2,)})
    assert sorted(mixed.strip("{}").split(", ")) == sorted(["1", "'a'", "(2,)"])
    assert values.display({1, "a", (2,)}) == values.display({(2,), "a", 1})


def test_display_of_huge_int_and_cut():
    n = 10**5000 + 7
    assert values.display(n) == "1" + "0" * 4999 + "7"
    assert values.display(-n).startswith("-1000")
    assert values.display(list(range(1000)), max_chars=20) == "[0, 1, 2, 3, 4, 5..."
    assert len(values.display(list(range(1000)), max_chars=20)) == 20


def test_display_error():
    assert values.display_error("TypeError", "bad operand") == "TypeError: bad operand"
    assert values.display_error("StopIteration", "") == "StopIteration"
