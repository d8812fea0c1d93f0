"""Tests of typed equality: types kept apart, float tolerance, nested values and dict keys."""

from pau_jax.sandbox import equality, values

NAN = float("nan")


def test_typed_equal_distinguishes_types():
    assert equality.typed_equal((1, 2), (1, 2))
    assert not equality.typed_equal((1, 2), [1, 2])
    assert not equality.typed_equal((1, 2), [1, 2], strict=False)
    assert not equality.typed_equal("5", 5, strict=False)
    assert not equality.typed_equal(b"a", "a", strict=False)
    assert not equality.typed_equal(True, 1)
    assert equality.typed_equal(True, 1, strict=False)
    assert not equality.typed_equal(2, 2.0)
    assert equality.typed_equal(2, 2.0, strict=False)
    assert not equality.typed_equal({1}, frozenset({1}))
    assert equality.typed_equal({1}, frozenset({1}), strict=False)
    assert not equality.typed_equal({1: "a"}, {True: "a"})
    assert equality.typed_equal({1: "a"}, {True: "a"}, strict=False)
    assert not equality.typed_equal([1, 2], [1, 2, 3])


def test_typed_equal_floats():
    assert equality.typed_equal(NAN, float("nan"))
    assert equality.typed_equal([NAN], [NAN])
    assert equality.typed_equal(0.0, -0.0)
    assert equality.typed_equal(0.1 + 0.2, 0.3)
    assert not equality.typed_equal(0.1 + 0.2, 0.3, float_rtol=0.0)
    assert not equality.typed_equal(1.0, 1.001)
    assert equality.typed_equal(1.0, 1.001, float_rtol=0.01)
    assert not equality.typed_equal(float("inf"), float("-inf"))
    assert equality.typed_equal(complex(1, 0.1 + 0.2), complex(1, 0.3))
    assert not equality.typed_equal(NAN, 1.0)


def test_typed_equal_nested_and_dict_keys():
    a = {(1, "x"): [1.0, {"k": (2,)}], frozenset({1, 2}): None}
    b = {frozenset({2, 1}): None, (1, "x"): [1.0 + 1e-12, {"k": (2,)}]}
    assert equality.typed_equal(a, b)
    assert equality.typed_equal(values.decode(values.encode(a)), b)
    b[(1, "x")][1]["k"] = [2]
    assert not equality.typed_equal(a, b)
    assert equality.typed_equal(values.Opaque("T", "<T>"), values.Opaque("T", "<T>"))
    assert not equality.typed_equal(values.Opaque("T", "<T>"), values.Opaque("T", "<U>"))
