"""Tests of type-aware candidate generation."""

import random

import pytest

from pau_jax.data import argtypes, mutations

TYPES = [
    "int",
    "float",
    "bool",
    "str",
    "None | int",
    "list[int]",
    "list[list[str]]",
    "tuple[int, str]",
    "tuple[float, ...]",
    "dict[str, list[int]]",
    "set[int]",
    "frozenset[str]",
    "bytes",
]


@pytest.mark.parametrize("text", TYPES)
def test_fresh_and_mutated_values_keep_their_type(text):
    spec = argtypes.parse(text)
    gen = mutations.Generator(mutations.Pools(ints=[42], strs=["hello"]), random.Random(1))
    values = [gen.fresh(spec) for _ in range(50)]
    mutated = [gen.mutate(v, spec) for v in values for _ in range(3)]
    for value in values + mutated:
        assert argtypes.matches(value, spec), (text, value)


def test_generation_is_deterministic_for_a_seed():
    specs = [argtypes.parse("list[int]"), argtypes.parse("str")]

    def draw(seed):
        gen = mutations.Generator(
            mutations.pools_for("def f(a, b):\n    return 7\n", [([1, 2], "ab")]),
            random.Random(seed),
        )
        start = ([1, 2], "ab")
        return [gen.mutate_args(start, specs) for _ in range(20)] + [
            gen.fresh_args(specs) for _ in range(20)
        ]

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_pools_collect_seed_scalars_and_code_literals():
    pools = mutations.pools_for("def f(x):\n    return x == 'magic' or x > 99\n", [(["a", 5],)])
    assert "magic" in pools.strs and "a" in pools.strs
    assert {5, 99, 100, 98} <= set(pools.ints)


def test_mutations_cover_boundaries():
    gen = mutations.Generator(mutations.Pools(), random.Random(0))
    spec = argtypes.parse("list[int]")
    seen = {repr(gen.mutate([3, 1, 2], spec)) for _ in range(300)}
    assert "[]" in seen
    assert any(v.count(",") >= 3 for v in seen)
    texts = {gen.mutate("ab", argtypes.parse("str")) for _ in range(300)}
    assert "" in texts and "ba" in texts and any(not t.isascii() for t in texts)
