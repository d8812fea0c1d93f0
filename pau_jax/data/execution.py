"""Running code in the sandbox for the data pipeline: outcomes with typed outputs and coverage."""

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Sequence

from pau_jax.sandbox import values

UNENCODABLE = "UnencodableOutput"

# CPython 3.11's ast module is not safe to use from several threads at once (parse and
# compile can fail with "AST constructor recursion depth mismatch"), and coverage.py's
# parser uses it. Tasks built on parallel threads therefore hold this lock except while
# they wait for the sandbox.
_LOCK = threading.Lock()
_STATE = threading.local()


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Runs the body holding the data layer's lock, released during sandbox calls."""
    with _LOCK:
        _STATE.held = True
        try:
            yield
        finally:
            _STATE.held = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one call did.

    Attributes:
      ok: the call returned normally and its value is encodable.
      value: the returned value (None unless ok).
      output: canonical typed encoding of the value ("" unless ok).
      error_type: exception class name when not ok ("" when ok).
      timed_out: the call ran past its time limit.
      lines: raw executed lines of the code (empty unless coverage was measured).
      arcs: raw executed arcs of the code (empty unless coverage was measured).
      wall_s: wall-clock seconds of the call.
    """

    ok: bool
    value: object
    output: str
    error_type: str
    timed_out: bool
    lines: tuple[int, ...] = ()
    arcs: tuple[tuple[int, int], ...] = ()
    wall_s: float = 0.0

    @property
    def unstable(self) -> bool:
        """The outcome depends on the machine (time-out, killed worker), not on the code."""
        return self.timed_out or self.error_type == "WorkerCrashed"

    def same_behaviour(self, other: "Outcome") -> bool:
        """Identical typed outputs, or the same exception type (time-outs never match)."""
        if self.timed_out or other.timed_out:
            return False
        if self.ok or other.ok:
            return self.ok and other.ok and self.output == other.output
        return self.error_type == other.error_type


_OPAQUE = '["opaque",'


def encode_or_none(value) -> str | None:
    """values.encode(value), or None when the codec cannot represent it exactly (opaque)."""
    try:
        text = values.encode(value)
    except (ValueError, RecursionError):
        return None
    return None if _OPAQUE in text else text


def _outcome(result, coverage: bool) -> Outcome:
    record = result.coverage if coverage else None
    lines = tuple(sorted(record.lines)) if record else ()
    arcs = tuple(sorted(record.arcs)) if record else ()
    if result.ok:
        output = None if _OPAQUE in result.encoded else result.encoded
        if output is not None:
            return Outcome(
                ok=True,
                value=result.value,
                output=output,
                error_type="",
                timed_out=False,
                lines=lines,
                arcs=arcs,
            )
        return Outcome(
            ok=False,
            value=None,
            output="",
            error_type=UNENCODABLE,
            timed_out=False,
            lines=lines,
            arcs=arcs,
        )
    return Outcome(
        ok=False,
        value=None,
        output="",
        error_type=result.error_type or "Error",
        timed_out=bool(result.timed_out),
        lines=lines,
        arcs=arcs,
    )


def run_many(
    executor,
    code: str,
    args_list: Sequence[tuple],
    *,
    entry: str,
    timeout_s: float,
    coverage: bool = False,
) -> list[Outcome]:
    """Calls `entry` of `code` once per argument tuple in the sandbox.

    Args:
      executor: a started pau_jax.sandbox.Executor.
      code: module source.
      args_list: argument tuples.
      entry: name of the function to call.
      timeout_s: time limit per call.
      coverage: measure executed lines and arcs of `code` per call.

    Returns:
      One Outcome per argument tuple, in order.
    """
    if not args_list:
        return []
    held = getattr(_STATE, "held", False)
    if held:
        _LOCK.release()
    try:
        results = executor.call_many(
            code,
            list(args_list),
            timeout_s=timeout_s,
            entry=entry,
            measure_coverage=coverage,
        )
    finally:
        if held:
            _LOCK.acquire()
    return [_outcome(r, coverage) for r in results]
