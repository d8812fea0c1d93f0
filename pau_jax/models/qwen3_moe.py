"""Qwen3-MoE causal language models: a config for the shared decoder with sparse expert blocks.

Qwen3-MoE is the decoder of ``qwen3.py`` in which some layers replace the dense
SwiGLU block with a top-k routed mixture of SwiGLU experts, so the model class,
attention, KV cache, LoRA and sampler are shared; the config chooses each
layer's block (``mlp_class``). Experts are stacked on an ``expert`` logical axis
(gate and up kernels [E, D, F], down kernels [E, F, D]).

Routing follows transformers' ``Qwen3MoeSparseMoeBlock``: router logits in the
parameter dtype, a float32 softmax over all experts, the top k probabilities,
renormalised to sum to one when ``norm_topk_prob``. The experts are computed
one of two ways, chosen from static shapes: with few tokens (N * k < E, e.g.
decoding) each token gathers only its k experts' kernels; otherwise every expert
runs on every token and unselected experts get weight zero (dense-batched:
exact, but E / k times the FLOPs of a grouped matmul).
"""

import dataclasses
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from pau_jax.models import layers, qwen3, sharding

_ARCHITECTURE = "Qwen3MoeForCausalLM"

# The model is the shared decoder; the Qwen3MoeConfig it is built with picks each layer's block.
Qwen3MoeForCausalLM = qwen3.Qwen3ForCausalLM
abstract_model = qwen3.abstract_model


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3MoeConfig(qwen3.Qwen3Config):
    """Architecture of a Qwen3-MoE decoder (field names as in Hugging Face config.json).

    Layer i is sparse when ``i not in mlp_only_layers``, ``num_experts > 0`` and
    ``(i + 1) % decoder_sparse_step == 0``; other layers keep the dense MLP of
    width ``intermediate_size``. ``router_aux_loss_coef`` (the load-balancing
    loss weight of pre-training) is kept for the config round trip and unused.
    """

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001

    def __post_init__(self):
        super().__post_init__()
        if not self.qk_norm:
            raise ValueError("Qwen3-MoE has q/k norms; qk_norm must be True")
        if self.num_experts < 0 or self.decoder_sparse_step <= 0:
            raise ValueError(
                f"num_experts ({self.num_experts}) must be >= 0 and decoder_sparse_step "
                f"({self.decoder_sparse_step}) positive"
            )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                f"[1, num_experts={self.num_experts}]"
            )
        if self.num_experts and self.moe_intermediate_size <= 0:
            raise ValueError(
                f"moe_intermediate_size must be positive, got {self.moe_intermediate_size}"
            )
        if not isinstance(self.mlp_only_layers, tuple):
            raise ValueError("mlp_only_layers must be a tuple of layer indices")

    def is_sparse(self, layer_index: int) -> bool:
        """Whether decoder layer ``layer_index`` has the sparse expert block."""
        return (
            layer_index not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer_index + 1) % self.decoder_sparse_step == 0
        )

    def mlp_class(self, layer_index: int) -> type[nnx.Module]:
        """``SparseMoeBlock`` for sparse layers, the dense SwiGLU ``layers.MLP`` otherwise."""
        return SparseMoeBlock if self.is_sparse(layer_index) else layers.MLP

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], *, source: str = "config") -> "Qwen3MoeConfig":
        """Reads a Hugging Face Qwen3-MoE config dict (transformers 4 or 5 form).

        The expert count is ``num_experts`` (the official files) or
        ``num_local_experts`` (what transformers 5 writes); the RoPE base comes
        from ``rope_parameters`` or ``rope_theta``.

        Raises:
          ValueError: the dict is not a Qwen3-MoE causal-LM config, or uses a
            feature this model lacks (sliding window, attention bias, RoPE scaling).
        """
        if d.get("model_type") != "qwen3_moe":
            raise ValueError(
                f"{source} has model_type {d.get('model_type')!r}; only Qwen3-MoE checkpoints "
                "(model_type 'qwen3_moe') can be loaded"
            )
        architectures = d.get("architectures") or [_ARCHITECTURE]
        if _ARCHITECTURE not in architectures:
            raise ValueError(
                f"{source} describes {architectures}; only {_ARCHITECTURE} is supported"
            )
        missing = [k for k in ("num_experts_per_tok", "moe_intermediate_size") if k not in d]
        if "num_experts" not in d and "num_local_experts" not in d:
            missing.append("num_experts")
        if missing:
            raise ValueError(f"{source} lacks {missing[0]!r}, which a Qwen3-MoE config needs")
        # The dense reader checks the shared fields; it accepts only model_type "qwen3".
        dense = qwen3.Qwen3Config.from_hf_dict(
            dict(d, model_type="qwen3", architectures=["Qwen3ForCausalLM"]), source=source
        )
        experts = d["num_experts"] if "num_experts" in d else d["num_local_experts"]
        return cls(
            **{f.name: getattr(dense, f.name) for f in dataclasses.fields(qwen3.Qwen3Config)},
            num_experts=experts,
            num_experts_per_tok=d["num_experts_per_tok"],
            moe_intermediate_size=d["moe_intermediate_size"],
            norm_topk_prob=bool(d.get("norm_topk_prob", False)),
            decoder_sparse_step=d.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
            router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` dict (readable by transformers 4 and 5)."""
        d = super().to_hf_dict()
        d.update(
            architectures=[_ARCHITECTURE],
            model_type="qwen3_moe",
            num_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            moe_intermediate_size=self.moe_intermediate_size,
            norm_topk_prob=self.norm_topk_prob,
            decoder_sparse_step=self.decoder_sparse_step,
            mlp_only_layers=list(self.mlp_only_layers),
            router_aux_loss_coef=self.router_aux_loss_coef,
            output_router_logits=False,
        )
        return d

    def num_parameters(self, *, active: bool = False) -> int:
        """Parameters of the model (with ``active``, those one token uses: k experts per layer)."""
        d, n, k = self.hidden_size, self.num_attention_heads, self.num_key_value_heads
        h = self.head_dim
        attention = 2 * d * n * h + 2 * d * k * h + 2 * h
        total = (1 if self.tie_word_embeddings else 2) * self.vocab_size * d + d
        for i in range(self.num_hidden_layers):
            total += attention + 2 * d
            if self.is_sparse(i):
                experts = self.num_experts_per_tok if active else self.num_experts
                total += d * self.num_experts + experts * 3 * d * self.moe_intermediate_size
            else:
                total += 3 * d * self.intermediate_size
        return total


def _param(rngs: nnx.Rngs, shape, axes, dtype) -> nnx.Param:
    """A normal(0.02) parameter carrying logical axis names (placed later, like ``layers.Linear``)."""
    value = nnx.initializers.normal(layers.INIT_STDDEV)(rngs.params(), shape, dtype)
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class Router(nnx.Module):
    """The expert router (``mlp.gate`` in Hugging Face names): a bias-free [D, E] kernel."""

    def __init__(self, config: Qwen3MoeConfig, *, dtype, rngs: nnx.Rngs):
        self.kernel = _param(
            rngs, (config.hidden_size, config.num_experts), ("embed", "expert"), dtype
        )
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Routes [N, D] tokens: ([N, k] weights in the parameter dtype, [N, k] int32 experts)."""
        kernel = self.kernel[...]
        logits = x.astype(kernel.dtype) @ kernel
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        weights, experts = jax.lax.top_k(probs, self.top_k)
        if self.norm_topk_prob:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return weights.astype(kernel.dtype), experts


class ExpertLinear(nnx.Module):
    """E stacked bias-free linear kernels [E, in, out] (stored per expert in checkpoints)."""

    def __init__(self, num_experts, in_features, out_features, *, axes, dtype, rngs: nnx.Rngs):
        shape = (num_experts, in_features, out_features)
        self.kernel = _param(rngs, shape, ("expert", *axes), dtype)


class Experts(nnx.Module):
    """The SwiGLU experts of one sparse layer: ``down_e(silu(gate_e(x)) * up_e(x))``."""

    def __init__(self, config: Qwen3MoeConfig, *, dtype, rngs: nnx.Rngs):
        e, d, f = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_proj = ExpertLinear(e, d, f, axes=("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.up_proj = ExpertLinear(e, d, f, axes=("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.down_proj = ExpertLinear(e, f, d, axes=("mlp", "embed"), dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, weights: jax.Array, experts: jax.Array) -> jax.Array:
        """Mixes each token's k experts.

        Args:
          x: [N, D] tokens.
          weights: [N, k] routing weights.
          experts: [N, k] int32 expert indices.

        Returns:
          [N, D], ``sum_j weights[n, j] * expert_{experts[n, j]}(x[n])``.
        """
        gate, up = self.gate_proj.kernel[...], self.up_proj.kernel[...]
        down = self.down_proj.kernel[...]
        x = x.astype(gate.dtype)
        n, k = experts.shape
        if n * k < gate.shape[0]:
            # Few tokens: read only the selected experts' kernels ([N, k, D, F] gathers).
            h = jax.nn.silu(jnp.einsum("nd,nkdf->nkf", x, gate[experts]))
            h = h * jnp.einsum("nd,nkdf->nkf", x, up[experts])
            y = jnp.einsum("nkf,nkfd->nkd", h, down[experts])
            return jnp.einsum("nkd,nk->nd", y, weights.astype(y.dtype))
        # Many tokens: every expert on every token, unselected experts weighted zero.
        mix = jnp.sum(
            jax.nn.one_hot(experts, gate.shape[0], dtype=weights.dtype) * weights[..., None], 1
        )
        h = jax.nn.silu(jnp.einsum("nd,edf->nef", x, gate)) * jnp.einsum("nd,edf->nef", x, up)
        y = jnp.einsum("nef,efd->ned", h, down)
        return jnp.einsum("ned,ne->nd", y, mix.astype(y.dtype))


class SparseMoeBlock(nnx.Module):
    """Top-k routed mixture of SwiGLU experts (``mlp`` of a sparse layer: ``gate`` and ``experts``)."""

    def __init__(self, config: Qwen3MoeConfig, *, dtype, rngs: nnx.Rngs):
        self.gate = Router(config, dtype=dtype, rngs=rngs)
        self.experts = Experts(config, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps [B, T, D] to [B, T, D]."""
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        weights, experts = self.gate(flat)
        return self.experts(flat, weights, experts).reshape(b, t, d).astype(x.dtype)


def _preset(*, intermediate, rope_theta, max_positions, aux_loss) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=intermediate,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=rope_theta,
        tie_word_embeddings=False,
        max_position_embeddings=max_positions,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=(),
        router_aux_loss_coef=aux_loss,
    )


# The official Qwen3-MoE sizes (architecture only; token ids come from the checkpoint).
# Every layer is sparse, so intermediate_size (the dense width) is unused but kept as released.
PRESETS: dict[str, Qwen3MoeConfig] = {
    "30B-A3B": _preset(
        intermediate=6144, rope_theta=1_000_000.0, max_positions=40960, aux_loss=0.001
    ),
    "Coder-30B-A3B": _preset(
        intermediate=5472, rope_theta=10_000_000.0, max_positions=262144, aux_loss=0.0
    ),
}


def load_hf(
    path: str | pathlib.Path,
    dtype="float32",
    mesh: jax.sharding.Mesh | None = None,
    *,
    rules: sharding.Rules = sharding.LOGICAL_RULES,
) -> tuple[qwen3.Qwen3ForCausalLM, Qwen3MoeConfig]:
    """Loads a Hugging Face ``Qwen3MoeForCausalLM`` checkpoint directory (see ``qwen3.load_hf``).

    Experts may be stored per expert (``mlp.experts.{i}.gate_proj.weight``, what
    ``save_pretrained`` writes) or fused (``mlp.experts.gate_up_proj``).

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or an index and shards).
      dtype: parameter dtype, e.g. "float32" or "bfloat16".
      mesh: optional device mesh.
      rules: logical-axis to mesh-axis rules.

    Returns:
      (model, config).
    """
    config = Qwen3MoeConfig.from_json(pathlib.Path(path))
    return qwen3.load_weights(config, path, dtype, mesh, rules=rules), config


def save_hf(
    model: qwen3.Qwen3ForCausalLM,
    config: Qwen3MoeConfig,
    path: str | pathlib.Path,
    *,
    max_shard_bytes: int | None = None,
) -> None:
    """Writes a ``Qwen3MoeForCausalLM`` checkpoint (experts per expert) that ``transformers`` loads."""
    if not isinstance(config, Qwen3MoeConfig):
        raise ValueError(f"save_hf: expected a Qwen3MoeConfig, got {type(config).__name__}")
    qwen3.save_hf(model, config, path, max_shard_bytes=max_shard_bytes)
