"""Argument types inferred from observed values: a small type language with join and text form."""

import dataclasses
import re

SCALARS = ("bool", "int", "float", "complex", "str", "bytes", "None")
CONTAINERS = ("list", "set", "frozenset", "dict", "tuple", "tuple...")


class UnsupportedTypeError(Exception):
    """A value has a type outside the supported language."""


@dataclasses.dataclass(frozen=True, order=True)
class TypeSpec:
    """A type in the small language used for validators and generators.

    kind is one of SCALARS, CONTAINERS, "never" (no element seen: an empty container's
    element), "any" or "union". args holds element types: list/set/frozenset/tuple...:
    (element,); dict: (key, value); tuple: one per position; union: the members.
    """

    kind: str
    args: tuple["TypeSpec", ...] = ()

    def __str__(self) -> str:
        if self.kind in SCALARS or self.kind in ("any", "never"):
            return self.kind
        if self.kind == "union":
            return " | ".join(str(a) for a in self.args)
        if self.kind == "tuple...":
            return f"tuple[{self.args[0]}, ...]"
        if self.kind == "tuple" and not self.args:
            return "tuple[()]"
        return f"{self.kind}[{', '.join(str(a) for a in self.args)}]"


NEVER = TypeSpec("never")
ANY = TypeSpec("any")


def infer(value) -> TypeSpec:
    """The most specific TypeSpec of a value.

    Raises:
      UnsupportedTypeError: for objects outside the language (functions, classes ...).
    """
    t = type(value)
    if value is None:
        return TypeSpec("None")
    if t.__name__ in SCALARS and t in (bool, int, float, complex, str, bytes):
        return TypeSpec(t.__name__)
    if t in (list, set, frozenset):
        return TypeSpec(t.__name__, (join_all(infer(v) for v in value),))
    if t is tuple:
        return TypeSpec("tuple", tuple(infer(v) for v in value))
    if t is dict:
        keys = join_all(infer(k) for k in value)
        values = join_all(infer(v) for v in value.values())
        return TypeSpec("dict", (keys, values))
    raise UnsupportedTypeError(f"unsupported argument type {t.__name__}")


def join_all(specs) -> TypeSpec:
    result = NEVER
    for spec in specs:
        result = join(result, spec)
    return result


def _members(spec: TypeSpec) -> tuple[TypeSpec, ...]:
    return spec.args if spec.kind == "union" else (spec,)


def _join_same_kind(a: TypeSpec, b: TypeSpec) -> TypeSpec | None:
    """Joins two specs of one container kind, or returns None when they do not merge."""
    if a.kind == b.kind and a.kind in ("list", "set", "frozenset", "dict", "tuple..."):
        return TypeSpec(a.kind, tuple(join(x, y) for x, y in zip(a.args, b.args)))
    tuples = ("tuple", "tuple...")
    if a.kind in tuples and b.kind in tuples:
        if a.kind == b.kind == "tuple" and len(a.args) == len(b.args):
            return TypeSpec("tuple", tuple(join(x, y) for x, y in zip(a.args, b.args)))
        return TypeSpec("tuple...", (join_all([*a.args, *b.args]),))
    return None


def join(a: TypeSpec, b: TypeSpec) -> TypeSpec:
    """The least TypeSpec covering both (containers merge per kind; scalars form unions)."""
    if a == b or b == NEVER:
        return a
    if a == NEVER:
        return b
    if ANY in (a, b):
        return ANY
    members = list(_members(a))
    for new in _members(b):
        for i, old in enumerate(members):
            if old == new:
                break
            merged = _join_same_kind(old, new)
            if merged is not None:
                members[i] = merged
                break
        else:
            members.append(new)
    members.sort(key=str)
    return members[0] if len(members) == 1 else TypeSpec("union", tuple(members))


def matches(value, spec: TypeSpec) -> bool:
    """True when a value belongs to a TypeSpec (the same test the validator code makes)."""
    kind = spec.kind
    if kind == "any":
        return True
    if kind == "never":
        return False
    if kind == "union":
        return any(matches(value, m) for m in spec.args)
    if kind == "None":
        return value is None
    if kind in SCALARS:
        return type(value).__name__ == kind and type(value) in (
            bool,
            int,
            float,
            complex,
            str,
            bytes,
        )
    if kind in ("list", "set", "frozenset"):
        return type(value).__name__ == kind and _all_match(value, spec.args[0])
    if kind == "dict":
        return (
            type(value) is dict
            and _all_match(value.keys(), spec.args[0])
            and _all_match(value.values(), spec.args[1])
        )
    if kind == "tuple":
        return (
            type(value) is tuple
            and len(value) == len(spec.args)
            and all(matches(v, s) for v, s in zip(value, spec.args))
        )
    if kind == "tuple...":
        return type(value) is tuple and _all_match(value, spec.args[0])
    raise ValueError(f"unknown type kind {kind!r}")


def _all_match(values, element: TypeSpec) -> bool:
    return element == NEVER or all(matches(v, element) for v in values)


_TOKEN = re.compile(r"\s*(tuple\[\(\)\]|\.\.\.|[A-Za-z_]+|\[|\]|,|\|)")


def parse(text: str) -> TypeSpec:
    """Parses the text form written by str(TypeSpec).

    Raises:
      ValueError: when the text is not a type of the language.
    """
    tokens = _TOKEN.findall(text)
    if "".join(tokens).replace(" ", "") != text.replace(" ", ""):
        raise ValueError(f"cannot parse type {text!r}")
    pos = 0

    def union():
        nonlocal pos
        members = [single()]
        while pos < len(tokens) and tokens[pos] == "|":
            pos += 1
            members.append(single())
        return members[0] if len(members) == 1 else TypeSpec("union", tuple(members))

    def single():
        nonlocal pos
        name = tokens[pos]
        pos += 1
        if name == "tuple[()]":
            return TypeSpec("tuple")
        if name in SCALARS or name in ("any", "never"):
            return TypeSpec(name)
        if name not in ("list", "set", "frozenset", "dict", "tuple") or tokens[pos] != "[":
            raise ValueError(f"cannot parse type {text!r}")
        pos += 1
        args = [union()]
        variadic = False
        while tokens[pos] == ",":
            pos += 1
            if tokens[pos] == "...":
                pos += 1
                variadic = True
            else:
                args.append(union())
        if tokens[pos] != "]":
            raise ValueError(f"cannot parse type {text!r}")
        pos += 1
        return TypeSpec("tuple..." if variadic else name, tuple(args))

    try:
        spec = union()
    except IndexError:
        raise ValueError(f"cannot parse type {text!r}") from None
    if pos != len(tokens):
        raise ValueError(f"cannot parse type {text!r}")
    return spec
