"""Decoder building blocks shared by every model family: linear, RMSNorm, RoPE, attention, MLP.

Every parameter carries logical axis names (``out_sharding`` metadata) drawn from
``embed`` (D), ``heads`` (N*H), ``kv_heads`` (K*H), ``head_dim`` (H), ``mlp`` (F)
and ``vocab`` (V). Linear kernels are stored ``[in, out]``, so ``q_proj`` is
``[D, N*H]`` with axes ``("embed", "heads")`` and ``o_proj`` is ``[N*H, D]``
with ``("heads", "embed")``; the merged ``N*H`` dimension is named after its
head axis. ``sharding.py`` maps these names to mesh axes. Activations are
constrained (``sharding.constrain``) at block boundaries, after the attention
heads and inside the MLP; without a mesh context these are no-ops.

A linear bias ``[out]`` carries the out axis of its kernel (``("heads",)`` for
``q_proj``). The modules read their sizes from a ``decoder_config.DecoderConfig``
(``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``rms_norm_eps``) and the attention variant from its
``qk_norm`` and ``qkv_bias``, and their rotary frequencies from its
``rope_frequencies()``, so every family reuses them.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pau_jax.models import quantization, sharding

Axes = tuple[str | None, ...]
KV = tuple[jax.Array, jax.Array]

INIT_STDDEV = 0.02

# Logical axes of the [B, T, D] hidden states between blocks.
ACTIVATION_AXES = ("batch", "length", "act_embed")


def partitioned(initializer, axes: Axes):
    """Wraps an initializer so the created parameter carries logical axis names.

    Eager sharding is off: parameters are placed explicitly by the loader or by
    the caller, never at creation time.
    """
    return nnx.with_partitioning(initializer, axes, eager_sharding=False)


# A one-row product x @ W ([1, in] x [in, out], a decode step at batch 1) is computed as
# GEMV_CHUNKS products over contiguous row blocks of W, summed. XLA's CPU backend runs the
# single matrix-vector product on one stream; the batched one reads W about 20% faster
# (Qwen3-0.6B's layers, 2 cores: 62 ms instead of 77 ms).
GEMV_CHUNKS = 8


def _single_row_unsharded(x: jax.Array) -> bool:
    """Whether ``x`` [..., in] holds one row and no device mesh is set."""
    rows = int(np.prod(x.shape[:-1]))
    mesh = jax.sharding.get_abstract_mesh()
    return rows == 1 and (mesh.empty or mesh.size == 1)


def _chunked_gemv(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x @ kernel`` for one row as a sum of GEMV_CHUNKS partial products.

    Args:
      x: [..., in] with one row.
      kernel: [in, out].

    Returns:
      [..., out].
    """
    d_in, d_out = kernel.shape
    parts = x.reshape(GEMV_CHUNKS, 1, d_in // GEMV_CHUNKS)
    blocks = kernel.reshape(GEMV_CHUNKS, d_in // GEMV_CHUNKS, d_out)
    y = jnp.einsum("nrc,nco->nro", parts, blocks).sum(axis=0)
    return y.reshape(*x.shape[:-1], d_out)


class Linear(nnx.Linear):
    """``nnx.Linear`` ([in, out] kernel, optional [out] bias) whose output can carry a LoRA update.

    ``lora`` is ``None`` or a module mapping ``x`` [..., in] to an additive
    update [..., out] (set by ``lora.apply_lora``). The bias starts at zero.
    ``decode_weight`` is ``None`` or a quantised copy of the kernel
    (``quantization.quantize_for_decode``), read instead of it while a decode step
    is traced (``quantization.decode_step``).
    """

    lora: Any = nnx.data(None)
    decode_weight: Any = nnx.data(None)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        axes: Axes,
        dtype,
        rngs: nnx.Rngs,
        use_bias: bool = False,
    ):
        super().__init__(
            in_features,
            out_features,
            use_bias=use_bias,
            dtype=dtype,
            param_dtype=dtype,
            kernel_init=partitioned(nnx.initializers.normal(INIT_STDDEV), axes),
            bias_init=partitioned(nnx.initializers.zeros_init(), axes[-1:]),
            rngs=rngs,
        )
        self.lora = None
        self.decode_weight = None

    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps [..., in] to [..., out] in the parameter dtype."""
        if quantization.active(self.decode_weight):
            return self.finish(quantization.matmul(x, self.decode_weight), x)
        if _single_row_unsharded(x) and self.in_features % GEMV_CHUNKS == 0:
            y = _chunked_gemv(x.astype(self.dtype), self.kernel[...].astype(self.dtype))
            return self.finish(y, x)
        y = super().__call__(x)
        if self.lora is not None:
            y = y + self.lora(x).astype(y.dtype)
        return y

    def finish(self, y: jax.Array, x: jax.Array) -> jax.Array:
        """``y = x @ kernel`` computed elsewhere, plus the bias and the LoRA update of ``x``."""
        y = y.astype(self.dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        if self.lora is not None:
            y = y + self.lora(x).astype(y.dtype)
        return y


def project(x: jax.Array, linears: tuple[Linear, ...], fused) -> list[jax.Array]:
    """Each of ``linears`` applied to the same ``x``; one product where a decode step reads ``fused``.

    ``fused`` is None or the quantised copy of the linears' kernels side by side
    (``quantization.quantize_for_decode`` fills a module's ``DECODE_GROUPS`` slots): inside
    a decode step the outputs then come from one product split by output size, each with
    its own bias and LoRA update; everywhere else each linear runs as usual.
    """
    if not quantization.active(fused):
        return [linear(x) for linear in linears]
    y = quantization.matmul(x, fused)
    bounds = np.cumsum([linear.out_features for linear in linears])[:-1].tolist()
    return [linear.finish(part, x) for linear, part in zip(linears, jnp.split(y, bounds, -1))]


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis, computed in float32 as ``w * x / rms(x)``."""

    def __init__(self, size: int, *, eps: float, axis_name: str, dtype):
        self.weight = nnx.Param(
            jnp.ones((size,), dtype), out_sharding=(axis_name,), eager_sharding=False
        )
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalises [..., size]; returns the input dtype."""
        x32 = x.astype(jnp.float32)
        # The sum of squares as a matrix-vector product: as a reduction (or a contraction of
        # x with itself, which XLA turns into one) XLA's CPU backend fuses it into the
        # elementwise consumer and recomputes it for every element of the row (H times).
        squares = (x32 * x32) @ jnp.ones((x.shape[-1], 1), jnp.float32)
        inv_rms = jax.lax.rsqrt(squares / x.shape[-1] + self.eps)
        return (self.weight[...].astype(jnp.float32) * (x32 * inv_rms)).astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """Rotary inverse frequencies ``theta ** (-2i / H)``, [H / 2] float32."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def llama3_scaled_inv_freq(
    inv_freq: np.ndarray,
    *,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> np.ndarray:
    """Llama 3 RoPE frequency scaling of [H / 2] inverse frequencies (float32).

    Wavelengths longer than ``original / low_freq_factor`` are divided by
    ``factor``, those shorter than ``original / high_freq_factor`` are kept, and
    the band in between interpolates smoothly between the two.
    """
    inv_freq = np.asarray(inv_freq, np.float32)
    old_len = np.float32(original_max_position_embeddings)
    low_wavelen = old_len / np.float32(low_freq_factor)
    high_wavelen = old_len / np.float32(high_freq_factor)
    wavelen = np.float32(2 * np.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / np.float32(factor), inv_freq)
    smooth = (old_len / wavelen - np.float32(low_freq_factor)) / np.float32(
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate-half rotary embedding.

    Args:
      x: [B, T, N, H] queries or keys.
      positions: [B, T] integer positions.
      inv_freq: [H / 2] inverse frequencies.

    Returns:
      [B, T, N, H] in the dtype of ``x`` (computed in float32).
    """
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, H/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    *,
    cache: KV | None = None,
    cache_mask: jax.Array | None = None,
) -> jax.Array:
    """Grouped-query dot-product attention with an explicit mask and a float32 softmax.

    Query head ``n`` uses key/value head ``n // (N / K)``; queries are reshaped to
    [B, T, K, N/K, H] instead of repeating keys and values. Keys and values are in the
    cache layout (``kv_cache.KVCache``), so every dot batches over the leading (B, K)
    and contracts over the minor axis of the keys (H) or of the values (S or T).

    With a cache, the new tokens attend to the cached slots in ``cache_mask`` and to
    each other (``mask``) under one softmax. The cache is read as it was before the new
    tokens are written into it, so the caller's in-place update of the cache is its only
    other use (XLA then neither copies nor duplicates it).

    Args:
      q: [B, T, N, H] queries of the new tokens.
      k: [B, K, T, H] keys of the new tokens.
      v: [B, K, H, T] values of the new tokens, transposed.
      mask: [B, T, T] bool, True where new token t may attend to new token u.
      cache: optional (keys [B, K, S, H], values [B, K, H, S]) of earlier tokens.
      cache_mask: [B, S] bool, the cached slots every new token may attend to.

    Returns:
      [B, T, N, H] in the dtype of ``v``. Rows with no True entry in ``mask`` or
      ``cache_mask`` produce finite values that callers must ignore.
    """
    b, t, n, h = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(b, t, kv_heads, n // kv_heads, h)
    lowest = jnp.finfo(jnp.float32).min

    def scores(keys, allowed, layout="bkgts"):
        dot = jnp.einsum(f"btkgh,bksh->{layout}", q, keys, preferred_element_type=jnp.float32)
        return jnp.where(allowed, dot * (h**-0.5), lowest)

    logits = scores(k, mask[:, None, None, :, :])
    if cache is None:
        probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgts,bkhs->btkgh", probs, v)
        return out.reshape(b, t, n, h)
    # One softmax over the cached slots and the new tokens, in two parts: the shifted
    # exponentials of each part meet their own values and the sum normalises the result,
    # so neither the scores nor the weights are concatenated or sliced. With several new
    # tokens the cached part stays slot-major, [B, K, S, G, T], the layout of the dot that
    # reads the keys in place, so the S x T scores are never transposed; a single new token
    # (a decode step) has few scores, and slots last lets the exponentials vectorise.
    keys, values = cache[0].astype(q.dtype), cache[1].astype(v.dtype)
    slots = "bkgts" if t == 1 else "bksgt"
    slot_axis = slots.index("s")
    allowed = cache_mask[:, None, None, None, :] if t == 1 else cache_mask[:, None, :, None, None]
    cached = scores(keys, allowed, slots)
    top = jnp.maximum(cached.max(axis=slot_axis), logits.max(axis=-1))  # [B, K, G, T]
    weights_cached = jnp.exp(cached - jnp.expand_dims(top, slot_axis))
    weights_new = jnp.exp(logits - top[..., None])
    total = weights_cached.sum(axis=slot_axis) + weights_new.sum(axis=-1)  # [B, K, G, T]
    f32 = jnp.float32
    out = jnp.einsum(
        "bkgts,bkhs->btkgh", weights_new.astype(v.dtype), v, preferred_element_type=f32
    ) + jnp.einsum(
        f"{slots},bkhs->btkgh", weights_cached.astype(v.dtype), values, preferred_element_type=f32
    )
    out = out / total.transpose(0, 3, 1, 2)[..., None]
    return out.astype(v.dtype).reshape(b, t, n, h)


class Attention(nnx.Module):
    """GQA self-attention; optional q/k/v biases, q/k RMSNorm (before RoPE) and KV cache.

    ``decode_qkv`` is None or one quantised copy of the q, k and v kernels side by side,
    read by decode steps (one product instead of three).
    """

    # Slot -> the linears whose kernels one quantised copy holds (`project`).
    DECODE_GROUPS = {"decode_qkv": ("q_proj", "k_proj", "v_proj")}
    decode_qkv: Any = nnx.data(None)

    def __init__(self, config, *, dtype, rngs: nnx.Rngs):
        d, h = config.hidden_size, config.head_dim
        n, k = config.num_attention_heads, config.num_key_value_heads
        self.num_heads, self.num_kv_heads, self.head_dim = n, k, h
        # Static (hashable) so the graph definition stays comparable; exact float32 round trip.
        self.inv_freq = tuple(float(f) for f in config.rope_frequencies())
        qkv = dict(dtype=dtype, rngs=rngs, use_bias=config.qkv_bias)
        self.q_proj = Linear(d, n * h, axes=("embed", "heads"), **qkv)
        self.k_proj = Linear(d, k * h, axes=("embed", "kv_heads"), **qkv)
        self.v_proj = Linear(d, k * h, axes=("embed", "kv_heads"), **qkv)
        self.o_proj = Linear(n * h, d, axes=("heads", "embed"), dtype=dtype, rngs=rngs)
        self.decode_qkv = None
        if config.qk_norm:
            eps = config.rms_norm_eps
            self.q_norm = RMSNorm(h, eps=eps, axis_name="head_dim", dtype=dtype)
            self.k_norm = RMSNorm(h, eps=eps, axis_name="head_dim", dtype=dtype)
        else:
            self.q_norm = None
            self.k_norm = None

    def __call__(
        self,
        x: jax.Array,
        *,
        positions: jax.Array,
        mask: jax.Array,
        cache: KV | None = None,
        cache_index: jax.Array | int | None = None,
        cache_mask: jax.Array | None = None,
        write_mask: jax.Array | None = None,
    ) -> tuple[jax.Array, KV | None]:
        """Attends T new tokens to themselves and to cached ones, and writes them into the cache.

        Args:
          x: [B, T, D] inputs.
          positions: [B, T] RoPE positions.
          mask: [B, T, T] bool, which new tokens each new token attends to.
          cache: optional (keys [B, K, S, H], values [B, K, H, S]).
          cache_index: slot of the first new token in the cache (may be traced).
          cache_mask: [B, S] bool, the cached slots the new tokens attend to (all of them
            precede the new tokens); None attends to no cached slot (an empty cache).
          write_mask: [B, T] bool, which new tokens are written into their slots; the
            others keep what the cache holds there (``Decoder.decode(overlay=True)``).
            None writes all T.

        Returns:
          ([B, T, D] output, updated (keys, values) or None).
        """
        b, t, _ = x.shape
        q, k, v = project(x, (self.q_proj, self.k_proj, self.v_proj), self.decode_qkv)
        q = q.reshape(b, t, self.num_heads, self.head_dim)
        k = k.reshape(b, t, self.num_kv_heads, self.head_dim)
        v = v.reshape(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        inv_freq = np.asarray(self.inv_freq, np.float32)
        q = apply_rope(q, positions, inv_freq)
        k = apply_rope(k, positions, inv_freq)
        # The cache layout: keys [B, K, T, H], values [B, K, H, T].
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 3, 1)
        earlier = None if cache is None or cache_mask is None else cache
        out = attend(q, k, v.astype(q.dtype), mask, cache=earlier, cache_mask=cache_mask)
        new_cache = None
        if cache is not None:
            keys, values = cache
            k, v = k.astype(keys.dtype), v.astype(values.dtype)
            key_at, value_at = (0, 0, cache_index, 0), (0, 0, 0, cache_index)
            if write_mask is not None:
                old_k = jax.lax.dynamic_slice(keys, key_at, k.shape)
                old_v = jax.lax.dynamic_slice(values, value_at, v.shape)
                k = jnp.where(write_mask[:, None, :, None], k, old_k)
                v = jnp.where(write_mask[:, None, None, :], v, old_v)
            new_cache = (
                jax.lax.dynamic_update_slice(keys, k, key_at),
                jax.lax.dynamic_update_slice(values, v, value_at),
            )
        out = sharding.constrain(
            out.reshape(b, t, self.num_heads * self.head_dim), ("batch", "length", "act_heads")
        )
        return self.o_proj(out), new_cache


class MLP(nnx.Module):
    """SwiGLU feed-forward block: ``down(silu(gate(x)) * up(x))``.

    ``decode_gate_up`` is None or one quantised copy of the gate and up kernels side by
    side, read by decode steps (one product instead of two).
    """

    DECODE_GROUPS = {"decode_gate_up": ("gate_proj", "up_proj")}
    decode_gate_up: Any = nnx.data(None)

    def __init__(self, config, *, dtype, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(d, f, axes=("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.up_proj = Linear(d, f, axes=("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.down_proj = Linear(f, d, axes=("mlp", "embed"), dtype=dtype, rngs=rngs)
        self.decode_gate_up = None

    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps [B, T, D] to [B, T, D]."""
        gate, up = project(x, (self.gate_proj, self.up_proj), self.decode_gate_up)
        hidden = jax.nn.silu(gate) * up
        return self.down_proj(sharding.constrain(hidden, ("batch", "length", "act_mlp")))


class DecoderLayer(nnx.Module):
    """Pre-norm transformer block: attention and MLP, each with a residual connection."""

    def __init__(self, config, *, dtype, rngs: nnx.Rngs, mlp_class=None):
        """``mlp_class`` (default ``MLP``) builds the feed-forward block from (config, dtype, rngs)."""
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps=eps, axis_name="embed", dtype=dtype)
        self.self_attn = Attention(config, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, eps=eps, axis_name="embed", dtype=dtype
        )
        self.mlp = (mlp_class or MLP)(config, dtype=dtype, rngs=rngs)

    def __call__(
        self, x, *, positions, mask, cache=None, cache_index=None, cache_mask=None, write_mask=None
    ):
        """Maps [B, T, D] to ([B, T, D], updated cache or None); see ``Attention``."""
        attn, new_cache = self.self_attn(
            self.input_layernorm(x),
            positions=positions,
            mask=mask,
            cache=cache,
            cache_index=cache_index,
            cache_mask=cache_mask,
            write_mask=write_mask,
        )
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return sharding.constrain(x, ACTIVATION_AXES), new_cache
