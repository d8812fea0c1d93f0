"""Pool of sandbox worker processes that run untrusted Python functions under limits."""

import hashlib
import json
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from pau_jax.sandbox import dispatch, uids, values, worker_process
from pau_jax.sandbox.config import DEFAULT_ENTRY, CallResult, SandboxConfig
from pau_jax.sandbox.worker_process import WorkerLost, WorkerProcess, readable


class SandboxError(RuntimeError):
    """The sandbox itself failed (a worker could not start, or the executor is closed)."""


class _Spawner:
    """Starts worker processes from one long-lived thread.

    A worker receives SIGKILL when the thread that started it ends (its parent-death signal),
    so workers are started here rather than in short-lived caller threads; they die with this
    thread, i.e. with the executor or with the parent process.
    """

    def __init__(self):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="pau-sandbox-spawner", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            make, box, done = item
            try:
                box.append(make())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller.
                box.append(exc)
            done.set()

    def run(self, make: Callable[[], WorkerProcess]) -> WorkerProcess:
        """Calls ``make`` on the spawner thread and returns (or raises) its result."""
        box: list[Any] = []
        done = threading.Event()
        self._requests.put((make, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def stop(self) -> None:
        self._requests.put(None)


def _kill_all(workers: set[WorkerProcess], spawner: _Spawner) -> None:
    for worker in list(workers):
        worker.kill()
    workers.clear()
    spawner.stop()


class Executor:
    """A pool of sandboxed worker processes; a context manager, safe to share between threads.

    Args:
      workers: number of worker processes.
      config: limits and isolation of the workers.
      entry: name of the function a call runs, unless a call names another.

    Raises:
      SandboxError: a worker could not start.
    """

    def __init__(
        self, workers: int = 2, config: SandboxConfig | None = None, *, entry: str = DEFAULT_ENTRY
    ):
        if workers < 1:
            raise ValueError(f"Executor needs at least one worker, got workers={workers}")
        self.config = config or SandboxConfig()
        self.entry = entry
        self.workers = workers
        self._settings = {f: getattr(self.config, f) for f in self.config.__dataclass_fields__}
        self._config_text = json.dumps(self._settings)
        self._uid_range = (
            uids.usable_range(self.config.worker_uids) if self.config.drop_privileges else None
        )
        self.max_message = 4 * self.config.max_result_bytes + 8 * self.config.max_output_bytes
        self.max_message += 8 * self.config.max_display_chars + (4 << 20)
        self._cond = threading.Condition()
        self._idle: list[WorkerProcess] = []
        self._all: set[WorkerProcess] = set()
        self._starting = 0  # Workers being started by `acquire` to refill a short pool.
        self._closed = False
        worker_process.remove_stale_directories()
        self._spawner = _Spawner()
        self._finalizer = weakref.finalize(self, _kill_all, self._all, self._spawner)
        started = []
        try:
            started.extend(self._spawn() for _ in range(workers))
            self._await_ready(started)
        except BaseException:
            self.close()
            raise
        self.isolation: dict[str, Any] = dict(started[0].info)
        with self._cond:
            self._idle.extend(started)

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Kills every worker and removes their directories; later calls raise SandboxError.

        Calls in flight in other threads end with SandboxError.
        """
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = self._all - set(idle)
            self._all.difference_update(idle)
            self._cond.notify_all()
        for worker in busy:
            worker.stop()  # The thread using it sees the worker die and cleans it up.
        for worker in idle:
            worker.kill()
        if not busy:
            self._finalizer()

    def call(
        self,
        source: str,
        args: Sequence[Any],
        *,
        timeout_s: float | None = None,
        entry: str | None = None,
        measure_coverage: bool = False,
        origin: str = "task",
    ) -> CallResult:
        """Runs ``entry(*args)`` from ``source`` in a worker.

        Args:
          source: Python source defining the function.
          args: the positional arguments (any values the codec encodes, except `values.Opaque`).
          timeout_s: wall-clock limit; the worker is killed and replaced when it is exceeded.
          entry: name of the function (default: the executor's ``entry``).
          measure_coverage: record the executed lines and arcs of ``source``.
          origin: who wrote ``source`` (see `call_many`).

        Returns:
          The result of the call.
        """
        return self.call_many(
            source,
            [args],
            timeout_s=timeout_s,
            entry=entry,
            measure_coverage=measure_coverage,
            origin=origin,
        )[0]

    def call_many(
        self,
        source: str,
        args_list: Sequence[Sequence[Any]],
        *,
        timeout_s: float | None = None,
        entry: str | None = None,
        measure_coverage: bool = False,
        origin: str = "task",
    ) -> list[CallResult]:
        """Runs ``entry(*args)`` for every args in ``args_list``, spread over idle workers.

        Each call has its own wall-clock limit ``timeout_s`` and its own fresh module
        namespace; the results come back in the order of ``args_list``.

        ``origin`` names who wrote ``source`` (``"task"``: the benchmark's functions;
        ``"generated"``: code a model wrote). A worker runs the sources of one origin only: one
        that has run another origin's source is replaced first, so generated code never shares
        a process (its memory, its cached sources, its directory) with a task's reference
        source, and with `SandboxConfig.worker_uids` it cannot read another worker's either.
        """
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, got {type(source).__name__}")
        timeout = self.config.default_timeout_s if timeout_s is None else float(timeout_s)
        if not timeout > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        encoded = [self._encode_args(args) for args in args_list]
        if not encoded:
            return []
        job = {
            "op": "run",
            "key": hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest(),
            "source": source,
            "entry": entry or self.entry,
            "coverage": bool(measure_coverage),
        }
        return dispatch.Job(self, job, encoded, timeout, origin=str(origin)).run()

    @staticmethod
    def _encode_args(args: Sequence[Any]) -> str:
        if isinstance(args, (str, bytes, dict)) or not isinstance(args, Sequence):
            raise TypeError(f"call arguments must be a tuple or list, got {type(args).__name__}")
        text = values.encode(tuple(args))
        if '["opaque",' in text:
            raise TypeError("opaque values (values.Opaque) cannot be passed as call arguments")
        return text

    def _spawn(self) -> WorkerProcess:
        if self._closed:
            raise SandboxError("the Executor is closed; create a new one")
        claim, text = None, self._config_text
        if self._uid_range is not None:
            try:
                claim = uids.claim(*self._uid_range)
            except (RuntimeError, OSError) as exc:
                raise SandboxError(f"cannot claim a uid for a sandbox worker: {exc}") from exc
            text = json.dumps({**self._settings, "sandbox_uid": claim.uid})
        try:
            worker = self._spawner.run(lambda: WorkerProcess(self.config, text, claim))
        except OSError as exc:
            if claim is not None:
                claim.release()
            python = self.config.python or "sys.executable"
            raise SandboxError(
                f"cannot start a sandbox worker with python={python!r}: {exc}"
            ) from exc
        with self._cond:
            if not self._closed:
                self._all.add(worker)
                return worker
        worker.kill()
        raise SandboxError("the Executor is closed; create a new one")

    def _await_ready(self, workers: list[WorkerProcess]) -> None:
        """Blocks until every worker has reported ready (raises SandboxError otherwise)."""
        waiting = list(workers)
        while waiting:
            timeout = (
                min(w.started for w in waiting) + self.config.start_timeout_s - time.monotonic()
            )
            for worker in readable(waiting, max(0.0, timeout)):
                self.handshake(worker)
            waiting = [w for w in waiting if not w.ready]
            self.check_start_time(waiting)

    def handshake(self, worker: WorkerProcess) -> None:
        """Reads from a starting worker (now readable); marks it ready once it says so."""
        try:
            messages = worker.receive(1 << 20)
        except WorkerLost as exc:
            tail = worker.log_tail()
            self._retire(worker)
            raise SandboxError(f"a sandbox worker {exc} while starting: {tail}") from None
        if not messages:
            return
        if messages[0].get("op") != "ready" or len(messages) > 1:
            self._retire(worker)
            raise SandboxError(f"a sandbox worker failed to start: {messages[0].get('error')}")
        worker.ready = True
        worker.info = messages[0].get("isolation", {})

    def check_start_time(self, starting: list[WorkerProcess]) -> None:
        """Raises SandboxError if a starting worker is past ``start_timeout_s``."""
        now = time.monotonic()
        for worker in starting:
            if now >= worker.started + self.config.start_timeout_s:
                tail = worker.log_tail()
                self._retire(worker)
                raise SandboxError(
                    f"a sandbox worker did not start within {self.config.start_timeout_s} s: {tail}"
                )

    def _retire(self, worker: WorkerProcess, replaced: bool = False) -> None:
        """Kills a worker and drops it from the pool.

        Unless a replacement is being started (``replaced``), waiting callers are woken: the
        pool is short of a worker, and the next `acquire` starts one.
        """
        with self._cond:
            self._all.discard(worker)
            if not replaced:
                self._cond.notify_all()
        worker.kill()

    def _short(self) -> None:
        """Wakes waiting callers after a replacement failed to start."""
        with self._cond:
            self._cond.notify_all()

    def replace(self, worker: WorkerProcess) -> WorkerProcess:
        """Kills ``worker`` and starts another in its place (not ready yet)."""
        self._retire(worker, replaced=True)
        try:
            return self._spawn()
        except BaseException:
            self._short()
            raise

    def acquire(self, block: bool, origin: str | None = None) -> WorkerProcess | None:
        """Takes an idle worker, waiting for one if ``block``; None if none is idle.

        Prefers a worker that last ran ``origin``'s sources, then a fresh one. When the pool
        is short of workers (one retired whose replacement failed to start, or one that did
        not start in time) and none is idle, starts one and returns it (not ready yet) rather
        than wait for a worker that will never come back; raises SandboxError if it cannot.
        """
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the Executor is closed; create a new one")
                if self._idle:
                    for wanted in (origin, None):
                        for n in range(len(self._idle) - 1, -1, -1):
                            if self._idle[n].origin == wanted:
                                return self._idle.pop(n)
                    return self._idle.pop()
                if len(self._all) + self._starting < self.workers:
                    self._starting += 1
                    break
                if not block:
                    return None
                self._cond.wait()
        try:
            return self._spawn()
        finally:
            with self._cond:
                self._starting -= 1

    def release(self, worker: WorkerProcess, busy: bool = False) -> None:
        """Returns a worker to the pool; one still running calls or with unread bytes is replaced."""
        if (busy or worker.has_input()) and not self._closed:
            self._retire(worker, replaced=True)
            try:
                worker = self._spawn()
            except SandboxError:
                self._short()
                return
        with self._cond:
            if not self._closed and worker in self._all:
                self._idle.append(worker)
                self._cond.notify()
                return
        self._retire(worker)
