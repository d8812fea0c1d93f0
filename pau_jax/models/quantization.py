"""Quantised copies of a decoder's weights for decode steps: the seam a weight format plugs into.

A decode step at a few rows streams every weight once per token, so on a CPU its time is
the bytes read. `quantize_for_decode(model, "q8")` attaches to every `layers.Linear` (and to
the language-model head, the tied embedding table included) a `DecodeWeight`: an 8-bit copy
of its kernel that only the sampler's decode steps read. The float32 weights stay where they
are, for the prefill, the learner, LoRA and checkpoints; adapters stay a float32 side product
added on top, so a quantised base serves every training step (its weights never change).

Linears that read one input (q/k/v, gate/up: a module's ``DECODE_GROUPS``) share one copy
of their kernels side by side, read in one product (`layers.project`): SmolLM2 decodes with
121 kernel calls per token instead of 211.

Which path a product takes is decided while a program is traced: inside `decode_step()`
(entered by the sampler's jitted decode loop) a module with a `DecodeWeight` multiplies
through its format; everywhere else, and for modules without one, the float32 kernel is used.

A format is one `Format` entry in `FORMATS`: how to quantise an `[in, out]` kernel and a
`[rows, in]` table, the product, and whether it can run here. A new format is a new entry;
`Linear`'s callers do not change.
"""

import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from pau_jax.kernels import build as kernel_build
from pau_jax.kernels import q8

_log = logging.getLogger(__name__)

_IN_DECODE_STEP = contextvars.ContextVar("in_decode_step", default=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Format:
    """One quantised weight format.

    Attributes:
      quantize: kernel [K, N] float -> the format's weights (a pytree).
      quantize_rows: table [N, K] float (rows are outputs) -> the same weights.
      matmul: (x [..., K], weights) -> [..., N] float32.
      usable: () -> (True, '') where the format runs on the default backend, else
        (False, why).
    """

    quantize: Callable[[jax.Array], Any]
    quantize_rows: Callable[[jax.Array], Any]
    matmul: Callable[[jax.Array, Any], jax.Array]
    usable: Callable[[], tuple[bool, str]]


def _q8_usable() -> tuple[bool, str]:
    if jax.default_backend() != "cpu":
        return True, ""  # weight-only int8 with bfloat16 activations, fused by XLA
    return kernel_build.available(), kernel_build.unavailable_reason() or ""


def _q8_matmul(x: jax.Array, weights) -> jax.Array:
    if jax.default_backend() != "cpu":
        return q8.matmul_weight_only(x, weights).astype(jnp.float32)
    return q8.matmul(x, weights)


# Format name -> Format. 'q8': int8 weights in blocks of 32 along the input axis, one float32
# scale per block (llama.cpp's Q8_0 layout); on a CPU the `jax.ffi` kernel of
# `pau_jax.kernels.q8` (activations quantised per block inside it), elsewhere weight-only
# int8 with bfloat16 activations in plain JAX.
FORMATS: dict[str, Format] = {
    "q8": Format(
        quantize=q8.quantize,
        quantize_rows=q8.quantize_rows,
        matmul=_q8_matmul,
        usable=_q8_usable,
    ),
}
# `decode_weights` values: 'float32' (no quantised copy) and every format.
DECODE_WEIGHTS = ("float32", *FORMATS)


class DecodeWeight(nnx.Variable):
    """A quantised copy of a kernel, read by decode steps only (never trained or saved)."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Quantized:
    """A format's weights and the format's name (static)."""

    weights: Any
    format: str = dataclasses.field(metadata=dict(static=True))


@contextlib.contextmanager
def decode_step():
    """While a decode step is traced: modules with a `DecodeWeight` multiply through it."""
    token = _IN_DECODE_STEP.set(True)
    try:
        yield
    finally:
        _IN_DECODE_STEP.reset(token)


def active(weight: DecodeWeight | None) -> bool:
    """Whether a product should read `weight` (a decode step is being traced and it exists)."""
    return weight is not None and _IN_DECODE_STEP.get()


def matmul(x: jax.Array, weight: DecodeWeight) -> jax.Array:
    """x [..., K] times the quantised kernel: [..., N] float32."""
    quantized = weight.get_value()
    return FORMATS[quantized.format].matmul(x, quantized.weights)


def _linears(model: nnx.Module):
    """Every module with a `decode_weight` slot (each `layers.Linear`), with its path."""
    found = [
        (path, module)
        for path, module in nnx.iter_graph(model)
        if isinstance(module, nnx.Module) and hasattr(module, "decode_weight")
    ]
    yield from found


def _groups(model: nnx.Module):
    """(module, slot, member linears) for every entry of a module's ``DECODE_GROUPS``.

    A group's linears read one input; one quantised copy of their kernels side by side
    serves them all in one product (`layers.project`), which saves a kernel call and its
    thread hand-offs per linear at every decode step.
    """
    found = []
    for _, module in nnx.iter_graph(model):
        if isinstance(module, nnx.Module):
            for slot, names in getattr(type(module), "DECODE_GROUPS", {}).items():
                found.append((module, slot, [getattr(module, name) for name in names]))
    yield from found


def _attach(fmt: Format, name: str, kernel) -> DecodeWeight:
    return DecodeWeight(Quantized(weights=fmt.quantize(kernel), format=name))


def quantize_for_decode(model: nnx.Module, decode_weights: str, *, group: bool = True) -> int:
    """Attaches quantised copies of the model's kernels for its decode steps.

    Args:
      model: a `decoder.Decoder` (its `layers.Linear` modules and its head).
      decode_weights: 'float32' (nothing is attached; copies attached earlier are dropped)
        or a name in `FORMATS`.
      group: one copy for the linears of each ``DECODE_GROUPS`` entry (q/k/v, gate/up),
        read in one product; False: a copy per linear (the same numbers, more kernel
        calls; kept for side-by-side benchmarks).

    Returns:
      How many matrices now have a quantised copy, alone or side by side with the others
      of their module's ``DECODE_GROUPS`` entry (0 when the format cannot run here, a
      case logged once with the reason, or when the model is placed on a device mesh,
      whose sampler keeps the float32 path).
    """
    if decode_weights not in DECODE_WEIGHTS:
        raise ValueError(f"decode_weights must be one of {DECODE_WEIGHTS}, got {decode_weights!r}")
    drop_decode_weights(model)
    if decode_weights == "float32":
        return 0
    fmt = FORMATS[decode_weights]
    ok, why = fmt.usable()
    if not ok:
        _log.warning(
            "decode_weights=%r unavailable (%s); decoding with float32", decode_weights, why
        )
        return 0
    shardings = {getattr(x, "sharding", None) for x in jax.tree.leaves(nnx.state(model))}
    if any(s is not None and len(s.device_set) > 1 for s in shardings):
        _log.info("decode_weights=%r off: the model is on a device mesh", decode_weights)
        return 0
    count = 0
    grouped = set()
    for module, slot, members in _groups(model) if group else ():
        kernel = jnp.concatenate([member.kernel[...] for member in members], axis=1)
        setattr(module, slot, _attach(fmt, decode_weights, kernel))
        grouped.update(id(member) for member in members)
        count += len(members)
    for _, module in _linears(model):
        if id(module) not in grouped:
            module.decode_weight = _attach(fmt, decode_weights, module.kernel[...])
            count += 1
    head = _head_weights(model, fmt)
    if head is not None:
        model.decode_head = DecodeWeight(Quantized(weights=head, format=decode_weights))
        count += 1
    _log.info("decode_weights=%r: %d matrices quantised for decode steps", decode_weights, count)
    return count


def _head_weights(model: nnx.Module, fmt: Format):
    """The language-model head quantised: the tied [V, D] table, or the [D, V] head kernel."""
    if not hasattr(model, "decode_head"):
        return None
    if model.lm_head is None:
        return fmt.quantize_rows(model.model.embed_tokens.embedding[...])
    return fmt.quantize(model.lm_head.kernel[...])


def drop_decode_weights(model: nnx.Module) -> None:
    """Removes every quantised copy (e.g. before the base weights change: `lora.merge`)."""
    for _, module in _linears(model):
        module.decode_weight = None
    for module, slot, _ in _groups(model):
        setattr(module, slot, None)
    if hasattr(model, "decode_head"):
        model.decode_head = None


def decode_weights_of(model: nnx.Module) -> str:
    """The format the model's decode steps use ('float32' when nothing is attached)."""
    copies = [module.decode_weight for _, module in _linears(model)]
    copies += [getattr(module, slot) for module, slot, _ in _groups(model)]
    for weight in copies:
        if weight is not None:
            return weight.get_value().format
    return "float32"
