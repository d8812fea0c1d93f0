"""Sandboxed execution of untrusted Python functions, and the typed codec of their values.

Running calls::

    from pau_jax.sandbox import Executor, SandboxConfig

    with Executor(workers=2, config=SandboxConfig(memory_bytes=512 << 20)) as ex:
        r = ex.call(source_code, (3, [1, 2]), timeout_s=1.0)
        r.ok, r.value, r.error_type, r.error_message, r.timed_out, r.stdout, r.display
        results = ex.call_many(source_code, [(1,), (2,), (3,)], timeout_s=1.0)

``Executor`` starts ``workers`` fresh interpreters, like multiprocessing's spawn method
(fork+exec in C, never a Python-level fork, so a parent that has imported JAX is safe) but
without re-importing the parent's ``__main__``, each in its own session, with a scrubbed
environment (the parent's variables are not passed on) and a fixed PYTHONHASHSEED. Each
worker confines itself before running anything: a new network namespace with no interface
up, a mount namespace in which everything but its private directory is read-only, a switch to
an unprivileged user when started as root (so RLIMIT_NPROC=0 forbids processes and threads, and
files only root or other users may read, like ``/etc/shadow``, stay closed), no capability in
any set, no_new_privs, rlimits on address space, CPU time, processes, open files and file
size, a parent-death signal, and an audit hook (`guard`) that refuses sockets, processes,
ctypes, signals to other processes, reading other processes' files and file writes outside its
directory with ``PermissionError("sandbox: ... is not allowed")``. ``Executor.isolation`` says which OS layers
the machine allowed (the audit hook and rlimits apply everywhere). A worker compiles each
source once (cached by content hash) under a real file name, runs every call in a fresh module
namespace, and restores process state afterwards (builtins, streams, ``sys`` settings,
environment, working directory, and more when the source changes; see `process_state`). The
wall-clock limit is enforced by the parent, which kills the worker's process group and starts a
replacement. Calls from many threads, and the calls of one ``call_many``, are spread over the
idle workers; stdout and stderr of each call are captured and capped.

Error types of a failed ``CallResult``: the function's own exception type, ``TimeoutError``
(with ``timed_out=True``), ``MemoryError``, ``PermissionError`` (a refused operation),
``WorkerCrashed`` (the worker died; the message names the signal or exit code) and
``ResultTooLarge``.

Coverage of the function's own source, as coverage.py counts it::

    results = ex.call_many(source_code, inputs, measure_coverage=True)
    results[0].coverage.lines, results[0].coverage.arcs      # executed by that call
    analysis = analyse_source(source_code)                    # statements, branch_arcs
    summary = analysis.summarize(r.coverage for r in results) # union over the calls
    summary.statement_percent, summary.branch_percent

Values cross the process boundary in the canonical typed encoding of `values` (tuples stay
tuples, ``'5'`` stays distinct from ``5``); `equality.typed_equal` compares results and
`values.display` / `values.display_error` give the text an agent sees. `parse_call_args` turns
an agent's argument text into an argument tuple by literal evaluation.
"""

from pau_jax.sandbox import values
from pau_jax.sandbox.args import ArgumentParseError, parse_call_args
from pau_jax.sandbox.config import CallResult, CoverageRecord, SandboxConfig
from pau_jax.sandbox.executor import Executor, SandboxError
from pau_jax.sandbox.source_coverage import CoverageSummary, SourceAnalysis, analyse_source

__all__ = [
    "ArgumentParseError",
    "CallResult",
    "CoverageRecord",
    "CoverageSummary",
    "Executor",
    "SandboxConfig",
    "SandboxError",
    "SourceAnalysis",
    "analyse_source",
    "parse_call_args",
    "values",
]
