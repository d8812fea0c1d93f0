"""Flax NNX language models with Hugging Face checkpoints and LoRA adapters."""

from pau_jax.models import (
    auto,
    decoder,
    decoder_config,
    hf_checkpoint,
    kv_cache,
    layers,
    llama,
    lora,
    qwen2,
    qwen3,
    qwen3_moe,
    sharding,
    weights,
)
from pau_jax.models.auto import load_hf, random_checkpoint

__all__ = [
    "auto",
    "decoder",
    "decoder_config",
    "hf_checkpoint",
    "kv_cache",
    "layers",
    "llama",
    "load_hf",
    "lora",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "random_checkpoint",
    "sharding",
    "weights",
]
