"""One `Executor.call_many`: hands chunks of calls to workers and checks every reply.

Code running in a worker can write to the worker's reply pipe, so a reply proves nothing by
itself. Every call therefore carries a fresh random call id, and a chunk of calls ends with a
sync message that the worker's main loop answers only after the last call has returned. The
parent accepts exactly one reply per call, carrying that call's id, in order, then the answer to
the sync with its id and nothing after it. Anything else (a reply with another id, a second
reply, bytes after the sync answer, a malformed message) marks the worker as broken: it is
killed and replaced, the call to blame ends as ``WorkerCrashed`` (a reply already taken for it is
withdrawn), and the other unanswered calls of the chunk run again on other workers. A worker
with unread bytes when it is released or about to get new calls is replaced too, so no reply
can ever be read as the result of a later call.
"""

import collections
import math
import secrets
import time
from typing import Any

from pau_jax.sandbox import values
from pau_jax.sandbox.config import CallResult, CoverageRecord
from pau_jax.sandbox.worker_process import WorkerLost, WorkerProcess, readable

_MAX_CHUNK = 32
FORGED = "sent a reply that belongs to no call in progress (code wrote to the reply pipe)"


def new_call_id() -> str:
    """A fresh, unguessable id for one call or sync."""
    return secrets.token_hex(16)


class _Flight:
    """A chunk of calls sent to one worker."""

    def __init__(self, indices: list[int], deadline: float, start: float):
        self.indices = collections.deque(indices)  # Sent and not answered yet.
        self.ids = collections.deque(new_call_id() for _ in indices)
        self.answered: list[tuple[int, str]] = []  # Replies taken, until the sync is answered.
        self.sync_id: str | None = None
        self.deadline = deadline
        self.start = start


class Job:
    """One call_many: hands chunks of calls to held workers and collects their replies.

    Args:
      pool: the `Executor` that owns the workers.
      request: the fields shared by every call (op, key, source, entry, coverage).
      args: the encoded argument tuple of each call.
      timeout: the wall-clock limit of each call in seconds.
      origin: who wrote the source; a worker that has run another origin's source is replaced
        before it gets a call.
    """

    def __init__(
        self,
        pool: Any,
        request: dict[str, Any],
        args: list[str],
        timeout: float,
        origin: str = "task",
    ):
        self.pool = pool
        self.origin = origin
        self.request = request
        self.args = args
        self.timeout = timeout
        self.results: list[CallResult | None] = [None] * len(args)
        self.pending = collections.deque(range(len(args)))
        self.held: list[WorkerProcess] = []
        self.inflight: dict[WorkerProcess, _Flight] = {}

    def run(self) -> list[CallResult]:
        """Runs every call and returns the results in the order of ``args``."""
        self.held.append(self.pool.acquire(block=True, origin=self.origin))
        try:
            while len(self.held) < len(self.args):
                worker = self.pool.acquire(block=False, origin=self.origin)
                if worker is None:
                    break
                self.held.append(worker)
            while self.pending or self.inflight:
                self._assign()
                self._wait()
        finally:
            for worker in self.held:
                self.pool.release(worker, busy=worker in self.inflight)
        return self.results

    def _assign(self) -> None:
        config = self.pool.config
        for slot, worker in enumerate(self.held):
            if not self.pending or worker in self.inflight or not worker.ready:
                continue
            if (
                worker.has_input()
                or worker.origin not in (None, self.origin)
                or (
                    worker.calls > 0
                    and (
                        worker.calls >= config.max_calls_per_worker
                        or worker.cpu_s + self.timeout + 1.0 >= config.cpu_time_s
                    )
                )
            ):
                self.held[slot] = self.pool.replace(worker)
                continue
            size = min(_MAX_CHUNK, max(1, math.ceil(len(self.pending) / (4 * len(self.held)))))
            chunk = [self.pending.popleft() for _ in range(min(size, len(self.pending)))]
            worker.origin = self.origin
            now = time.monotonic()
            flight = self.inflight[worker] = _Flight(chunk, now + self.timeout, now)
            message = {
                **self.request,
                "ids": list(flight.ids),
                "args": [self.args[i] for i in chunk],
            }
            try:
                worker.send(message, now + self.timeout)
            except WorkerLost as exc:
                self._lose(slot, worker, "WorkerCrashed", f"the worker {exc}")

    def _wait(self) -> None:
        waiting = [w for w in self.held if w in self.inflight or not w.ready]
        now = time.monotonic()
        deadlines = [flight.deadline for flight in self.inflight.values()]
        deadlines += [w.started + self.pool.config.start_timeout_s for w in waiting if not w.ready]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        if not waiting:
            return
        for worker in readable(waiting, timeout):
            if worker.ready:
                self._receive(worker)
            else:
                self.pool.handshake(worker)
        now = time.monotonic()
        for slot, worker in enumerate(list(self.held)):
            flight = self.inflight.get(worker)
            if flight is not None and now >= flight.deadline:
                self._lose(
                    slot,
                    worker,
                    "TimeoutError",
                    f"the call ran longer than {self.timeout:g} s and was stopped",
                    timed_out=True,
                )
        self.pool.check_start_time([w for w in self.held if not w.ready])

    def _receive(self, worker: WorkerProcess) -> None:
        slot = self.held.index(worker)
        flight = self.inflight[worker]
        try:
            messages = worker.receive(self.pool.max_message)
        except WorkerLost as exc:
            self._lose(slot, worker, "WorkerCrashed", f"the worker {exc}")
            return
        for n, message in enumerate(messages):
            if flight.sync_id is not None:
                last = n == len(messages) - 1 and not worker.has_input()
                if message.get("op") == "synced" and message.get("id") == flight.sync_id and last:
                    del self.inflight[worker]
                    return
                self._lose(slot, worker, "WorkerCrashed", f"the worker {FORGED}", message.get("id"))
                return
            call_id = flight.ids[0]
            if message.get("id") != call_id:
                self._lose(slot, worker, "WorkerCrashed", f"the worker {FORGED}", message.get("id"))
                return
            try:
                result = decode_reply(
                    message, time.monotonic() - flight.start, self.request["coverage"]
                )
            except WorkerLost as exc:
                self._lose(slot, worker, "WorkerCrashed", f"the worker {exc}")
                return
            index = flight.indices.popleft()
            flight.ids.popleft()
            self.results[index] = result
            flight.answered.append((index, call_id))
            worker.calls += 1
            cpu_s = message.get("cpu_s")
            worker.cpu_s = float(cpu_s) if isinstance(cpu_s, (int, float)) else worker.cpu_s
            now = time.monotonic()
            flight.deadline, flight.start = now + self.timeout, now
            if not flight.indices:
                self._sync(slot, worker, flight)
                if worker not in self.inflight:
                    return

    def _sync(self, slot: int, worker: WorkerProcess, flight: _Flight) -> None:
        """Asks the worker to confirm that its main loop has finished the chunk."""
        flight.sync_id = new_call_id()
        try:
            worker.send({"op": "sync", "id": flight.sync_id}, flight.deadline)
        except WorkerLost as exc:
            self._lose(slot, worker, "WorkerCrashed", f"the worker {exc}")

    def _lose(
        self,
        slot: int,
        worker: WorkerProcess,
        error_type: str,
        message: str,
        reply_id: Any = None,
        **kw: Any,
    ) -> None:
        """Fails the call to blame, puts the chunk's other unanswered calls back, replaces the worker.

        The call to blame is the answered one whose id ``reply_id`` is (a second reply for it),
        else the call in progress, else (during the sync) the last one answered.
        """
        flight = self.inflight.pop(worker)
        blamed = next((i for i, call_id in flight.answered if call_id == reply_id), None)
        if blamed is None:
            blamed = flight.indices[0] if flight.indices else flight.answered[-1][0]
        self.pending.extendleft(reversed([i for i in flight.indices if i != blamed]))
        self.results[blamed] = CallResult.failure(
            error_type, message, wall_s=time.monotonic() - flight.start, **kw
        )
        self.held[slot] = self.pool.replace(worker)


def decode_reply(message: dict[str, Any], wall_s: float, coverage: bool) -> CallResult:
    """Builds a CallResult from a worker's reply, checking every field (raises WorkerLost)."""
    try:
        ok = message["ok"]
        texts = [message[k] for k in ("display", "stdout", "stderr")]
        if type(ok) is not bool or not all(isinstance(t, str) for t in texts):
            raise WorkerLost("sent a malformed result")
        record = None
        if coverage and message.get("lines") is not None:
            record = CoverageRecord(
                lines=frozenset(int(n) for n in message["lines"]),
                arcs=frozenset((int(a), int(b)) for a, b in message["arcs"]),
            )
        common = dict(
            stdout=message["stdout"],
            stderr=message["stderr"],
            display=message["display"],
            coverage=record,
            wall_s=wall_s,
        )
        if ok:
            encoded = message["value"]
            if not isinstance(encoded, str):
                raise WorkerLost("sent a malformed result")
            return CallResult(ok=True, value=values.decode(encoded), encoded=encoded, **common)
        error_type, error_message = message["error_type"], message["error_message"]
        if not isinstance(error_type, str) or not isinstance(error_message, str):
            raise WorkerLost("sent a malformed result")
        return CallResult(ok=False, error_type=error_type, error_message=error_message, **common)
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkerLost(f"sent a malformed result ({exc})") from None
