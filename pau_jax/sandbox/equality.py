"""Typed equality (`typed_equal`): a tuple never equals a list, floats match within a tolerance.

Set elements and dict keys are matched by their canonical encoding (`values.encode`) in
strict mode; values are told apart by `values.kind_of`.
"""

import math
from typing import Any

from pau_jax.sandbox.values import MAX_DEPTH, EncodingError, encode, kind_of

_NUMERIC = ("bool", "int", "float")


def typed_equal(a: Any, b: Any, *, float_rtol: float = 1e-9, strict: bool = True) -> bool:
    """Whether two values are equal as typed values.

    A tuple never equals a list and str never equals bytes. Floats (and the parts of complex
    numbers) match within the relative tolerance ``float_rtol``; nan matches nan and
    ``0.0`` matches ``-0.0``. Set elements and dict keys match exactly (by encoding in strict
    mode, by Python equality otherwise).

    Args:
      a: first value (decoded or plain Python).
      b: second value.
      float_rtol: relative tolerance for floats; 0 asks for exact equality.
      strict: when True, bool, int and float are distinct types, and so are set and
        frozenset; when False they compare by value like Python's ``==``.

    Returns:
      True when the values match.
    """
    return _equal(a, b, float_rtol, strict, 0)


def _float_equal(x: float, y: float, rtol: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if x == y:
        return True
    if math.isinf(x) or math.isinf(y):
        return False
    return abs(x - y) <= rtol * max(abs(x), abs(y))


def _equal(a: Any, b: Any, rtol: float, strict: bool, depth: int) -> bool:
    if depth > 2 * MAX_DEPTH:
        raise EncodingError(f"values are nested deeper than {2 * MAX_DEPTH} levels")
    ka, kb = kind_of(a), kind_of(b)
    if ka != kb:
        if strict:
            return False
        if ka in _NUMERIC and kb in _NUMERIC:
            if a == b:
                return True
            try:
                return _float_equal(float(a), float(b), rtol)
            except OverflowError:
                return False
        if {ka, kb} == {"set", "frozenset"}:
            return set(a) == set(b)
        if "complex" in (ka, kb) and {ka, kb} <= {"complex", *_NUMERIC}:
            return _equal(complex(a), complex(b), rtol, strict, depth)
        return False
    if ka in ("float",):
        return _float_equal(a, b, rtol)
    if ka == "complex":
        return _float_equal(a.real, b.real, rtol) and _float_equal(a.imag, b.imag, rtol)
    if ka in ("list", "tuple"):
        return len(a) == len(b) and all(_equal(x, y, rtol, strict, depth + 1) for x, y in zip(a, b))
    if ka in ("set", "frozenset"):
        if not strict:
            return set(a) == set(b)
        return len(a) == len(b) and {encode(x) for x in a} == {encode(y) for y in b}
    if ka == "dict":
        if len(a) != len(b):
            return False
        if not strict:
            return a.keys() == b.keys() and all(
                _equal(a[k], b[k], rtol, strict, depth + 1) for k in a
            )
        b_by_key = {encode(k): v for k, v in b.items()}
        for k, v in a.items():
            ek = encode(k)
            if ek not in b_by_key or not _equal(v, b_by_key[ek], rtol, strict, depth + 1):
                return False
        return True
    if ka == "other":
        return type(a) is type(b) and bool(a == b)
    return a == b
