"""Code match: a coder model writes `test_func` from a description; run it on E_test in the sandbox.

Score = fraction of held-out inputs on which the written function gives the same
result as the true one, compared with `equality.typed_equal` (a tuple never equals
a list; `'5'` never equals `5`). The true results are the dataset's stored
held-out outputs when given (`expected_outputs`, the benchmark's answer key);
otherwise the true function is run on the inputs. When the true function raises
on an input, a match needs the same exception type. A true result that could
not be obtained (the reference call timed out, ran out of memory, crashed its
worker or returned a result too large to send) is not compared: it leaves the
score and is counted in `incomparable`. Code that does not parse or define the
entry function scores 0 on every input and is flagged.

The coder is asked through `policy.complete` with the answer shape `CODE`: a local
coder whose sampling has `structured` other than 'off' writes exactly one ```python
block and closes it before its token budget ends (`sampling.input_grammar.code_grammar`),
so its block is always read; with 'off' and for an endpoint nothing is masked.
"""

import dataclasses
import re
from collections.abc import Sequence

from pau_jax.env.answer_shape import AnswerShape
from pau_jax.env.text_blocks import strip_think
from pau_jax.sandbox import equality

CODER_PROMPT_VERSION = "coder-v1"

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.I)


# Outcomes of a reference call that say nothing about the function's behaviour on the input.
REFERENCE_FAILURES = frozenset({"TimeoutError", "MemoryError", "WorkerCrashed", "ResultTooLarge"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeMatch:
    """The score of one predicted function on E_test.

    Attributes:
      score: matches / compared inputs; None when no input could be compared.
      code: the predicted source.
      runnable: False when every call failed with a syntax or name error.
      matches: per input, whether it matched (False for an incomparable input).
      incomparable: inputs whose true result could not be obtained (not in the score).
    """

    score: float | None
    code: str
    runnable: bool
    matches: tuple[bool, ...]
    incomparable: int = 0


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


# What a coder's reply must be (masked only by a local coder with structured decoding).
CODE = AnswerShape("code")


def write_code(coder, conversations: Sequence[list[dict]]) -> list[str]:
    """The code of each coder conversation (`coder_messages`), in one batched call."""
    replies = coder.complete(conversations, answers=[CODE] * len(conversations))
    return [extract_code(r if isinstance(r, str) else r.text) for r in replies]


def extract_code(text: str) -> str:
    """The last fenced Python block of an answer, or the whole answer when it has none."""
    body = strip_think(text)
    blocks = _FENCE.findall(body)
    return (blocks[-1] if blocks else body).strip() + "\n"


def _same(expected, got) -> bool:
    if expected.ok:
        return got.ok and equality.typed_equal(expected.value, got.value)
    return (not got.ok) and expected.error_type == got.error_type and not got.timed_out


def _comparable(expected) -> bool:
    return expected.ok or not (expected.timed_out or expected.error_type in REFERENCE_FAILURES)


@dataclasses.dataclass(frozen=True)
class _Stored:
    """A stored held-out output as a reference result (always a return value)."""

    value: object
    ok: bool = True
    timed_out: bool = False
    error_type: str | None = None


def score_code(
    executor,
    true_code: str,
    predicted_code: str,
    inputs: Sequence[tuple],
    *,
    timeout_s: float = 2.0,
    expected=None,
    expected_outputs: Sequence | None = None,
) -> CodeMatch:
    """Runs the predicted function on `inputs` in the sandbox and compares it with the true results.

    Args:
      executor: a `pau_jax.sandbox.Executor`.
      true_code, predicted_code: sources defining `test_func`.
      inputs: argument tuples (E_test).
      timeout_s: wall-clock limit of each call.
      expected: the true function's `CallResult`s on `inputs`, if already known.
      expected_outputs: the stored true return values on `inputs` (the dataset's
        held-out outputs); when given, the true function is not run.
    """
    if not inputs:
        raise ValueError("score_code needs at least one held-out input")
    if expected_outputs is not None:
        if len(expected_outputs) != len(inputs):
            raise ValueError(
                f"{len(expected_outputs)} stored outputs for {len(inputs)} held-out inputs; "
                "pass one output per input"
            )
        expected = [_Stored(value) for value in expected_outputs]
    elif expected is None:
        expected = executor.call_many(true_code, list(inputs), timeout_s=timeout_s)
    # The model's code never runs in a worker that has held a reference source.
    got = executor.call_many(predicted_code, list(inputs), timeout_s=timeout_s, origin="generated")
    runnable = not all(
        (not g.ok) and g.error_type in ("SyntaxError", "NameError", "IndentationError") for g in got
    )
    comparable = [_comparable(e) for e in expected]
    matches = tuple(c and _same(e, g) for c, e, g in zip(comparable, expected, got, strict=True))
    compared = sum(comparable)
    return CodeMatch(
        score=sum(matches) / compared if compared else None,
        code=predicted_code,
        runnable=runnable,
        matches=matches,
        incomparable=len(inputs) - compared,
    )
