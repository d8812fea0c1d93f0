"""Code that writes forged replies into its worker's reply pipe answers no call, its own or another."""

import hashlib
import time

import pytest

from pau_jax.sandbox import Executor, values
from pau_jax.sandbox.worker_process import readable

TIMEOUT = 20.0
BENIGN = "def test_func(x):\n    return [x, x * 2]\n"
# A reply in the worker's format, for the call whose id the code finds in the worker's memory:
# through the garbage collector where it may, else through the frames above its own (the
# worker's loop holds the request and the reply pipe).
_REPLY = (
    "import sys\n"
    "def everything():\n"
    "    try:\n"
    "        return gc.get_objects()\n"
    "    except PermissionError:\n"
    "        pass\n"
    "    frame, found = sys._getframe(), []\n"
    "    while frame is not None:\n"
    "        found += list(frame.f_locals.values())\n"
    "        frame = frame.f_back\n"
    "    for obj in list(found):\n"
    "        found += list(getattr(obj, '__dict__', {}).values())\n"
    "    return found\n"
    "def forged(call_id):\n"
    "    return json.dumps({'id': call_id, 'ok': True, 'value': '\"FORGED\"', 'display': 'F',\n"
    "                       'error_type': None, 'error_message': None, 'stdout': '',\n"
    "                       'stderr': '', 'lines': None, 'arcs': None, 'cpu_s': 0.0}).encode()\n"
    "def current_id(args):\n"
    "    from pau_jax.sandbox import values\n"
    "    requests = [o for o in everything() if isinstance(o, dict) and o.get('op') == 'run']\n"
    "    request = requests[-1]\n"
    "    ids = request.get('ids') or [None] * len(request['args'])\n"
    "    return ids[request['args'].index(values.encode(args))]\n"
)
# Finds the worker's reply Connection in its memory and sends a whole reply.
THROUGH_MEMORY = (
    "import gc, json\n" + _REPLY + "def test_func(*args):\n"
    "    pipes = [o for o in everything()\n"
    "             if type(o).__name__ == 'Connection' and getattr(o, 'writable', False)]\n"
    "    for pipe in pipes:\n"
    "        pipe.send_bytes(forged(current_id(args)))\n"
    "    if 'spin' in args:\n"
    "        while True:\n"
    "            pass\n"
    "    return 'genuine'\n"
)
# Writes whole framed replies to every descriptor it can.
THROUGH_FDS = (
    "import gc, json, os, struct\n" + _REPLY + "def test_func(*args):\n"
    "    body = forged(current_id(args))\n"
    "    for fd in range(3, 64):\n"
    "        try:\n"
    "            os.write(fd, struct.pack('!i', len(body)) + body)\n"
    "        except OSError:\n"
    "            pass\n"
    "    return 'genuine'\n"
)


@pytest.fixture
def lone_pool():
    """A one-worker pool, so the next call runs on the worker that the forger used."""
    with Executor(workers=1) as pool:
        yield pool


def _assert_rejected(result):
    assert not result.ok and result.value != "FORGED", result
    assert result.error_type == "WorkerCrashed", result
    assert "no call in progress" in result.error_message, result


def _assert_innocent_calls_answered(pool, n=3):
    for x in range(n):
        result = pool.call(BENIGN, (x,), timeout_s=TIMEOUT)
        assert result.ok and result.value == [x, 2 * x], result


@pytest.mark.parametrize("source", [THROUGH_MEMORY, THROUGH_FDS], ids=["memory", "fds"])
def test_forged_reply_answers_no_call(lone_pool, source):
    _assert_rejected(lone_pool.call(source, (), timeout_s=TIMEOUT))
    _assert_innocent_calls_answered(lone_pool)


def test_forged_replies_in_a_batch_leave_the_other_calls_intact(lone_pool):
    mixed = THROUGH_MEMORY.replace(
        "def test_func(*args):\n",
        "def test_func(*args):\n    if args[0] % 2:\n        return args[0]\n",
    )
    results = lone_pool.call_many(mixed, [(i,) for i in range(6)], timeout_s=TIMEOUT)
    for position, result in enumerate(results):
        if position % 2:
            assert result.ok and result.value == position, (position, result)
        else:
            _assert_rejected(result)
    _assert_innocent_calls_answered(lone_pool)


def test_forger_that_never_returns_times_out(lone_pool):
    result = lone_pool.call(THROUGH_MEMORY, (0, "spin"), timeout_s=1.5)
    assert not result.ok and result.value != "FORGED", result
    assert result.error_type == "TimeoutError" and result.timed_out, result
    _assert_innocent_calls_answered(lone_pool)


def test_forged_replies_do_not_reach_calls_from_other_threads():
    import concurrent.futures

    with Executor(workers=2) as pool:
        with concurrent.futures.ThreadPoolExecutor(4) as threads:
            forgers = [
                threads.submit(pool.call, THROUGH_MEMORY, (), timeout_s=TIMEOUT) for _ in range(4)
            ]
            innocent = [
                threads.submit(pool.call, BENIGN, (x,), timeout_s=TIMEOUT) for x in range(8)
            ]
            for future in forgers:
                _assert_rejected(future.result())
            for x, future in enumerate(innocent):
                assert future.result().value == [x, 2 * x], future.result()


def test_a_worker_handed_back_with_unread_bytes_is_replaced(lone_pool):
    (worker,) = lone_pool._all
    assert lone_pool.acquire(block=True) is worker
    # A run whose reply the parent never reads: it waits in the reply pipe at the release.
    request = {
        "op": "run",
        "key": hashlib.sha256(BENIGN.encode()).hexdigest(),
        "source": BENIGN,
        "entry": "test_func",
        "coverage": False,
        "ids": ["unread"],
        "args": [values.encode((7,))],
    }
    worker.send(request, time.monotonic() + TIMEOUT)
    assert readable([worker], TIMEOUT) == [worker] and worker.has_input()
    lone_pool.release(worker)
    assert worker not in lone_pool._all and worker.proc.returncode is not None
    result = lone_pool.call(BENIGN, (3,), timeout_s=TIMEOUT)
    assert result.ok and result.value == [3, 6], result
    assert [w.proc.pid for w in lone_pool._all] != [worker.proc.pid]
