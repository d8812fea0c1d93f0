"""Qwen3-MoE: the Qwen3 decoder in which sparse layers swap the MLP for routed SwiGLU experts.

The config chooses each layer's block (``mlp_class``); model, attention, KV
cache, LoRA and sampler are the shared ``decoder.py`` ones. Experts are stacked
on an ``expert`` logical axis (gate and up kernels [E, D, F], down kernels [E, F, D]).

Routing follows transformers' ``Qwen3MoeSparseMoeBlock``: router logits in the
parameter dtype, a float32 softmax over all experts, the top k probabilities,
renormalised to sum to one when ``norm_topk_prob``. The experts are computed
one of two ways, chosen from static shapes: with few tokens (N * k < E, e.g.
decoding) each token gathers only its k experts' kernels; otherwise every expert
runs on every token and unselected experts get weight zero (dense-batched:
exact, but E / k times the FLOPs of a grouped matmul).
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from pau_jax.models import decoder, hf_checkpoint, layers, qwen3


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3MoeConfig(qwen3.Qwen3Config):
    """Architecture of a Qwen3-MoE decoder (field names as in Hugging Face config.json).

    Layer i is sparse when ``i not in mlp_only_layers``, ``num_experts > 0`` and
    ``(i + 1) % decoder_sparse_step == 0``; other layers keep the dense MLP of
    width ``intermediate_size``. ``router_aux_loss_coef`` (the load-balancing
    loss weight of pre-training) is kept for the config round trip and unused.
    """

    model_type = "qwen3_moe"
    architecture = "Qwen3MoeForCausalLM"
    family_name = "Qwen3-MoE"

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001

    def __post_init__(self):
        super().__post_init__()
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

    def mlp_parameters(self, layer_index: int, *, active: bool = False) -> int:
        """Parameters of a layer's block; a sparse one counts k experts when ``active``."""
        if not self.is_sparse(layer_index):
            return super().mlp_parameters(layer_index)
        experts = self.num_experts_per_tok if active else self.num_experts
        d = self.hidden_size
        return d * self.num_experts + experts * 3 * d * self.moe_intermediate_size

    @classmethod
    def _from_hf_extra(cls, d: dict[str, Any], *, rope: dict[str, Any], source: str) -> dict:
        """The expert fields; the count is ``num_experts`` or (transformers 5) ``num_local_experts``."""
        del rope
        missing = [k for k in ("num_experts_per_tok", "moe_intermediate_size") if k not in d]
        if "num_experts" not in d and "num_local_experts" not in d:
            missing.append("num_experts")
        if missing:
            raise ValueError(
                f"{source} lacks {missing[0]!r}, which a {cls.family_name} config needs"
            )
        return {
            "num_experts": d["num_experts"] if "num_experts" in d else d["num_local_experts"],
            "num_experts_per_tok": d["num_experts_per_tok"],
            "moe_intermediate_size": d["moe_intermediate_size"],
            "norm_topk_prob": bool(d.get("norm_topk_prob", False)),
            "decoder_sparse_step": d.get("decoder_sparse_step", 1),
            "mlp_only_layers": tuple(d.get("mlp_only_layers") or ()),
            "router_aux_loss_coef": float(d.get("router_aux_loss_coef", 0.001)),
        }

    def _to_hf_extra(self) -> dict[str, Any]:
        return {
            **super()._to_hf_extra(),
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "norm_topk_prob": self.norm_topk_prob,
            "decoder_sparse_step": self.decoder_sparse_step,
            "mlp_only_layers": list(self.mlp_only_layers),
            "router_aux_loss_coef": self.router_aux_loss_coef,
            "output_router_logits": False,
        }


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

FAMILY = hf_checkpoint.Family(config=Qwen3MoeConfig, presets=PRESETS)

# The model is the shared decoder; the Qwen3MoeConfig it is built with picks each layer's block.
Qwen3MoeForCausalLM = decoder.Decoder
abstract_model = hf_checkpoint.abstract_model
load_hf = FAMILY.load_hf
save_hf = FAMILY.save_hf
