"""Canonical typed encoding of values that cross the sandbox boundary, and their display.

The encoding is JSON in which every value JSON cannot hold exactly carries a type tag:

=====================  ================================================
Python value           encoding
=====================  ================================================
``None``, bool, str    ``null``, ``true`` / ``false``, a JSON string
int                    a JSON number if ``|n| <= 2**53``, else ``["int", "<hex>"]``
float                  ``["float", "<repr>"]`` (``nan``, ``inf``, ``-inf``, ``-0.0`` exact)
complex                ``["complex", "<repr(real)>", "<repr(imag)>"]``
bytes / bytearray      ``["bytes", "<base64>"]`` / ``["bytearray", "<base64>"]``
list / tuple           ``["list", item, ...]`` / ``["tuple", item, ...]``
set / frozenset        ``["set", item, ...]`` / ``["frozenset", item, ...]``, items sorted
dict                   ``["dict", [key, value], ...]``, items sorted by encoded key
anything else          ``["opaque", "<type name>", "<repr>"]``, decoded as `Opaque`
=====================  ================================================

Sets and dicts are written in the order of their items' encoded text, so values that are equal
as typed values encode to the same string whatever their hash or insertion order. Instances of
subclasses of the types above (namedtuple, Counter, IntEnum ...) are encoded as their base type;
``repr`` text of opaque values has memory addresses removed so that it is reproducible.
Typed equality of such values is `equality.typed_equal`.
"""

import base64
import dataclasses
import json
import math
import re
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii
from typing import Any

MAX_DEPTH = 100
_SAFE_INT = 2**53
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_BIG_INT_DISPLAY_BITS = 200_000


class EncodingError(ValueError):
    """A value cannot be encoded, or a text is not a valid encoding."""


@dataclasses.dataclass(frozen=True)
class Opaque:
    """A value of a type the codec does not know, kept as its type name and ``repr`` text."""

    type_name: str
    text: str

    def __repr__(self) -> str:
        return self.text


def type_name(value: Any) -> str:
    """Returns the qualified name of ``type(value)`` (without ``builtins.``)."""
    cls = type(value)
    module = getattr(cls, "__module__", None)
    if module in (None, "builtins"):
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def safe_repr(value: Any) -> str:
    """``repr(value)`` with memory addresses removed; never raises for a misbehaving ``__repr__``."""
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a user __repr__ may raise anything.
        return f"<{type_name(value)} object (repr raised {type(exc).__name__})>"
    if not isinstance(text, str):
        return f"<{type_name(value)} object>"
    return _ADDRESS.sub("", text)


def encode(value: Any, *, max_depth: int = MAX_DEPTH, max_items: int | None = None) -> str:
    """Encodes a value to its canonical typed JSON text.

    Args:
      value: any Python value; unknown types become opaque ``repr`` text.
      max_depth: deepest container nesting accepted.
      max_items: most values (containers and scalars) accepted, or None for no limit.

    Returns:
      The canonical encoding.

    Raises:
      EncodingError: the value is nested deeper than ``max_depth`` or has more than
        ``max_items`` items.
    """
    return _Encoder(max_depth, max_items).encode(value, 0)


class _Encoder:
    def __init__(self, max_depth: int, max_items: int | None):
        self.max_depth = max_depth
        self.max_items = max_items if max_items is not None else -1
        self.count = 0
        self.active: list[Any] = []  # Containers being encoded (identity, for cycles).

    def encode(self, v: Any, depth: int) -> str:
        self.count += 1
        if self.count == self.max_items + 1:
            raise EncodingError(f"value has more than {self.max_items} items")
        t = type(v)
        if t is int:
            return int.__repr__(v) if -_SAFE_INT <= v <= _SAFE_INT else f'["int","{hex(v)}"]'
        if t is str:
            return _dumps(v)
        if v is None:
            return "null"
        if t is bool:
            return "true" if v else "false"
        if t is float:
            return f'["float","{float.__repr__(v)}"]'
        if t in _CONTAINER_TAGS:
            return self._container(v, t, _CONTAINER_TAGS[t], depth)
        return self._other(v, depth)

    def _other(self, v: Any, depth: int) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return self.encode(int.__int__(v), depth)
        if isinstance(v, float):
            return f'["float","{float.__repr__(float.__float__(v))}"]'
        if isinstance(v, str):
            return _dumps(str.__str__(v))
        if isinstance(v, complex):
            c = complex.__complex__(v)
            return f'["complex","{float.__repr__(c.real)}","{float.__repr__(c.imag)}"]'
        if isinstance(v, (bytes, bytearray)):
            tag = "bytes" if isinstance(v, bytes) else "bytearray"
            return f'["{tag}","{base64.b64encode(bytes(memoryview(v))).decode("ascii")}"]'
        for cls, tag in _CONTAINER_TAGS.items():
            if isinstance(v, cls):
                return self._container(v, cls, tag, depth)
        if isinstance(v, Opaque):
            return _opaque_text(v.type_name, v.text)
        return _opaque_text(type_name(v), safe_repr(v))

    def _container(self, v: Any, cls: type, tag: str, depth: int) -> str:
        if depth >= self.max_depth:
            raise EncodingError(f"value is nested deeper than {self.max_depth} levels")
        if _contains_object(self.active, v):
            return _opaque_text(type_name(v), "{...}" if cls is dict else "[...]")
        self.active.append(v)
        try:
            encode = self.encode
            if cls is dict:
                if 0 <= self.max_items < self.count + 2 * len(v):
                    raise EncodingError(f"value has more than {self.max_items} items")
                pairs = sorted(
                    (encode(k, depth + 1), encode(x, depth + 1)) for k, x in list(dict.items(v))
                )
                return '["dict"' + "".join([f",[{k},{x}]" for k, x in pairs]) + "]"
            items = list(cls.__iter__(v))
            if 0 <= self.max_items < self.count + len(items):
                raise EncodingError(f"value has more than {self.max_items} items")
            parts = [encode(x, depth + 1) for x in items]
            if cls is set or cls is frozenset:
                parts.sort()
            return f'["{tag}"' + "".join(["," + p for p in parts]) + "]"
        finally:
            self.active.pop()


_CONTAINER_TAGS = {tuple: "tuple", list: "list", dict: "dict", set: "set", frozenset: "frozenset"}
_dumps = encode_basestring_ascii


def _opaque_text(name: str, text: str) -> str:
    return f'["opaque",{json.dumps(name)},{json.dumps(text)}]'


def decode(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """Decodes a canonical typed JSON text (the inverse of `encode`).

    Raises:
      EncodingError: the text is not a valid encoding.
    """
    try:
        if isinstance(text, (bytes, bytearray)):
            text = text.decode("utf-8")
        tree = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise EncodingError(f"malformed encoded value: {exc}") from None
    return _decode_tree(tree, 0, max_depth)


def _reject_float(token: str) -> float:
    raise ValueError(f"bare JSON number {token!r} is not a canonical encoding")


_DECODER = json.JSONDecoder(parse_float=_reject_float, parse_constant=_reject_float)


def _decode_tree(node: Any, depth: int, max_depth: int) -> Any:
    t = type(node)
    if t is int or t is str or node is None or t is bool:
        return node
    if t is not list or not node or type(node[0]) is not str:
        raise EncodingError(f"malformed encoded value: unexpected {t.__name__}")
    if depth >= max_depth:
        raise EncodingError(f"encoded value is nested deeper than {max_depth} levels")
    tag = node[0]
    builder = _SEQUENCES.get(tag)
    try:
        if builder is not None:
            return builder([_decode_tree(x, depth + 1, max_depth) for x in node[1:]])
        if tag == "dict":
            return _decode_dict(node, depth, max_depth)
        return _decode_scalar(tag, node[1:])
    except (TypeError, ValueError) as exc:
        if isinstance(exc, EncodingError):
            raise
        raise EncodingError(f"malformed encoded value ({tag}): {exc}") from None


_SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def _decode_dict(node: list[Any], depth: int, max_depth: int) -> dict[Any, Any]:
    out = {}
    for pair in node[1:]:
        if type(pair) is not list or len(pair) != 2:
            raise EncodingError("malformed encoded value: dict item is not a pair")
        out[_decode_tree(pair[0], depth + 1, max_depth)] = _decode_tree(
            pair[1], depth + 1, max_depth
        )
    return out


def _decode_scalar(tag: str, rest: list[Any]) -> Any:
    if not all(type(x) is str for x in rest):
        raise EncodingError(f"malformed encoded value: {tag!r} payload is not text")
    n = len(rest)
    if tag == "float" and n == 1:
        return float(rest[0])
    if tag == "int" and n == 1:
        return int(rest[0], 16)
    if tag == "complex" and n == 2:
        return complex(float(rest[0]), float(rest[1]))
    if tag in ("bytes", "bytearray") and n == 1:
        raw = base64.b64decode(rest[0], validate=True)
        return raw if tag == "bytes" else bytearray(raw)
    if tag == "opaque" and n == 2:
        return Opaque(rest[0], rest[1])
    raise EncodingError(f"malformed encoded value: unknown tag {tag!r} with {n} fields")


def kind_of(v: Any) -> str:
    """The kind a value is compared and displayed as: 'none', 'bool', 'int', ..., 'other'."""
    if v is None:
        return "none"
    for cls, name in (
        (bool, "bool"),
        (int, "int"),
        (float, "float"),
        (complex, "complex"),
        (str, "str"),
        (bytes, "bytes"),
        (bytearray, "bytearray"),
        (tuple, "tuple"),
        (list, "list"),
        (frozenset, "frozenset"),
        (set, "set"),
        (dict, "dict"),
        (Opaque, "opaque"),
    ):
        if isinstance(v, cls):
            return name
    return "other"


def display_error(type_name: str, message: str) -> str:
    """How an exception is shown: ``"TypeError: message"`` (or just the type name)."""
    return f"{type_name}: {message}" if message else type_name


def display(value: Any, *, max_chars: int | None = None) -> str:
    """The ``repr``-like text shown for a value.

    Builtin containers are written like ``repr`` but with set and frozenset items in a
    canonical order (natural order when the items are mutually comparable numbers, strings or
    bytes; otherwise the order of their encodings), so the text does not depend on the hash
    seed. Dicts keep their iteration order. Other objects use ``repr`` without memory
    addresses.

    Args:
      value: the value.
      max_chars: cut the text to at most this many characters (ending in ``...``).

    Returns:
      The text.
    """
    text = _display(value, 0, [])
    if max_chars is not None and len(text) > max_chars:
        return text[: max(0, max_chars - 3)] + "..."
    return text


def _contains_object(stack: list[Any], v: Any) -> bool:
    """Whether ``v`` itself (not an equal value) is on ``stack``; avoids id() and its audit event."""
    for item in stack:
        if item is v:
            return True
    return False


def _display(v: Any, depth: int, active: list[Any]) -> str:
    t = type(v)
    if t is int:
        return _int_text(v)
    if t in _PLAIN:
        return repr(v)
    if t is Opaque:
        return v.text
    if t not in _CONTAINER_TAGS:
        return safe_repr(v)
    if _contains_object(active, v):
        return "{...}" if t is dict else "[...]"
    if depth >= MAX_DEPTH:
        return "..."
    active.append(v)
    try:
        if t is dict:
            inner = ", ".join(
                [
                    f"{_display(k, depth + 1, active)}: {_display(x, depth + 1, active)}"
                    for k, x in list(v.items())
                ]
            )
            return "{" + inner + "}"
        items = list(v) if t is list or t is tuple else _display_order(v)
        inner = ", ".join([_display(x, depth + 1, active) for x in items])
        if t is list:
            return "[" + inner + "]"
        if t is tuple:
            return "(" + inner + ("," if len(items) == 1 else "") + ")"
        if not items:
            return t.__name__ + "()"
        return "{" + inner + "}" if t is set else "frozenset({" + inner + "})"
    finally:
        active.pop()


_PLAIN = frozenset({bool, float, str, bytes, bytearray, complex, type(None)})


def _display_order(items: Iterable[Any]) -> list[Any]:
    items = list(items)
    kinds = {kind_of(x) for x in items}
    natural = kinds <= {"int", "float"} or kinds == {"str"} or kinds == {"bytes"}
    if natural and not any(isinstance(x, float) and math.isnan(x) for x in items):
        return sorted(items)
    return [x for _, x in sorted(((encode(x), i), x) for i, x in enumerate(items))]


def _int_text(n: int) -> str:
    try:
        return int.__repr__(n)
    except ValueError:
        pass
    if n.bit_length() > _BIG_INT_DISPLAY_BITS:
        digits = int(n.bit_length() * math.log10(2)) + 1
        return f"<int with about {digits} digits>"
    sign, n = ("-", -n) if n < 0 else ("", n)
    chunk = 10**1000
    pieces = []
    while n:
        n, r = divmod(n, chunk)
        pieces.append(r)
    head = int.__repr__(pieces[-1])
    return sign + head + "".join(format(p, "01000d") for p in reversed(pieces[:-1]))
