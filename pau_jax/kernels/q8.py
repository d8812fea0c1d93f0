"""Q8_0 int8 weights and their matrix products: the CPU kernel, its JAX twin, a weight-only GPU form.

Q8_0 (llama.cpp's format): along the input axis K, every block of 32 values keeps one
float32 scale ``d = max|v| / 127`` and 32 int8 values ``q = round(v / d)`` (round to nearest,
ties to even; ``q = 0`` where ``d = 0``). ``matmul`` quantises the activations the same way,
per row and block, and sums int8 products exactly in each block, then the blocks in float:

    out[m, n] = sum_b dx[m, b] * dw[n, b] * sum_i qx[m, b, i] * qw[n, b, i].

On a CPU with AVX2 and FMA it runs the C++ FFI kernel (``q8_matmul.cc``; with AVX-512 VNNI
where the CPU has it), an XLA custom call that works under ``jax.jit`` and inside loops;
elsewhere the same arithmetic in JAX (``matmul_reference``), which agrees with the kernel to
float rounding.

Threads: jaxlib 0.10.2's FFI hands CPU handlers XLA's own intra-op pool
(``ffi::ThreadPool``, the Eigen pool that runs XLA's CPU work), so the kernel splits its
output columns over that pool and the calling thread instead of starting threads of its
own: the two never oversubscribe the cores, and a pool thread busy elsewhere takes no share
(the calling thread does the rest). Products under 2**18 multiply-adds (some 10 us on one
core) stay on the calling thread, where waking a pool thread would cost about what it
saves; that threshold is an estimate, not a measurement on an idle machine.

``matmul_weight_only`` is the formulation meant for GPUs: int8 weights converted to bf16
(or any compute dtype) and scaled inside one ``einsum``, a convert XLA's GPU backend can
fuse into the matrix product (not yet measured on a GPU); on the CPU it is correct but slow.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from pau_jax.kernels import build

BLOCK = 32
# Rows quantised per numpy step in quantize_rows (bounds its temporaries to ~100 MB).
_ROWS_PER_STEP = 8192


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["qs", "scales"], meta_fields=["in_features"]
)
@dataclasses.dataclass(frozen=True, kw_only=True)
class Q8Weight:
    """A weight matrix of logical shape [K, N] in Q8_0, stored row-major along K.

    Attributes:
      qs: [N, Kp] int8, Kp = K rounded up to a multiple of 32, zero-padded.
      scales: [N, Kp / 32] float32, one per block of 32 along K.
      in_features: K, the logical input size (static metadata of the pytree).
    """

    qs: jax.Array
    scales: jax.Array
    in_features: int

    @property
    def out_features(self) -> int:
        """N, the number of outputs."""
        return self.qs.shape[0]


def padded(k: int) -> int:
    """K rounded up to a multiple of the block size."""
    return -(-k // BLOCK) * BLOCK


def _quantize_blocks_np(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 of [R, Kp] float32 rows: ([R, Kp] int8, [R, Kp / 32] float32)."""
    blocks = rows.reshape(rows.shape[0], -1, BLOCK)
    scales = np.abs(blocks).max(axis=-1) / np.float32(127)
    safe = np.where(scales > 0, scales, np.float32(1))[..., None]
    q = np.clip(np.rint(blocks / safe), -127, 127).astype(np.int8)
    return q.reshape(rows.shape), scales.astype(np.float32)


def quantize_rows(table) -> Q8Weight:
    """Quantises a table already laid out [N, K] (e.g. an embedding [V, D] used as LM head).

    Args:
      table: [N, K] array (numpy or JAX, any float dtype).

    Returns:
      The Q8Weight of ``table.T`` ([K, N]), built without a transposed copy.
    """
    if np.ndim(table) != 2:
        raise ValueError(f"quantize_rows takes a [N, K] table, got shape {np.shape(table)}")
    n, k = np.shape(table)
    kp = padded(k)
    qs = np.zeros((n, kp), np.int8)
    scales = np.zeros((n, kp // BLOCK), np.float32)
    rows = np.zeros((min(n, _ROWS_PER_STEP), kp), np.float32)
    for start in range(0, n, _ROWS_PER_STEP):
        stop = min(n, start + _ROWS_PER_STEP)
        chunk = rows[: stop - start]
        chunk[:, :k] = np.asarray(table[start:stop], dtype=np.float32)
        qs[start:stop], scales[start:stop] = _quantize_blocks_np(chunk)
    return Q8Weight(qs=jnp.asarray(qs), scales=jnp.asarray(scales), in_features=k)


def quantize(w) -> Q8Weight:
    """Quantises a weight stored as the model keeps it, [K, N] (``y = x @ w``).

    Args:
      w: [K, N] array (numpy or JAX, any float dtype).

    Returns:
      Its Q8Weight (qs [N, Kp], scales [N, Kp / 32]).
    """
    if np.ndim(w) != 2:
        raise ValueError(f"quantize takes a [K, N] weight, got shape {np.shape(w)}")
    return quantize_rows(np.asarray(w).T)


def dequantize(q: Q8Weight) -> jax.Array:
    """The float32 weight a Q8Weight stands for, [K, N]."""
    n, kp = q.qs.shape
    blocks = q.qs.reshape(n, kp // BLOCK, BLOCK).astype(jnp.float32) * q.scales[..., None]
    return blocks.reshape(n, kp)[:, : q.in_features].T


def _rows(x: jax.Array, q: Q8Weight) -> jax.Array:
    """x [..., K] as float32 [M, K], after checking K against the weight."""
    if x.shape[-1:] != (q.in_features,):
        raise ValueError(
            f"x has shape {x.shape} but the weight takes {q.in_features} input features"
        )
    return x.astype(jnp.float32).reshape(-1, q.in_features)


def quantize_activations(x: jax.Array, kp: int) -> tuple[jax.Array, jax.Array]:
    """Q8_0 of activations in JAX, zero-padded to ``kp``.

    Args:
      x: [M, K] float32.
      kp: padded length, a multiple of 32 and at least K.

    Returns:
      (qx [M, Kp / 32, 32] int8, dx [M, Kp / 32] float32).
    """
    m, k = x.shape
    blocks = jnp.pad(x, ((0, 0), (0, kp - k))).reshape(m, kp // BLOCK, BLOCK)
    dx = jnp.max(jnp.abs(blocks), axis=-1) / jnp.float32(127)
    safe = jnp.where(dx > 0, dx, jnp.float32(1))[..., None]
    qx = jnp.clip(jnp.round(blocks / safe), -127, 127).astype(jnp.int8)
    return qx, dx


def matmul_reference(x: jax.Array, q: Q8Weight) -> jax.Array:
    """The Q8_0 product in plain JAX (the fallback): the kernel's numbers to float rounding.

    Activations are quantised exactly as the kernel does; the product is then taken over
    the dequantised values, ``(qx * dx) @ (qw * dw).T``, which equals the Q8_0 sum up to the
    order and rounding of float operations. It is a correct fallback, not a fast one: on
    the CPU it takes 2 to 10 times as long as the float32 product of the same shape (XLA
    fuses the int8 convert into the product for one row only), so where the kernel is
    unavailable float32 weights decode faster.

    Args:
      x: [..., K], cast to float32.
      q: the weight, logical [K, N].

    Returns:
      [..., N] float32.
    """
    rows = _rows(x, q)
    n, kp = q.qs.shape
    qx, dx = quantize_activations(rows, kp)
    xd = (qx.astype(jnp.float32) * dx[..., None]).reshape(rows.shape[0], kp)
    blocks = q.qs.reshape(n, kp // BLOCK, BLOCK).astype(jnp.float32) * q.scales[..., None]
    out = xd @ blocks.reshape(n, kp).T
    return out.reshape(*x.shape[:-1], n)


def _kernel_call(rows: jax.Array, q: Q8Weight, max_threads: int, avx512: bool) -> jax.Array:
    """The FFI custom call on [M, K] float32 rows; returns [M, N] float32."""
    n = q.out_features
    call = jax.ffi.ffi_call(
        build.TARGET,
        jax.ShapeDtypeStruct((rows.shape[0], n), jnp.float32),
        vmap_method="sequential",
    )
    return call(rows, q.qs, q.scales, max_threads=np.int64(max_threads), avx512=np.int64(avx512))


def matmul(
    x: jax.Array,
    q: Q8Weight,
    *,
    kernel: bool | None = None,
    max_threads: int = 0,
    avx512: bool = True,
) -> jax.Array:
    """``x @ w`` for a Q8_0 weight, activations quantised per row and block of 32.

    Inference only (no gradient). Any leading shape and any K, N; the C++ kernel is fastest
    for 1 to 16 rows. Without the kernel (``kernel=False`` or unavailable) this is
    ``matmul_reference``, which is slower than a float32 product.

    Args:
      x: [..., K], cast to float32.
      q: the weight, logical [K, N].
      kernel: True: the C++ kernel (an error when it is unavailable); False: the pure-JAX
        path; None: the kernel when ``build.available()``.
      max_threads: at most this many threads of XLA's pool for the kernel; 0: all of them.
      avx512: the kernel's AVX-512 VNNI path where the CPU has it (``build.instructions()``);
        False keeps the AVX2 path (the same block sums; the float sums over blocks are
        added in another order).

    Returns:
      [..., N] float32.
    """
    if kernel is None:
        kernel = build.available()
    elif kernel and not build.available():
        raise RuntimeError(f"the Q8_0 CPU kernel is unavailable: {build.unavailable_reason()}")
    if not kernel:
        return matmul_reference(x, q)
    rows = _rows(jnp.asarray(x), q)
    n = q.out_features
    if rows.shape[0] == 0 or n == 0 or math.prod(q.qs.shape) == 0:
        return jnp.zeros((*x.shape[:-1], n), jnp.float32)
    return _kernel_call(rows, q, max_threads, avx512).reshape(*x.shape[:-1], n)


def matmul_weight_only(x: jax.Array, q: Q8Weight, compute_dtype=jnp.bfloat16) -> jax.Array:
    """``x @ w`` with int8 weights dequantised to ``compute_dtype`` inside one einsum.

    The formulation for GPUs, where XLA can fuse the int8 convert and the block scaling
    into the matrix product, so that the weights stream from memory as int8. The scaled
    weights are rounded once to ``compute_dtype``; activations are not quantised, only
    cast to ``compute_dtype``; the product accumulates in float32.

    Args:
      x: [..., K].
      q: the weight, logical [K, N].
      compute_dtype: the dtype of the dequantised weights and activations.

    Returns:
      [..., N] float32.
    """
    if x.shape[-1:] != (q.in_features,):
        raise ValueError(
            f"x has shape {x.shape} but the weight takes {q.in_features} input features"
        )
    n, kp = q.qs.shape
    blocks = q.qs.reshape(n, kp // BLOCK, BLOCK).astype(jnp.float32) * q.scales[..., None]
    w = blocks.reshape(n, kp).astype(compute_dtype)
    xp = jnp.pad(x.astype(compute_dtype), [(0, 0)] * (x.ndim - 1) + [(0, kp - x.shape[-1])])
    return jnp.einsum("...k,nk->...n", xp, w, preferred_element_type=jnp.float32)
