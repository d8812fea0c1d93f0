"""Code match: a coder model writes `test_func` from a description; run it on E_test in the sandbox.

Score = fraction of held-out inputs on which the written function gives the same
result as the true one, compared with `values.typed_equal` (a tuple never equals
a list; `'5'` never equals `5`). When the true function raises on an input, a
match needs the same exception type. Code that does not parse or define the
entry function scores 0 on every input and is flagged.
"""

import dataclasses
import re
from collections.abc import Sequence

from pau_jax.env.parse import strip_think
from pau_jax.sandbox import values

CODER_PROMPT_VERSION = "coder-v1"

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.I)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeMatch:
    """The score of one predicted function on E_test."""

    score: float
    code: str
    runnable: bool
    matches: tuple[bool, ...]


def coder_messages(header: str, description: str, examples: Sequence[str] = ()) -> list[dict]:
    """Asks for an implementation of `header` from `description` (and optional observed calls)."""
    shown = ""
    if examples:
        shown = "\nObserved calls:\n" + "\n".join(examples) + "\n"
    user = (
        "Write a Python function with exactly this header that does what the description says.\n"
        f"Header: {header}\nDescription: {description or '(none)'}\n{shown}"
        "Answer with the complete function in one ```python code block, nothing else. "
        "Standard-library imports are allowed inside the block."
    )
    return [{"role": "user", "content": user}]


def extract_code(text: str) -> str:
    """The last fenced Python block of an answer, or the whole answer when it has none."""
    body = strip_think(text)
    blocks = _FENCE.findall(body)
    return (blocks[-1] if blocks else body).strip() + "\n"


def _same(expected, got) -> bool:
    if expected.ok:
        return got.ok and values.typed_equal(expected.value, got.value)
    return (not got.ok) and expected.error_type == got.error_type and not got.timed_out


def score_code(
    executor,
    true_code: str,
    predicted_code: str,
    inputs: Sequence[tuple],
    *,
    timeout_s: float = 2.0,
    expected=None,
) -> CodeMatch:
    """Runs both functions on `inputs` in the sandbox and compares the results.

    Args:
      executor: a `pau_jax.sandbox.Executor`.
      true_code, predicted_code: sources defining `test_func`.
      inputs: argument tuples (E_test).
      expected: the true function's `CallResult`s on `inputs`, if already known.
    """
    if not inputs:
        raise ValueError("score_code needs at least one held-out input")
    if expected is None:
        expected = executor.call_many(true_code, list(inputs), timeout_s=timeout_s)
    got = executor.call_many(predicted_code, list(inputs), timeout_s=timeout_s)
    runnable = not all(
        (not g.ok) and g.error_type in ("SyntaxError", "NameError", "IndentationError") for g in got
    )
    matches = tuple(_same(e, g) for e, g in zip(expected, got, strict=True))
    return CodeMatch(
        score=sum(matches) / len(matches), code=predicted_code, runnable=runnable, matches=matches
    )
