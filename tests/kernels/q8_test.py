"""The Q8_0 matrix product: the C++ kernel and the JAX paths against a NumPy reference."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pau_jax import kernels
from pau_jax.kernels import build

needs_kernel = pytest.mark.skipif(
    not kernels.available(), reason=f"Q8_0 CPU kernel unavailable: {kernels.unavailable_reason()}"
)
SHAPES = [(40, 7), (96, 1), (96, 33), (896, 130), (40, 130), (896, 7)]
ROWS = [1, 2, 3, 4, 5, 8, 13, 16, 17, 33]


def _np_quantize(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 of [R, K] float32, written independently of the module: ([R, Kp] int8, [R, Kp/32])."""
    r, k = v.shape
    kp = (k + 31) // 32 * 32
    padded = np.zeros((r, kp), np.float32)
    padded[:, :k] = v
    q = np.zeros((r, kp), np.int8)
    d = np.zeros((r, kp // 32), np.float32)
    for b in range(kp // 32):
        block = padded[:, 32 * b : 32 * b + 32]
        scale = np.max(np.abs(block), axis=1) / np.float32(127)
        d[:, b] = scale
        for i in range(r):
            if scale[i] > 0:
                # Division and round-half-to-even in float32, as the kernel does.
                q[i, 32 * b : 32 * b + 32] = np.clip(np.rint(block[i] / scale[i]), -127, 127)
    return q, d


def _np_q8_matmul(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(out [M, N] float64, magnitude [M, N]): the Q8_0 product of x [M, K] and w [K, N].

    The magnitude, sum over blocks and i of |dx dw qx qw|, bounds what float summation order
    can change (the kernel adds partial block sums in float). One step of difference in one
    quantised value moves the output by ~1e-4 of it at these sizes.
    """
    qx, dx = _np_quantize(x)
    qw, dw = _np_quantize(w.T.copy())
    m, n, nb = len(x), w.shape[1], dx.shape[1]
    qx, qw = qx.reshape(m, nb, 32).astype(np.int64), qw.reshape(n, nb, 32).astype(np.int64)
    isum = np.einsum("mbi,nbi->mnb", qx, qw)
    abs_sum = np.einsum("mbi,nbi->mnb", np.abs(qx), np.abs(qw))
    scale = dx.astype(np.float64)[:, None, :] * dw.astype(np.float64)[None, :, :]
    return (scale * isum).sum(-1), (np.abs(scale) * abs_sum).sum(-1)


def _data(k: int, n: int, m: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
    w[: min(k, 32), 0] = 0.0  # A zero block in the weights...
    x[0, 32:64] = 0.0  # ...and in the activations.
    return x, w


def _assert_q8_close(got, x, w):
    want, magnitude = _np_q8_matmul(x, w)
    np.testing.assert_array_less(
        np.abs(np.asarray(got, np.float64) - want), 1e-5 * magnitude + 1e-30
    )


@needs_kernel
@pytest.mark.parametrize("avx512", [True, False], ids=["best", "avx2"])
@pytest.mark.parametrize("k, n", SHAPES)
def test_kernel_matches_numpy(k, n, avx512):
    """Both instruction paths (AVX-512 VNNI only where the CPU has it); odd block counts too."""
    x, w = _data(k, n, max(ROWS))
    q = kernels.quantize(w)
    for m in ROWS:
        got = kernels.matmul(x[:m], q, kernel=True, avx512=avx512)
        assert got.shape == (m, n) and got.dtype == jnp.float32
        _assert_q8_close(got, x[:m], w)


@needs_kernel
def test_the_instruction_path_is_named_and_both_paths_agree():
    assert build.instructions() in ("avx512-vnni", "avx2")
    # Extreme values: full-scale int8 blocks of one sign, where qx + 128 reaches 255.
    rng = np.random.default_rng(4)
    x = np.where(rng.random((5, 224)) < 0.5, -1.0, 1.0).astype(np.float32) * 3.0
    w = np.where(rng.random((224, 9)) < 0.5, -1.0, 1.0).astype(np.float32)
    x[1], w[:, 2] = -3.0, -1.0
    q = kernels.quantize(w)
    best, avx2 = (np.asarray(kernels.matmul(x, q, avx512=a)) for a in (True, False))
    np.testing.assert_allclose(best, x @ w, rtol=1e-6)
    np.testing.assert_allclose(avx2, x @ w, rtol=1e-6)


@needs_kernel
def test_kernel_under_jit_scan_and_while_loop():
    x, w = _data(96, 33, 5, seed=1)
    q, xs = kernels.quantize(w), jnp.asarray(x)
    _assert_q8_close(jax.jit(kernels.matmul)(x, q), x, w)

    def step(carry, row):
        return carry + 1, kernels.matmul(row, q)

    _, scanned = jax.jit(lambda xs: jax.lax.scan(step, 0, xs))(x)
    _assert_q8_close(scanned, x, w)

    def body(state):
        i, out = state
        return i + 1, out.at[i].set(kernels.matmul(xs[i], q))

    _, looped = jax.jit(
        lambda: jax.lax.while_loop(lambda s: s[0] < len(x), body, (0, jnp.zeros((5, 33))))
    )()
    _assert_q8_close(looped, x, w)


@needs_kernel
def test_kernel_leading_shape_dtype_threads_and_vmap():
    x, w = _data(40, 7, 6, seed=2)
    q = kernels.quantize(w)
    got = kernels.matmul(jnp.asarray(x.reshape(2, 3, 40), jnp.bfloat16), q)
    assert got.shape == (2, 3, 7) and got.dtype == jnp.float32
    x16 = np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))
    _assert_q8_close(got.reshape(6, 7), x16, w)
    _assert_q8_close(kernels.matmul(x, q, max_threads=1), x, w)
    _assert_q8_close(jax.vmap(lambda r: kernels.matmul(r, q))(x), x, w)
    assert kernels.matmul(np.zeros((0, 40), np.float32), q).shape == (0, 7)


@needs_kernel
def test_kernel_large_product_uses_every_column():
    """Large enough to be split over the thread pool: every output column is written."""
    x, w = _data(896, 4864, 2, seed=3)
    got = np.asarray(kernels.matmul(x, kernels.quantize(w)))
    _assert_q8_close(got, x, w)


@pytest.mark.parametrize("kernel", [pytest.param(True, marks=needs_kernel), False])
def test_ties_round_to_even(kernel):
    """A block whose max is 127 has d = 1, so x / d is exact and .5 ties are real ties."""
    ties = [0.5, 1.5, 2.5, -2.5, -0.5, 3.5, 126.5, -126.5]
    x = np.zeros((1, 64), np.float32)
    x[0, 0], x[0, 1:9], x[0, 40] = 127.0, ties, 127.0
    x[0, 41:49] = ties
    # Identity columns: out[n] = dx * dw * qx[n] * 127 = qx[n] (dw = 1/127, qw = 127).
    w = np.eye(64, dtype=np.float32)[:, 1:49]
    out = np.asarray(kernels.matmul(x, kernels.quantize(w), kernel=kernel))[0]
    want = [0, 2, 2, -2, 0, 4, 126, -126]
    np.testing.assert_allclose(out[:8], want, atol=1e-5)
    np.testing.assert_allclose(out[40:48], want, atol=1e-5)


@pytest.mark.parametrize("k, n", SHAPES)
def test_fallback_matches_numpy(k, n, monkeypatch):
    monkeypatch.setattr(build, "_result", [(False, "forced off by the test")])
    assert not kernels.available()
    x, w = _data(k, n, 17)
    q = kernels.quantize(w)
    for m in (1, 5, 17):
        _assert_q8_close(kernels.matmul(x[:m], q), x[:m], w)
    _assert_q8_close(jax.jit(lambda x: kernels.matmul(x, q))(x), x, w)
    with pytest.raises(RuntimeError, match="forced off by the test"):
        kernels.matmul(x, q, kernel=True)


@pytest.mark.parametrize("k", [40, 96, 896, 5])
def test_quantize_round_trip_within_half_a_step(k):
    rng = np.random.default_rng(k)
    w = rng.standard_normal((k, 9)).astype(np.float32) * rng.uniform(0.01, 100, (1, 9))
    w[:, 3] = 0.0  # A column of zero blocks.
    q = kernels.quantize(w)
    kp = (k + 31) // 32 * 32
    assert q.qs.shape == (9, kp) and q.qs.dtype == jnp.int8
    assert q.scales.shape == (9, kp // 32) and q.in_features == k and q.out_features == 9
    np.testing.assert_array_equal(np.asarray(q.qs)[:, k:], 0)
    np.testing.assert_array_equal(np.asarray(q.qs)[3], 0)
    np.testing.assert_array_equal(np.asarray(q.scales)[3], 0)
    back = np.asarray(kernels.dequantize(q))
    assert back.shape == (k, 9)
    scales = np.repeat(np.asarray(q.scales), 32, axis=1)[:, :k].T  # [K, N], d of each entry
    assert np.all(np.abs(back - w) <= 0.5 * scales * (1 + 1e-6))
    want_q, want_d = _np_quantize(w.T.copy())
    np.testing.assert_array_equal(np.asarray(q.qs), want_q)
    np.testing.assert_array_equal(np.asarray(q.scales), want_d)


def test_quantize_rows_is_quantize_of_the_transpose():
    table = np.random.default_rng(5).standard_normal((70, 40)).astype(np.float32)
    by_rows, by_cols = kernels.quantize_rows(table), kernels.quantize(table.T)
    np.testing.assert_array_equal(np.asarray(by_rows.qs), np.asarray(by_cols.qs))
    np.testing.assert_array_equal(np.asarray(by_rows.scales), np.asarray(by_cols.scales))
    leaves, treedef = jax.tree.flatten(by_rows)
    assert len(leaves) == 2 and jax.tree.unflatten(treedef, leaves).in_features == 40


def test_one_line_errors_for_wrong_shapes():
    q = kernels.quantize(np.ones((40, 3), np.float32))
    with pytest.raises(ValueError, match="takes 40 input features"):
        kernels.matmul(np.ones((2, 41), np.float32), q)
    with pytest.raises(ValueError, match="takes 40 input features"):
        kernels.matmul_weight_only(np.ones((2, 41), np.float32), q)
    with pytest.raises(ValueError, match=r"\[K, N\]"):
        kernels.quantize(np.ones(3, np.float32))


def _relative_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per-row relative error ||got - want|| / ||want||, [M]."""
    return np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)


@pytest.mark.parametrize("k, n", [(896, 130), (40, 7), (100, 33)])
def test_weight_only_against_float_products(k, n):
    x, w = _data(k, n, 8, seed=6)
    q = kernels.quantize(w)
    dequantized = np.asarray(kernels.dequantize(q), np.float64)
    exact = np.asarray(kernels.matmul_weight_only(x, q, compute_dtype=jnp.float32))
    bound = 1e-5 * (np.abs(x) @ np.abs(dequantized))
    assert np.all(np.abs(exact - x @ dequantized) <= bound)
    got = np.asarray(jax.jit(kernels.matmul_weight_only)(x.reshape(2, 4, k), q))
    assert got.shape == (2, 4, n) and got.dtype == np.float32
    got = got.reshape(8, n)
    # Measured over 8 seeds and these shapes: bf16 rounding of the activations and of the
    # scaled weights alone gives <= 0.55% per row; with the int8 step, against the float32
    # weights, <= 1.31%.
    assert _relative_errors(got, x @ dequantized).max() < 0.01
    assert _relative_errors(got, x.astype(np.float64) @ w).max() < 0.02


def test_unavailable_reason_is_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(build, "_result", [])
    monkeypatch.setattr(build, "_cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr(build, "COMPILER", "no-such-compiler-here")
    with caplog.at_level(logging.INFO, logger=build.__name__):
        assert not build.available() and not build.available()
    assert build.unavailable_reason() == "no no-such-compiler-here on PATH"
    assert len(caplog.records) == 1 and "no-such-compiler-here" in caplog.records[0].message


@needs_kernel
def test_build_caches_by_hash_and_reuses(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compiler = build.shutil.which(build.COMPILER)
    path = build.compile_library(compiler)
    assert path.is_relative_to(tmp_path / "pau_jax" / "kernels") and path.name == "libq8.so"
    assert [p.name for p in path.parent.iterdir()] == ["libq8.so"]  # No temporary left over.
    stamp = path.stat().st_mtime_ns
    assert build.compile_library(compiler) == path and path.stat().st_mtime_ns == stamp
    monkeypatch.setattr(build, "FLAGS", (*build.FLAGS, "-DPAU_UNUSED=1"))
    assert build.library_path(compiler) != path
