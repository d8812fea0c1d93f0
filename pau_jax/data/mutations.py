"""Type-aware input candidates: mutations of known inputs and fresh values drawn per TypeSpec."""

import ast
import dataclasses
import random
import string
from collections.abc import Sequence

from pau_jax.data import argtypes
from pau_jax.data.argtypes import TypeSpec
from pau_jax.data.sources import parse_quietly

_UNICODE = ("é", "ß", "Ω", "日本", "ñ", "😀", "\u00a0", "İ")
_BOUNDARY_INTS = (0, 1, -1, 2, -2, 3, 5, 10, -10, 100, 1000, 10**6)
_BOUNDARY_FLOATS = (0.0, 1.0, -1.0, 0.5, -0.5, 2.5, 1e-3, 100.0, 1e16, -2.5e-7, float("inf"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """Size limits of generated values.

    Attributes:
      max_len: most elements in a generated container or characters in a string.
      max_int: largest absolute value of a freshly drawn integer (boundaries aside).
      max_depth: deepest nesting of fresh containers.
    """

    max_len: int = 8
    max_int: int = 100
    max_depth: int = 4


@dataclasses.dataclass
class Pools:
    """Scalars seen in the seed inputs and in the code's literals, by type name."""

    ints: list[int] = dataclasses.field(default_factory=list)
    floats: list[float] = dataclasses.field(default_factory=list)
    strs: list[str] = dataclasses.field(default_factory=list)

    def add(self, value) -> None:
        if type(value) is int and abs(value) < 10**9:
            self.ints.append(value)
        elif type(value) is float:
            self.floats.append(value)
        elif type(value) is str and len(value) <= 40:
            self.strs.append(value)
        elif type(value) in (list, tuple):
            for v in value:
                self.add(v)
        elif type(value) in (set, frozenset):
            for v in _ordered(value):
                self.add(v)
        elif type(value) is dict:
            for k, v in value.items():
                self.add(k)
                self.add(v)

    def finalize(self) -> None:
        """Deduplicates in first-seen order (keeps generation deterministic)."""
        self.ints = list(dict.fromkeys(self.ints))
        self.floats = list(dict.fromkeys(self.floats))
        self.strs = list(dict.fromkeys(self.strs))


def pools_for(code: str, seeds: Sequence[tuple]) -> Pools:
    """Collects scalars from seed inputs and from the literals of the code."""
    pools = Pools()
    for seed in seeds:
        pools.add(seed)
    for node in ast.walk(parse_quietly(code)):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float, str):
            value = node.value
            pools.add(value)
            if type(value) is int:
                pools.add(value + 1)
                pools.add(value - 1)
    pools.finalize()
    return pools


class Generator:
    """Draws values of a TypeSpec and mutates values while keeping their type.

    Args:
      pools: scalars to prefer (seen in seeds and code).
      rng: the only source of randomness (determinism for a seed).
      limits: size limits.
    """

    def __init__(self, pools: Pools, rng: random.Random, limits: Limits = Limits()):
        self.pools, self.rng, self.limits = pools, rng, limits

    def _chars(self) -> str:
        seen = "".join(self.pools.strs)[:200]
        return seen + string.ascii_letters + string.digits + " .,!?-_"

    def fresh(self, spec: TypeSpec, depth: int = 0):
        """A new value of `spec` (boundaries, pooled scalars, random draws)."""
        rng, kind = self.rng, spec.kind
        if kind == "union":
            return self.fresh(rng.choice(spec.args), depth)
        if kind == "None":
            return None
        if kind == "bool":
            return rng.random() < 0.5
        if kind == "int":
            pick = rng.random()
            if pick < 0.3 and self.pools.ints:
                return rng.choice(self.pools.ints)
            if pick < 0.55:
                return rng.choice(_BOUNDARY_INTS)
            return rng.randint(-self.limits.max_int, self.limits.max_int)
        if kind == "float":
            pick = rng.random()
            if pick < 0.3 and self.pools.floats:
                return rng.choice(self.pools.floats)
            if pick < 0.55:
                return rng.choice(_BOUNDARY_FLOATS)
            return round(rng.uniform(-self.limits.max_int, self.limits.max_int), rng.randint(0, 3))
        if kind == "complex":
            return complex(rng.randint(-5, 5), rng.randint(-5, 5))
        if kind in ("str", "bytes"):
            text = self._fresh_str()
            return text.encode() if kind == "bytes" else text
        if kind in ("any", "never"):
            return self.fresh(TypeSpec(rng.choice(("int", "str"))), depth)
        size = self._size(depth)
        if kind in ("list", "set", "frozenset", "tuple..."):
            items = [self.fresh(spec.args[0], depth + 1) for _ in range(size)]
            return _build(kind, items)
        if kind == "tuple":
            return tuple(self.fresh(a, depth + 1) for a in spec.args)
        if kind == "dict":
            return {
                self.fresh(spec.args[0], depth + 1): self.fresh(spec.args[1], depth + 1)
                for _ in range(size)
            }
        raise ValueError(f"cannot generate type {spec}")

    def _size(self, depth: int) -> int:
        if depth >= self.limits.max_depth:
            return 0
        return self.rng.choice((0, 1, 2, 3, self.rng.randint(0, self.limits.max_len)))

    def _fresh_str(self) -> str:
        rng = self.rng
        pick = rng.random()
        if pick < 0.3 and self.pools.strs:
            return rng.choice(self.pools.strs)
        if pick < 0.4:
            return rng.choice(
                ("", " ", "a", "A", "0", "ab", "aa", "abc", "Hello World", rng.choice(_UNICODE))
            )
        chars = self._chars()
        return "".join(rng.choice(chars) for _ in range(rng.randint(0, self.limits.max_len * 2)))

    def mutate(self, value, spec: TypeSpec, depth: int = 0):
        """A variant of `value` of the same type (or a fresh value of `spec`)."""
        rng = self.rng
        if rng.random() < 0.15 or spec.kind in ("any", "never"):
            return self.fresh(spec, depth)
        if spec.kind == "union":
            members = [m for m in spec.args if argtypes.matches(value, m)]
            return (
                self.mutate(value, members[0] if members else spec, depth)
                if members
                else self.fresh(spec, depth)
            )
        t = type(value)
        if t is bool:
            return not value
        if t is int:
            return rng.choice(
                (
                    value + 1,
                    value - 1,
                    -value,
                    0,
                    value * 2,
                    value // 2,
                    value + rng.randint(-10, 10),
                )
            )
        if t is float:
            return rng.choice(
                (value + 1.0, value - 0.5, -value, 0.0, value * 2, value / 2, round(value, 1))
            )
        if t is str:
            return self._mutate_str(value)
        if t is bytes:
            return self._mutate_str(value.decode("latin-1")).encode("latin-1", errors="replace")
        if t in (list, set, frozenset) or (t is tuple and spec.kind == "tuple..."):
            return _build(spec.kind, self._mutate_items(_ordered(value), spec.args[0], depth))
        if t is tuple and spec.kind == "tuple" and value:
            items = list(value)
            i = rng.randrange(len(items))
            items[i] = self.mutate(items[i], spec.args[i], depth + 1)
            return tuple(items)
        if t is dict and spec.kind == "dict":
            return self._mutate_dict(dict(value), spec, depth)
        return self.fresh(spec, depth)

    def _mutate_str(self, s: str) -> str:
        rng = self.rng
        ops = [
            lambda: s[::-1],
            lambda: s.upper(),
            lambda: s.lower(),
            lambda: s.swapcase(),
            lambda: s + s,
            lambda: s[1:],
            lambda: s[:-1],
            lambda: "",
            lambda: s + rng.choice(self._chars()),
            lambda: rng.choice(self._chars()) + s,
            lambda: s.replace(rng.choice(s), rng.choice(self._chars())) if s else "a",
            lambda: s + " " + s,
            lambda: s + rng.choice(_UNICODE),
            lambda: s[: len(s) // 2],
            lambda: "".join(rng.sample(s, len(s))),
            lambda: s + str(rng.randint(0, 99)),
            lambda: s.strip() if s.strip() != s else " " + s + " ",
        ]
        return rng.choice(ops)()

    def _mutate_items(self, items: list, element: TypeSpec, depth: int) -> list:
        rng = self.rng
        ops = ["append", "drop", "dup", "reverse", "shuffle", "empty", "edit", "sort", "single"]
        op = rng.choice(ops if items else ["append", "append", "empty"])
        if op == "append":
            source = rng.choice(items) if items and rng.random() < 0.5 else None
            new = (
                self.mutate(source, element, depth + 1)
                if source is not None
                else self.fresh(element, depth + 1)
            )
            items.insert(rng.randint(0, len(items)), new)
        elif op == "drop":
            items.pop(rng.randrange(len(items)))
        elif op == "dup":
            items.insert(rng.randint(0, len(items)), rng.choice(items))
        elif op == "reverse":
            items.reverse()
        elif op == "shuffle":
            rng.shuffle(items)
        elif op == "empty":
            items = []
        elif op == "edit":
            i = rng.randrange(len(items))
            items[i] = self.mutate(items[i], element, depth + 1)
        elif op == "sort":
            try:
                items.sort(reverse=rng.random() < 0.5)
            except TypeError:
                rng.shuffle(items)
        elif op == "single":
            items = [rng.choice(items)]
        return items

    def _mutate_dict(self, d: dict, spec: TypeSpec, depth: int) -> dict:
        rng = self.rng
        key_spec, value_spec = spec.args
        op = rng.choice(("add", "drop", "edit", "empty") if d else ("add", "add"))
        if op == "add":
            d[self.fresh(key_spec, depth + 1)] = self.fresh(value_spec, depth + 1)
        elif op == "drop":
            d.pop(rng.choice(list(d)))
        elif op == "edit":
            key = rng.choice(list(d))
            d[key] = self.mutate(d[key], value_spec, depth + 1)
        else:
            d = {}
        return d

    def mutate_args(self, args: tuple, specs: Sequence[TypeSpec]) -> tuple:
        """Mutates one argument (sometimes two) of an argument tuple."""
        if not args:
            return args
        out = list(args)
        count = 2 if len(out) > 1 and self.rng.random() < 0.25 else 1
        for i in self.rng.sample(range(len(out)), count):
            out[i] = self.mutate(out[i], specs[i])
        return tuple(out)

    def fresh_args(self, specs: Sequence[TypeSpec]) -> tuple:
        return tuple(self.fresh(s) for s in specs)

    def crossover(self, a: tuple, b: tuple) -> tuple:
        """Takes each argument from one of two argument tuples."""
        return tuple(x if self.rng.random() < 0.5 else y for x, y in zip(a, b))


def _ordered(values) -> list:
    """Elements in an order that does not depend on hashing (sets vary per process)."""
    if type(values) in (set, frozenset):
        return sorted(values, key=repr)
    return list(values)


def _build(kind: str, items: list):
    if kind == "list":
        return items
    if kind == "tuple...":
        return tuple(items)
    try:
        return set(items) if kind == "set" else frozenset(items)
    except TypeError:
        return set() if kind == "set" else frozenset()
