"""How the prompts show a call, its result and an error: the 'repr' and 'str' display modes.

'repr' (pau_jax's default) shows typed displays (`values.display`: `'5'` differs from
`5`) and errors as `Type: message`; 'str' (the released code) shows results with `str`,
errors as the message only and each call as Python literals or the agent's own text.
"""

from collections.abc import Sequence
from typing import Any

from pau_jax.sandbox import values


def display_value(value: Any, mode: str) -> str:
    return values.display(value) if mode == "repr" else str(value)


def display_error(error_type: str, message: str, mode: str) -> str:
    return f"{error_type}: {message}" if mode == "repr" else message


def render_call(args: Sequence[Any], mode: str = "repr") -> str:
    """`test_func(<arg>, <arg>)`: typed displays in 'repr' mode, Python literals in 'str' mode.

    In 'str' mode a call is shown as literal text, as the released code shows the
    inputs it was given (`('5', 5)` stays `test_func('5', 5)`, never `test_func(5, 5)`).
    """
    shown = (values.display(a) for a in args) if mode == "repr" else (repr(a) for a in args)
    return "test_func(" + ", ".join(shown) + ")"


def literal_call(args_text: str) -> str:
    """`test_func` applied to the agent's own argument text, as written (the 'str' display).

    A parenthesised tuple keeps its parentheses as the call's (`(1, 'a')` ->
    `test_func(1, 'a')`); any other text is wrapped (`[1, 2]` -> `test_func([1, 2])`).
    """
    text = args_text.strip()
    if text.startswith("(") and text.endswith(")"):
        return "test_func" + text
    return f"test_func({text})"
