"""Parsing of an agent's argument text into the argument tuple of a call, by literal evaluation only."""

import ast
from typing import Any

MAX_CHARS = 10_000
MAX_DEPTH = 32

_CONTAINERS = (ast.Tuple, ast.List, ast.Set, ast.Dict)


class ArgumentParseError(ValueError):
    """The argument text is not a valid literal argument list for the function."""


def parse_call_args(
    text: str, n_params: int, *, max_chars: int = MAX_CHARS, max_depth: int = MAX_DEPTH
) -> tuple[Any, ...]:
    """Turns the text of a function's arguments into the tuple of arguments.

    Only Python literals are accepted (``ast.literal_eval``). For a function of one parameter,
    ``x``, ``(x)`` and ``(x,)`` all give ``(x,)``; any other value, a list or a tuple of
    several items included, is that one argument and is never spread. For ``n`` parameters the
    text must be ``n`` comma-separated literals, with or without enclosing parentheses. For no
    parameters the text must be empty or ``()``.

    Args:
      text: the argument text, e.g. ``"[1, 2], 'a'"``.
      n_params: number of positional parameters of the function.
      max_chars: longest text accepted.
      max_depth: deepest nesting of containers accepted.

    Returns:
      The argument tuple.

    Raises:
      ArgumentParseError: the text is too long, too deeply nested, not a literal, or has the
        wrong number of arguments.
    """
    if n_params < 0:
        raise ValueError(f"n_params must be >= 0, got {n_params}")
    if not isinstance(text, str):
        raise ArgumentParseError(f"arguments must be text, got {type(text).__name__}")
    if len(text) > max_chars:
        raise ArgumentParseError(
            f"arguments are {len(text)} characters long; the limit is {max_chars}"
        )
    stripped = text.strip()
    if not stripped:
        if n_params == 0:
            return ()
        raise ArgumentParseError(f"no arguments given; the function takes {n_params}")
    try:
        tree = ast.parse(stripped, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ArgumentParseError(f"arguments are not valid Python: {_first_line(exc)}") from None
    depth = _depth(tree.body)
    if depth > max_depth:
        raise ArgumentParseError(
            f"arguments are nested {depth} levels deep; the limit is {max_depth}"
        )
    try:
        value = ast.literal_eval(tree)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ArgumentParseError(
            f"arguments must be Python literals (numbers, strings, bytes, None, True, False, "
            f"tuples, lists, sets, dicts): {_first_line(exc)}"
        ) from None
    is_tuple = isinstance(tree.body, ast.Tuple)
    if n_params == 1:
        if is_tuple and len(value) == 1:
            return value
        return (value,)
    args = value if is_tuple else (value,)
    if len(args) != n_params:
        raise ArgumentParseError(
            f"got {len(args)} argument{'s' if len(args) != 1 else ''}; "
            f"the function takes {n_params}"
        )
    return args


def _depth(node: ast.AST) -> int:
    """Deepest nesting of container literals below ``node`` (iterative, so never recurses)."""
    deepest = 0
    stack = [(node, 1 if isinstance(node, _CONTAINERS) else 0)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        for child in ast.iter_child_nodes(current):
            stack.append((child, depth + (1 if isinstance(child, _CONTAINERS) else 0)))
    return deepest


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
