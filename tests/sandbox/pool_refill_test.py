"""A pool that loses a worker without a replacement starts one again instead of waiting forever."""

import threading
import time

import pytest

from pau_jax.sandbox import Executor, SandboxError

BENIGN = "def test_func(x):\n    return x + 1\n"
LOOP = "def test_func(x):\n    while True:\n        pass\n"
PATIENCE_S = 60.0  # Far above a worker's start; a pool that waits forever fails here.


def _start(fn, *args, **kwargs):
    """Runs fn in a daemon thread; returns a function that waits for its result or raises."""
    box = []

    def run():
        try:
            box.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test.
            box.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result():
        thread.join(PATIENCE_S)
        assert not thread.is_alive(), f"still waiting after {PATIENCE_S} s (the pool starved)"
        ok, value = box[0]
        if not ok:
            raise value
        return value

    return result


def test_a_worker_retired_without_replacement_is_started_again():
    with Executor(workers=1) as pool:
        lost = pool.acquire(block=True)
        pool._retire(lost)  # As when a worker fails to start in time: gone, nothing in its place.
        assert _start(pool.call, BENIGN, (1,), timeout_s=20.0)().value == 2


def test_a_replacement_that_cannot_start_fails_its_call_and_not_the_waiting_ones(monkeypatch):
    with Executor(workers=1) as pool:
        spawn, failures = pool._spawn, []

        def spawn_failing_once():
            if not failures:
                failures.append(time.monotonic())
                raise SandboxError("cannot start a sandbox worker (simulated)")
            return spawn()

        monkeypatch.setattr(pool, "_spawn", spawn_failing_once)
        looping = _start(pool.call, LOOP, (0,), timeout_s=1.0)
        time.sleep(0.3)  # The loop holds the only worker; the next call waits for it.
        waiting = _start(pool.call, BENIGN, (2,), timeout_s=20.0)
        with pytest.raises(SandboxError, match="simulated"):
            looping()
        assert waiting().value == 3
        assert failures and pool.call(BENIGN, (3,)).value == 4
        assert len(pool._all) == 1  # Refilled to its size, not beyond.
