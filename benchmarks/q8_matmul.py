"""Q8_0 int8 matrix products against float32 XLA on the CPU, at Qwen2.5-Coder-0.5B decode shapes.

One pass is what one decode step multiplies: per layer the MLP (896 -> 4864 gate and up,
4864 -> 896 down) and the attention projections (896 -> 896 q and o, 896 -> 128 k and v),
`--layers` layers (24), with distinct random weights per layer so that they stream from
memory as in a model, plus the LM head 896 -> 151936 (the tied embedding). For 1 and 8
rows each pass is one jitted call of:

    f32      XLA `x @ W`, W [K, N] float32
    gemv     (1 row) `pau_jax.models.layers._chunked_gemv`, the model's batch-1 path
    q8       the Q8_0 C++ kernel on XLA's thread pool (`pau_jax.kernels.matmul`)
    q8_1t    the same kernel on the calling thread only (`max_threads=1`)
    jax_ref  the Q8_0 arithmetic in plain JAX (the fallback)

timed `--repeats` times, interleaved (the variant that goes first rotates); the table shows
median milliseconds for the layers, the head and their total, the weight bytes each
variant streams per millisecond (GB/s), and q8 over f32 (and over gemv for 1 row).

The load average is printed at the start and the end; the run is marked noisy when the
1-minute load average exceeded 0.5 at the start or other processes used more than 0.5
cores on average while it ran (from /proc/stat).

Usage (from the repository root):

    python benchmarks/q8_matmul.py [--repeats 7] [--layers 24]

The last line is `q8_over_f32_b1=... q8_over_gemv_b1=... q8_over_f32_b8=... noisy=0|1`
(ratios of total pass times; below 1 is faster).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pau_jax import kernels  # noqa: E402
from pau_jax.models import layers  # noqa: E402

HIDDEN, INTERMEDIATE, KV, VOCAB = 896, 4864, 128, 151936
# (name, in, out) of one layer's projections.
LAYER_SHAPES = (
    ("gate", HIDDEN, INTERMEDIATE),
    ("up", HIDDEN, INTERMEDIATE),
    ("down", INTERMEDIATE, HIDDEN),
    ("q", HIDDEN, HIDDEN),
    ("k", HIDDEN, KV),
    ("v", HIDDEN, KV),
    ("o", HIDDEN, HIDDEN),
)
MAX_LOAD = 0.5

PRODUCTS = {
    "f32": lambda x, w: x @ w,
    "gemv": layers._chunked_gemv,
    "q8": lambda x, q: kernels.matmul(x, q, kernel=True),
    "q8_1t": lambda x, q: kernels.matmul(x, q, kernel=True, max_threads=1),
    "jax_ref": lambda x, q: kernels.matmul(x, q, kernel=False),
}


def _other_cpu_sample():
    """(busy CPU seconds of the machine, this process's CPU seconds, wall time)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    times = os.times()
    return busy, times.user + times.system, time.perf_counter()


def _weights(num_layers: int, seed: int):
    """(float32 weights, Q8 weights): per layer a dict name -> [K, N], and the head [V, D]."""
    rng = np.random.default_rng(seed)
    f32, q8 = [], []
    for _ in range(num_layers):
        layer = {n: rng.standard_normal((k, o), np.float32) * 0.03 for n, k, o in LAYER_SHAPES}
        f32.append({n: jnp.asarray(w) for n, w in layer.items()})
        q8.append({n: kernels.quantize(w) for n, w in layer.items()})
    table = rng.standard_normal((VOCAB, HIDDEN), np.float32) * 0.03
    head_q8 = kernels.quantize_rows(table)
    return (f32, jnp.asarray(table.T)), (q8, head_q8)


def _passes(product):
    """Jitted (layers pass, head pass) for one product function."""

    def layer_pass(ws, x, x_wide):
        return [product(x_wide if n == "down" else x, w[n]) for w in ws for n, _, _ in LAYER_SHAPES]

    return jax.jit(layer_pass), jax.jit(product)


def _time(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def run_rows(rows: int, weights, repeats: int) -> dict[str, tuple[float, float]]:
    """variant -> (median layers seconds, median head seconds) for `rows` rows."""
    (f32_layers, f32_head), (q8_layers, q8_head) = weights
    x = jax.random.normal(jax.random.key(rows), (rows, HIDDEN), jnp.float32)
    x_wide = jax.random.normal(jax.random.key(rows + 1), (rows, INTERMEDIATE), jnp.float32)
    names = [n for n in PRODUCTS if rows == 1 or n != "gemv"]
    calls = {}
    for name in names:
        layer_pass, head_pass = _passes(PRODUCTS[name])
        ws, head = (f32_layers, f32_head) if name in ("f32", "gemv") else (q8_layers, q8_head)
        calls[name] = (
            lambda p=layer_pass, ws=ws: _time(p, ws, x, x_wide),
            lambda p=head_pass, head=head: _time(p, x, head),
        )
        for call in calls[name]:
            call()  # Compile and warm up.
    q8_out = np.asarray(_passes(PRODUCTS["q8"])[1](x, q8_head))
    ref_out = np.asarray(_passes(PRODUCTS["jax_ref"])[1](x, q8_head))
    print(
        f"rows={rows} head: max |q8 - jax_ref| / max |jax_ref| = "
        f"{np.abs(q8_out - ref_out).max() / np.abs(ref_out).max():.2e}"
    )
    samples = {name: ([], []) for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            for part in (0, 1):
                samples[name][part].append(calls[name][part]())
    return {n: (statistics.median(s[0]), statistics.median(s[1])) for n, s in samples.items()}


def _bytes(weights, num_layers: int) -> dict[str, tuple[int, int]]:
    """'f32' / 'q8' -> (bytes of the layers' weights, bytes of the head)."""
    (f32_layers, f32_head), (q8_layers, q8_head) = weights
    size = lambda tree: sum(a.nbytes for a in jax.tree.leaves(tree))  # noqa: E731
    return {"f32": (size(f32_layers), size(f32_head)), "q8": (size(q8_layers), size(q8_head))}


def _print_table(rows: int, times: dict, sizes: dict) -> None:
    print(f"\nrows={rows}: median ms (GB/s of weights streamed)")
    print(f"{'variant':8s} {'layers':>16s} {'head':>16s} {'total':>9s}")
    for name, (t_layers, t_head) in times.items():
        kind = "f32" if name in ("f32", "gemv") else "q8"
        b_layers, b_head = sizes[kind]
        print(
            f"{name:8s} {t_layers * 1e3:8.2f} ({b_layers / t_layers / 1e9:4.1f}) "
            f"{t_head * 1e3:8.2f} ({b_head / t_head / 1e9:4.1f}) {(t_layers + t_head) * 1e3:9.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed passes of each variant")
    parser.add_argument("--layers", type=int, default=24, help="decoder layers in one pass")
    parser.add_argument("--seed", type=int, default=0)
    flags = parser.parse_args()

    load_start = os.getloadavg()
    print(f"load_average_start={load_start[0]:.2f},{load_start[1]:.2f},{load_start[2]:.2f}")
    if not kernels.available():
        sys.exit(f"the Q8_0 CPU kernel is unavailable: {kernels.unavailable_reason()}")
    print(f"cpus={os.cpu_count()} devices={jax.devices()}")
    start = time.perf_counter()
    weights = _weights(flags.layers, flags.seed)
    sizes = _bytes(weights, flags.layers)
    print(
        f"weights built and quantised in {time.perf_counter() - start:.1f}s: "
        f"f32 {sum(sizes['f32']) / 1e9:.2f} GB, q8 {sum(sizes['q8']) / 1e9:.2f} GB"
    )

    other_start = _other_cpu_sample()
    totals = {}
    for rows in (1, 8):
        times = run_rows(rows, weights, flags.repeats)
        _print_table(rows, times, sizes)
        totals[rows] = {name: sum(t) for name, t in times.items()}
    busy, own, wall = (b - a for a, b in zip(other_start, _other_cpu_sample()))
    other_cores = max(0.0, busy - own) / wall

    load_end = os.getloadavg()
    print(f"\nload_average_end={load_end[0]:.2f},{load_end[1]:.2f},{load_end[2]:.2f}")
    print(f"other_processes_cpu={other_cores:.2f} cores on average during the timing")
    noisy = int(load_start[0] > MAX_LOAD or other_cores > MAX_LOAD)
    print(
        f"q8_over_f32_b1={totals[1]['q8'] / totals[1]['f32']:.3f} "
        f"q8_over_gemv_b1={totals[1]['q8'] / totals[1]['gemv']:.3f} "
        f"q8_over_f32_b8={totals[8]['q8'] / totals[8]['f32']:.3f} noisy={noisy}"
    )


if __name__ == "__main__":
    main()
