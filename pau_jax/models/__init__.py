"""Flax NNX language models with Hugging Face checkpoints and LoRA adapters."""

from pau_jax.models import kv_cache, layers, llama, lora, qwen3, sharding, weights

__all__ = ["kv_cache", "layers", "llama", "lora", "qwen3", "sharding", "weights"]
