"""Limits and isolation settings of sandbox workers, and the record of one sandboxed call."""

import dataclasses
from typing import Any

from pau_jax.sandbox import uids, values

DEFAULT_ENTRY = "test_func"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Limits and isolation of every worker process of an `Executor`.

    Attributes:
      memory_bytes: address-space limit of a worker (RLIMIT_AS); allocations beyond it raise
        MemoryError.
      cpu_time_s: CPU seconds a worker may use over its life (RLIMIT_CPU); a worker is replaced
        before a call that could cross it.
      max_calls_per_worker: a worker is replaced after this many calls.
      max_open_files: open file descriptors per worker (RLIMIT_NOFILE).
      max_file_bytes: largest file a worker may write (RLIMIT_FSIZE).
      max_output_bytes: characters of stdout and of stderr kept per call; the rest is dropped.
      max_result_bytes: longest encoded return value; longer results become ResultTooLarge.
      max_display_chars: longest display text returned per call.
      default_timeout_s: wall-clock limit of a call when none is given.
      start_timeout_s: how long a new worker may take to report ready.
      hash_seed: PYTHONHASHSEED of the workers, so set and dict orders are reproducible.
      random_seed: the stdlib ``random`` module is seeded with this before every call (when the
        code has imported it); None leaves it alone.
      network_namespace: put each worker in a new network namespace with no interfaces up,
        when the OS allows it.
      read_only_filesystem: put each worker in a new mount namespace in which every mount but
        the worker's private directory is read-only, when the OS allows it.
      drop_privileges: when started as root, run workers as user and group ``sandbox_uid``, so
        file permissions and the process limit apply to them (root-only and other users' files
        and other processes' ``/proc`` files cannot be read). Directories above the interpreter
        that this user may not search are covered in the worker's mount namespace (see
        `privileges`). Workers hold no capability either way; False keeps them user 0, which
        can still read files whose owner is root.
      sandbox_uid: user and group id used by ``drop_privileges`` when ``worker_uids`` is None
        or not usable here.
      worker_uids: with ``drop_privileges``, each live worker runs as its own user and group
        from this half-open range ``(first, stop)``, claimed machine-wide (see `uids`): the
        kernel then refuses a worker's signals to another worker and its reads of another
        worker's directory, even from code below the audit hook. None, or a range not mapped
        in this user namespace (one warning), runs every worker as ``sandbox_uid``.
      python: interpreter that runs the workers; None means ``sys.executable``.
      preload_modules: standard modules imported by each worker before any call (faster first
        calls; their module state is restored between sources).
    """

    memory_bytes: int = 1 << 30
    cpu_time_s: int = 600
    max_calls_per_worker: int = 20_000
    max_open_files: int = 64
    max_file_bytes: int = 16 << 20
    max_output_bytes: int = 64 << 10
    max_result_bytes: int = 1 << 20
    max_display_chars: int = 20_000
    default_timeout_s: float = 5.0
    start_timeout_s: float = 60.0
    hash_seed: int = 0
    random_seed: int | None = 0
    network_namespace: bool = True
    read_only_filesystem: bool = True
    drop_privileges: bool = True
    sandbox_uid: int = 65534
    worker_uids: tuple[int, int] | None = (65000, 65534)
    python: str | None = None
    preload_modules: tuple[str, ...] = (
        "array",
        "bisect",
        "cmath",
        "collections",
        "copy",
        "dataclasses",
        "datetime",
        "decimal",
        "fractions",
        "functools",
        "hashlib",
        "heapq",
        "itertools",
        "json",
        "math",
        "operator",
        "random",
        "re",
        "statistics",
        "string",
        "textwrap",
        "typing",
        "unicodedata",
    )

    def __post_init__(self):
        for name in (
            "memory_bytes",
            "cpu_time_s",
            "max_calls_per_worker",
            "max_open_files",
            "max_file_bytes",
            "max_output_bytes",
            "max_result_bytes",
            "max_display_chars",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.max_open_files < 16:
            raise ValueError(
                f"SandboxConfig.max_open_files must be >= 16, got {self.max_open_files}"
            )
        if self.default_timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("SandboxConfig timeouts must be > 0")
        uids.validate(self.worker_uids)
        if not 0 <= self.hash_seed <= 4294967295:
            raise ValueError(
                f"SandboxConfig.hash_seed must be in [0, 2**32 - 1], got {self.hash_seed}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoverageRecord:
    """Lines and arcs of the function's source executed by one call (coverage.py's numbering).

    Attributes:
      lines: executed line numbers.
      arcs: executed (from_line, to_line) pairs; negative numbers mark entering or leaving a
        code object, as in coverage.py.
    """

    lines: frozenset[int]
    arcs: frozenset[tuple[int, int]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CallResult:
    """The outcome of one sandboxed call.

    Attributes:
      ok: the function returned a value.
      value: the decoded return value (None when not ok).
      error_type: exception type name when not ok (``TimeoutError``, ``MemoryError``,
        ``WorkerCrashed``, ``ResultTooLarge``, ``PermissionError`` for blocked operations, or
        the function's own exception).
      error_message: the exception message.
      timed_out: the call ran past its wall-clock limit and its worker was killed.
      stdout: what the call printed (at most ``max_output_bytes`` characters).
      stderr: what the call wrote to stderr (same limit).
      display: the text an agent sees: ``display(value)`` of the real value (dict order kept)
        or ``"ErrorType: message"``.
      encoded: canonical encoding of the return value (``values.encode``), "" when not ok.
      coverage: executed lines and arcs when coverage was measured, else None.
      wall_s: wall-clock seconds of the call as seen by the parent.
    """

    ok: bool
    value: Any = None
    error_type: str | None = None
    error_message: str | None = None
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    display: str = ""
    encoded: str = ""
    coverage: CoverageRecord | None = None
    wall_s: float = 0.0

    @classmethod
    def failure(cls, error_type: str, message: str, **kwargs: Any) -> "CallResult":
        """A failed call with its display text filled in."""
        return cls(
            ok=False,
            error_type=error_type,
            error_message=message,
            display=values.display_error(error_type, message),
            **kwargs,
        )
