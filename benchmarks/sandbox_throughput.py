"""Calls per second of the sandbox worker pool against forking one process per call.

The baseline is what the paper's released code does: every call runs in a new process that
executes the function's source and sends the result back. It uses multiprocessing with the
``fork`` start method from this process, which never imports JAX, so forking is safe. Both
sides run the same list of calls (a mix of small PAU-like functions) with the same
concurrency (``--workers`` pool workers; ``--workers`` threads each forking for the
baseline), once each.

Usage (from the repository root):

    python benchmarks/sandbox_throughput.py [--calls 1200] [--workers 2]

The last line is ``ratio=<pool calls/s over baseline calls/s>`` for single calls issued from
many threads (how episodes use the pool); ``call_many`` throughput is printed above it.
"""

import argparse
import concurrent.futures
import multiprocessing
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pau_jax.sandbox import Executor, values  # noqa: E402

FUNCTIONS = {
    "reverse_words": (
        "def test_func(s):\n    return ' '.join(w[::-1] for w in s.split())\n",
        lambda r: (" ".join(r.choice(["ab", "cde", "fgh", "i"]) for _ in range(r.randint(1, 6))),),
    ),
    "min_max": (
        "def test_func(xs):\n    if not xs:\n        return None\n    return (min(xs), max(xs))\n",
        lambda r: ([r.randint(-50, 50) for _ in range(r.randint(0, 8))],),
    ),
    "char_counts": (
        "from collections import Counter\n\ndef test_func(s):\n"
        "    return dict(Counter(s).most_common(3))\n",
        lambda r: ("".join(r.choice("aabbc xyz") for _ in range(r.randint(0, 12))),),
    ),
    "is_prime": (
        "def test_func(n):\n    if n < 2:\n        return False\n    i = 2\n"
        "    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n"
        "    return True\n",
        lambda r: (r.randint(-5, 5000),),
    ),
    "fib": (
        "def test_func(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
        "    return a\n",
        lambda r: (r.randint(0, 90),),
    ),
    "unique_sorted": (
        "def test_func(xs, k):\n    return sorted(set(xs), reverse=k > 0)[:abs(k) + 1]\n",
        lambda r: ([r.randint(0, 9) for _ in range(r.randint(0, 10))], r.randint(-3, 3)),
    ),
    "merge_dicts": (
        "def test_func(a, b):\n    out = dict(a)\n    for k, v in b.items():\n"
        "        out[k] = out.get(k, 0) + v\n    return out\n",
        lambda r: (
            {r.choice("abc"): r.randint(0, 5) for _ in range(r.randint(0, 3))},
            {r.choice("bcd"): r.randint(0, 5) for _ in range(r.randint(0, 3))},
        ),
    ),
    "divide": (
        "def test_func(a, b):\n    return a / b, a // b, a % b\n",
        lambda r: (r.randint(-20, 20), r.randint(-3, 3)),
    ),
}


def make_calls(n: int, seed: int = 0) -> list[tuple[str, str, tuple]]:
    """``n`` calls (name, source, args) spread over the functions, in a shuffled order."""
    rng = random.Random(seed)
    names = sorted(FUNCTIONS)
    calls = []
    for i in range(n):
        name = names[i % len(names)]
        source, make_args = FUNCTIONS[name]
        calls.append((name, source, make_args(rng)))
    rng.shuffle(calls)
    return calls


def _fork_child(source: str, args: tuple, conn) -> None:
    namespace: dict = {}
    try:
        exec(source, namespace)
        conn.send(("ok", repr(namespace["test_func"](*args))))
    except Exception as exc:  # noqa: BLE001 - the baseline reports any failure as text.
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    conn.close()


def fork_per_call(context, source: str, args: tuple, timeout_s: float) -> tuple[str, str]:
    """Runs one call in a freshly forked process (the baseline)."""
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_fork_child, args=(source, args, sender))
    process.start()
    sender.close()
    result = receiver.recv() if receiver.poll(timeout_s) else ("error", "TimeoutError")
    process.join(timeout_s)
    if process.is_alive():
        process.kill()
        process.join()
    receiver.close()
    return result


def run_baseline(calls, workers: int, timeout_s: float) -> float:
    context = multiprocessing.get_context("fork")
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda c: fork_per_call(context, c[1], c[2], timeout_s), calls))
    elapsed = time.perf_counter() - start
    assert sum(r[0] == "ok" for r in results) > len(calls) // 2, "baseline calls failed"
    return len(calls) / elapsed


def run_pool_threads(executor: Executor, calls, threads: int, timeout_s: float):
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda c: executor.call(c[1], c[2], timeout_s=timeout_s), calls))
    return len(calls) / (time.perf_counter() - start), results


def run_pool_batched(executor: Executor, calls, timeout_s: float):
    by_source: dict[str, list[int]] = {}
    for i, (_, source, _) in enumerate(calls):
        by_source.setdefault(source, []).append(i)
    results = [None] * len(calls)
    start = time.perf_counter()
    for source, indices in by_source.items():
        batch = executor.call_many(source, [calls[i][2] for i in indices], timeout_s=timeout_s)
        for i, result in zip(indices, batch):
            results[i] = result
    return len(calls) / (time.perf_counter() - start), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--timeout_s", type=float, default=5.0)
    flags = parser.parse_args()
    assert "jax" not in sys.modules, "the baseline forks, so this process must not import JAX"
    calls = make_calls(flags.calls)
    print(f"calls={len(calls)} functions={len(FUNCTIONS)} workers={flags.workers}")

    start = time.perf_counter()
    with Executor(workers=flags.workers) as executor:
        print(f"pool_start_s={time.perf_counter() - start:.3f} isolation={executor.isolation}")
        threaded, results = run_pool_threads(executor, calls, flags.threads, flags.timeout_s)
        batched, batched_results = run_pool_batched(executor, calls, flags.timeout_s)
    same = all(
        a.encoded == b.encoded and a.display == b.display for a, b in zip(results, batched_results)
    )
    ok = sum(r.ok for r in results)
    print(f"pool_ok={ok}/{len(calls)} threaded_and_batched_identical={same}")
    baseline = run_baseline(calls, flags.workers, flags.timeout_s)
    print(f"baseline_fork_per_call_calls_per_s={baseline:.1f}")
    print(f"pool_call_many_calls_per_s={batched:.1f} ratio_call_many={batched / baseline:.1f}")
    print(f"pool_threaded_calls_per_s={threaded:.1f}")
    print(f"example: {calls[0][0]}{values.display(calls[0][2])} -> {results[0].display}")
    print(f"ratio={threaded / baseline:.1f}")


if __name__ == "__main__":
    main()
