"""Tests of the Executor: typed results, batching, threads, reproducibility, limits, life cycle."""

import concurrent.futures
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from pau_jax.sandbox import Executor, SandboxConfig, SandboxError, equality, values, worker_process

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 20.0
ECHO = "def test_func(*args):\n    return args\n"


def test_values_keep_their_types(executor):
    source = "def test_func(a, b):\n    return (a, [b], str(a), {a: b})\n"
    result = executor.call(source, (5, (1, 2)), timeout_s=TIMEOUT)
    assert result.ok, result
    assert result.value == (5, [(1, 2)], "5", {5: (1, 2)})
    assert type(result.value) is tuple and type(result.value[1][0]) is tuple
    assert result.display == "(5, [(1, 2)], '5', {5: (1, 2)})"
    assert result.encoded == values.encode(result.value)
    assert (result.error_type, result.error_message, result.timed_out) == (None, None, False)


def test_arguments_of_every_type_cross_unchanged(executor):
    args = (
        {1, 2},
        frozenset({"a"}),
        {(1, "k"): b"v", None: [1.5, float("-inf")]},
        10**40,
        complex(1, -2),
        bytearray(b"z"),
        -0.0,
        "\u96ea",
        True,
    )
    result = executor.call(ECHO, args, timeout_s=TIMEOUT)
    assert result.ok, result
    assert equality.typed_equal(result.value, args, float_rtol=0.0)
    assert result.encoded == values.encode(args)


def test_exceptions_are_typed_and_displayed(executor):
    source = "def test_func(x):\n    return x + 1\n"
    result = executor.call(source, ("a",), timeout_s=TIMEOUT)
    assert not result.ok and result.value is None
    assert result.error_type == "TypeError"
    assert result.error_message == 'can only concatenate str (not "int") to str'
    assert result.display == 'TypeError: can only concatenate str (not "int") to str'
    missing = executor.call("def test_func(d):\n    return d['k']\n", ({},), timeout_s=TIMEOUT)
    assert missing.display == "KeyError: 'k'"


def test_syntax_error_and_missing_entry(executor):
    bad = executor.call("def test_func(:\n    pass\n", (), timeout_s=TIMEOUT)
    assert bad.error_type == "SyntaxError" and "line 1" in bad.error_message
    missing = executor.call("def other():\n    return 1\n", (), timeout_s=TIMEOUT)
    assert missing.error_type == "NameError" and "test_func" in missing.error_message
    named = executor.call("def other():\n    return 1\n", (), timeout_s=TIMEOUT, entry="other")
    assert named.ok and named.value == 1


def test_stdout_and_stderr_are_captured_and_capped(executor):
    source = (
        "import sys\n"
        "def test_func(n):\n"
        "    print('hello', n)\n"
        "    print('x' * n, file=sys.stderr)\n"
        "    return n\n"
    )
    small = executor.call(source, (3,), timeout_s=TIMEOUT)
    assert small.stdout == "hello 3\n" and small.stderr == "xxx\n"
    big = executor.call(source, (100_000,), timeout_s=TIMEOUT)
    assert big.ok and big.stderr.startswith("x" * 4096)
    assert "more characters dropped" in big.stderr and len(big.stderr) < 4200


def test_call_many_keeps_order_and_fresh_state(executor):
    source = (
        "calls = []\n"
        "def test_func(x, acc=[]):\n"
        "    acc.append(x)\n"
        "    calls.append(x)\n"
        "    return (x * x, len(acc), len(calls))\n"
    )
    results = executor.call_many(source, [(i,) for i in range(200)], timeout_s=TIMEOUT)
    assert [r.value for r in results] == [(i * i, 1, 1) for i in range(200)]
    assert executor.call_many(source, [], timeout_s=TIMEOUT) == []


def test_calls_from_many_threads(executor):
    sources = [f"def test_func(x):\n    return (x, {k})\n" for k in range(4)]

    def run(i):
        return executor.call(sources[i % 4], (i,), timeout_s=TIMEOUT).value

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(run, range(160)))
    assert got == [(i, i % 4) for i in range(160)]


def test_calls_are_spread_over_workers(executor):
    source = "import os, time\ndef test_func(x):\n    time.sleep(0.05)\n    return os.getpid()\n"
    pids = {
        r.value for r in executor.call_many(source, [(i,) for i in range(16)], timeout_s=TIMEOUT)
    }
    assert len(pids) == executor.workers == 2
    assert os.getpid() not in pids


def test_same_calls_give_identical_encodings_across_fresh_pools():
    words = ["apple", "pear", "fig", "kiwi", "plum", "lime", "date", "sloe", "yuzu"]
    source = (
        "import random\n"
        "def test_func(words):\n"
        "    return (list(set(words)), {w: len(w) for w in set(words)}, random.random())\n"
    )
    inputs = [(words,), (words[:4],)]
    runs = []
    for _ in range(2):
        with Executor(workers=1) as pool:
            runs.append([r.encoded for r in pool.call_many(source, inputs, timeout_s=TIMEOUT)])
    assert runs[0] == runs[1]
    expected = subprocess.run(
        [sys.executable, "-c", f"print(list(set({words!r})))"],
        env={"PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert values.display(values.decode(runs[0][0])[0]) == expected


def test_hash_seed_is_configurable():
    words = [f"w{i}" for i in range(12)]
    orders = {}
    for seed in (0, 1):
        with Executor(workers=1, config=SandboxConfig(hash_seed=seed)) as pool:
            result = pool.call(
                "def test_func(w):\n    return list(set(w))\n", (words,), timeout_s=TIMEOUT
            )
        reference = subprocess.run(
            [sys.executable, "-c", f"print(list(set({words!r})))"],
            env={"PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert result.display == reference
        orders[seed] = result.display
    assert orders[0] != orders[1]


def test_modules_imported_after_confinement_work(executor):
    """Modules not preloaded are imported after the user switch and the capability drop."""
    source = (
        "import csv, email.mime.text, inspect, io, sqlite3, tempfile, zoneinfo\n"
        "import datetime, xml.etree.ElementTree as ET\n"
        "def test_func():\n"
        "    db = sqlite3.connect(':memory:')\n"
        "    db.execute('create table t (x)')\n"
        "    db.execute('insert into t values (3)')\n"
        "    handle, path = tempfile.mkstemp(dir='.')\n"
        "    with open(handle, 'w') as f:\n"
        "        f.write('a,b')\n"
        "    paris = zoneinfo.ZoneInfo('Europe/Paris')\n"
        "    return (\n"
        "        ET.fromstring('<a>1</a>').text,\n"
        "        db.execute('select x from t').fetchone(),\n"
        "        next(csv.reader(open(path))),\n"
        "        str(datetime.datetime(2020, 1, 1, tzinfo=paris).utcoffset()),\n"
        "        email.mime.text.MIMEText('x').get_content_type(),\n"
        "        inspect.isfunction(test_func),\n"
        "    )\n"
    )
    result = executor.call(source, (), timeout_s=TIMEOUT)
    assert result.ok, result
    assert result.value == ("1", (3,), ["a", "b"], "1:00:00", "text/plain", True)


def test_dict_display_keeps_insertion_order(executor):
    result = executor.call("def test_func():\n    return {'b': 1, 'a': 2}\n", (), timeout_s=TIMEOUT)
    assert result.display == "{'b': 1, 'a': 2}"
    assert result.encoded == values.encode({"a": 2, "b": 1})


def test_result_too_large(executor):
    result = executor.call("def test_func():\n    return 'x' * (2 << 20)\n", (), timeout_s=TIMEOUT)
    assert result.error_type == "ResultTooLarge"
    many = executor.call("def test_func():\n    return list(range(10**6))\n", (), timeout_s=TIMEOUT)
    assert many.error_type == "ResultTooLarge"


def test_invalid_arguments_are_rejected_in_the_parent(executor):
    with pytest.raises(TypeError, match="tuple or list"):
        executor.call(ECHO, "abc")
    with pytest.raises(TypeError, match="opaque"):
        executor.call(ECHO, (values.Opaque("T", "<T>"),))
    with pytest.raises(ValueError, match="timeout_s"):
        executor.call(ECHO, (), timeout_s=0)


def test_workers_are_recycled_after_max_calls():
    config = SandboxConfig(max_calls_per_worker=3)
    with Executor(workers=1, config=config) as pool:
        pids = [
            pool.call(
                "import os\ndef test_func():\n    return os.getpid()\n", (), timeout_s=TIMEOUT
            ).value
            for _ in range(7)
        ]
    assert len(set(pids)) == 3


def test_close_kills_workers_and_removes_directories():
    pool = Executor(workers=2)
    source = "import os\ndef test_func():\n    return (os.getpid(), os.getcwd())\n"
    found = {pool.call(source, (), timeout_s=TIMEOUT).value for _ in range(6)}
    pool.close()
    for pid, cwd in found:
        assert not os.path.exists(os.path.dirname(cwd))
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(SandboxError, match="closed"):
        pool.call(source, ())


def test_the_sandbox_never_imports_jax(executor):
    code = (
        "import sys; sys.path.insert(0, '.'); import pau_jax.sandbox; print('jax' in sys.modules)"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )
    result = executor.call(
        "import sys\ndef test_func():\n    return 'jax' in sys.modules\n", (), timeout_s=TIMEOUT
    )
    assert result.value is False


def test_start_up_failures_are_clear():
    with pytest.raises(
        SandboxError, match="cannot start a sandbox worker with python='/nonexistent/python'"
    ):
        Executor(workers=1, config=SandboxConfig(python="/nonexistent/python"))
    with pytest.raises(SandboxError, match="no_such_module"):
        Executor(workers=1, config=SandboxConfig(preload_modules=("no_such_module",)))
    with pytest.raises(ValueError, match="at least one worker"):
        Executor(workers=0)
    with pytest.raises(ValueError, match="memory_bytes"):
        SandboxConfig(memory_bytes=0)


def test_close_during_a_call_ends_it_with_sandbox_error():
    pool = Executor(workers=1)
    loop = "def test_func():\n    while True:\n        pass\n"
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        future = threads.submit(pool.call, loop, (), timeout_s=60.0)
        time.sleep(0.5)
        start = time.monotonic()
        pool.close()
        with pytest.raises(SandboxError, match="closed"):
            future.result(timeout=30)
        assert time.monotonic() - start < 10


def test_parent_that_imported_jax_never_forks():
    code = (
        "import sys; sys.path.insert(0, '.')\n"
        "import jax, jax.numpy as jnp\n"
        "jnp.ones(3).block_until_ready()\n"
        "def refuse_fork(event, args):\n"
        "    if event in ('os.fork', 'os.forkpty'):\n"
        "        raise RuntimeError('forked')\n"
        "sys.addaudithook(refuse_fork)\n"
        "from pau_jax.sandbox import Executor\n"
        "with Executor(workers=1) as pool:\n"
        "    print(pool.call('def test_func(x):\\n    return x + 1\\n', (41,), timeout_s=30).value)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "42"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def _children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def test_workers_die_with_their_parent():
    code = (
        "import sys, threading, time; sys.path.insert(0, '.')\n"
        "from pau_jax.sandbox import Executor\n"
        "pool = Executor(workers=2)\n"
        "loop = 'def test_func():\\n    while True:\\n        pass\\n'\n"
        "threading.Thread(target=pool.call, args=(loop, ()), kwargs={'timeout_s': 100}).start()\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline().strip() == "started"
        time.sleep(1.0)
        workers = _children(parent.pid)
        assert len(workers) == 2 and all(_alive(p) for p in workers)
        roots = {os.path.dirname(os.readlink(f"/proc/{p}/cwd")) for p in workers}
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers)
    worker_process.remove_stale_directories()  # (Another executor starting may have done it.)
    assert not any(os.path.exists(root) for root in roots)


def test_stale_directories_of_dead_parents_are_removed():
    dead_pid = 99_999_999  # Above any pid_max, so no process has it.
    prefix = worker_process._owner_prefix()
    stale = tempfile.mkdtemp(prefix=f"{prefix}{dead_pid}_")
    os.makedirs(os.path.join(stale, "work", "sub"))
    live = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}_")
    try:
        worker_process.remove_stale_directories()
        assert not os.path.exists(stale)
        assert os.path.isdir(live)
    finally:
        shutil.rmtree(live, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)
