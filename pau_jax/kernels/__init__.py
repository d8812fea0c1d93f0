"""Custom CPU kernels registered with XLA through ``jax.ffi``: the Q8_0 int8 matrix product."""

from pau_jax.kernels.build import available, unavailable_reason
from pau_jax.kernels.q8 import (
    Q8Weight,
    dequantize,
    matmul,
    matmul_reference,
    matmul_weight_only,
    quantize,
    quantize_rows,
)

__all__ = [
    "Q8Weight",
    "available",
    "dequantize",
    "matmul",
    "matmul_reference",
    "matmul_weight_only",
    "quantize",
    "quantize_rows",
    "unavailable_reason",
]
