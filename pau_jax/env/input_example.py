"""The example input of the generation prompt: the function's arity, shaped like its shown examples.

A fixed example such as ``(3, 'abc', [1, 2])`` has three arguments whatever the
function takes, and small models copy it. ``example_input`` instead takes the
first shown example's arguments and changes every scalar in them, keeping each
value's type and each container's shape, so the example has the right arity and
the right kinds of values without being a call the agent has already seen.
"""

import math
import re
from collections.abc import Sequence
from typing import Any

# Where the generation prompt shows its example (prompts.generate_messages), as values or
# as the form with a placeholder for each value.
_SHOWN = re.compile(r"(?:For example|The form to fill in):\n```\n(.*?)\n```", re.DOTALL)
# How the generation prompt shows its example input (`EpisodeConfig.example_style`).
EXAMPLE_STYLES = ("values", "placeholders")
# Arguments of a fallback example when no shown example is known, cycled to the arity.
_FALLBACK = (3, "abc", [1, 2], 2.5, True)


def _shift_char(c: str) -> str:
    if "a" <= c <= "y" or "A" <= c <= "Y" or "0" <= c <= "8":
        return chr(ord(c) + 1)
    if c in "zZ9":
        return {"z": "a", "Z": "A", "9": "0"}[c]
    return c


def perturb(value: Any) -> Any:
    """A value of the same type and shape as ``value`` with every scalar changed (deterministic).

    Booleans flip, integers and floats move, letters and digits of strings and bytes
    shift by one (``'abc'`` -> ``'bcd'``), containers are rebuilt from their perturbed
    items; None and objects of other types stay as they are.
    """
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 3 if value >= 0 else value - 2
    if isinstance(value, float):
        return round(value + 1.5, 6)
    if isinstance(value, str):
        return "".join(_shift_char(c) for c in value) if value else "ab"
    if isinstance(value, bytes):
        text = "".join(_shift_char(chr(b)) if b < 128 else chr(b) for b in value)
        return text.encode("latin-1") if value else b"ab"
    if isinstance(value, list):
        return [perturb(v) for v in value]
    if isinstance(value, tuple):
        return tuple(perturb(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return type(value)(perturb(v) for v in value)
    if isinstance(value, dict):
        return {perturb(k): perturb(v) for k, v in value.items()}
    return value


def _literal(args: Sequence[Any]) -> str:
    """``args`` as a Python tuple literal (one argument keeps its trailing comma)."""
    if len(args) == 1:
        return f"({args[0]!r},)"
    return "(" + ", ".join(repr(a) for a in args) + ")"


def example_input(n_params: int, shown_args: Sequence[tuple] = ()) -> str:
    """The argument tuple the generation prompt shows as its example.

    Args:
      n_params: the function's number of arguments.
      shown_args: the argument tuples of the shown examples; the first one with
        ``n_params`` arguments is perturbed (``perturb``). Without one, the example
        cycles through a few literals of different types.

    Returns:
      A Python tuple literal with exactly ``n_params`` items, e.g. ``([4, 5], 'bcd')``.
    """
    if n_params == 0:
        return "()"
    for args in shown_args:
        if len(args) == n_params:
            return _literal(perturb(tuple(args)))
    return _literal([_FALLBACK[i % len(_FALLBACK)] for i in range(n_params)])


def placeholder_example(n_params: int, shown_args: Sequence[tuple] = ()) -> str:
    """The form of an argument tuple with a ``<type>`` placeholder for each value to choose.

    Shaped like the shown examples (``argument_shapes``): ``([<int>, ...], <str>)`` for a list
    of ints and a string; ``(<value>, <value>)`` when no shown example has ``n_params``
    arguments. It holds no value a model could copy as a call: a copy does not parse.
    """
    shapes = argument_shapes(n_params, shown_args) or (("any",),) * n_params
    parts = [_placeholder(shape) for shape in shapes]
    if len(parts) == 1:
        return f"({parts[0]},)"
    return "(" + ", ".join(parts) + ")"


def _placeholder(shape: tuple) -> str:
    kind = shape[0]
    if kind == "alt":
        names = [_placeholder(s) for s in shape[1]]
        if all(n.startswith("<") and n.endswith(">") for n in names):
            return "<" + " or ".join(n[1:-1] for n in names) + ">"
        return " or ".join(names)
    if kind in ("int", "float", "str", "bytes", "bool"):
        return f"<{kind}>"
    if kind == "none":
        return "None"
    if kind == "list":
        return f"[{_placeholder(shape[1])}, ...]"
    if kind == "tuple":
        return f"({_placeholder(shape[1])}, ...)"
    if kind == "set":
        return f"{{{_placeholder(shape[1])}, ...}}"
    if kind == "dict":
        return f"{{{_placeholder(shape[1])}: {_placeholder(shape[2])}, ...}}"
    return "<value>"


def _union(shapes: Sequence[tuple]) -> tuple:
    distinct = sorted(set(shapes))
    return distinct[0] if len(distinct) == 1 else ("alt", tuple(distinct))


def value_shape(value: Any, depth: int = 2) -> tuple:
    """A hashable descriptor of a value's type and container shape, for typed input grammars.

    `("int",)`, `("float",)`, `("str",)`, `("bytes",)`, `("bool",)`, `("none",)`;
    `("list" | "tuple" | "set", item)`, `("dict", key, value)` with the union
    (`("alt", (...))`) of the items' shapes; `("any",)` for what has no literal (an
    empty set, inf, other objects), an empty container's items, or below `depth`.
    """
    if isinstance(value, bool):
        return ("bool",)
    if isinstance(value, int):
        return ("int",)
    if isinstance(value, float):
        return ("float",) if math.isfinite(value) else ("any",)
    if isinstance(value, str):
        return ("str",)
    if isinstance(value, bytes):
        return ("bytes",)
    if value is None:
        return ("none",)
    if depth == 0:
        return ("any",)
    kinds = {list: "list", tuple: "tuple", set: "set", frozenset: "set"}
    if type(value) in kinds:
        if not value:
            return ("any",) if kinds[type(value)] == "set" else (kinds[type(value)], ("any",))
        return (kinds[type(value)], _union([value_shape(v, depth - 1) for v in value]))
    if isinstance(value, dict):
        if not value:
            return ("dict", ("any",), ("any",))
        keys = _union([value_shape(k, depth - 1) for k in value])
        return ("dict", keys, _union([value_shape(v, depth - 1) for v in value.values()]))
    return ("any",)


def argument_shapes(n_params: int, shown_args: Sequence[tuple] = ()) -> tuple[tuple, ...]:
    """Per argument, the union of its shapes over the shown examples of `n_params` arguments.

    () when no shown example has `n_params` arguments (the grammar then takes any literal).
    """
    examples = [args for args in shown_args if len(args) == n_params]
    if not examples or n_params == 0:
        return ()
    return tuple(_union([value_shape(args[i]) for args in examples]) for i in range(n_params))


def shown_example(prompt: str) -> str | None:
    """The example input a generation prompt's text shows (None when it shows none)."""
    match = _SHOWN.search(prompt)
    return match.group(1).strip() if match else None


def copies_example(messages, input_text: str) -> bool:
    """Whether an input is the example its generation prompt (the last message) showed.

    Compared up to spacing, enclosing parentheses and a trailing comma.
    """
    prompt = (list(messages) or [{}])[-1].get("content", "")
    example = shown_example(prompt)
    return example is not None and _squash(input_text) == _squash(example)


# The shown examples' lines of a prompt (prompts.conceptualize_messages and the others).
_EXAMPLES = re.compile(r"Examples given to you:\n(.*?)(?:\n\n|\Z)", re.DOTALL)


def repeats_shown_example(messages, call: str) -> bool:
    """Whether a call (``test_func(...)``) is one of the shown examples its prompts listed.

    Such a call adds nothing: its result is already on the page. Compared up to spacing.
    """
    shown = set()
    for message in messages:
        match = _EXAMPLES.search(message.get("content", ""))
        if match:
            shown |= {
                re.sub(r"\s+", "", line.rsplit(" -> ", 1)[0])
                for line in match.group(1).splitlines()
                if " -> " in line
            }
    return bool(call) and re.sub(r"\s+", "", call) in shown


def _squash(args_text: str) -> str:
    """Argument text without spaces, enclosing parentheses or a trailing comma."""
    return re.sub(r"\s+", "", args_text).removeprefix("(").removesuffix(")").rstrip(",")
