"""Tiny random Hugging Face checkpoints for tests (built with transformers + PyTorch CPU)."""

import pathlib

TINY_QWEN3 = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def make_tiny_qwen3(directory, *, seed: int = 0, **overrides):
    """Saves a random `Qwen3ForCausalLM` with `save_pretrained`; returns (path, torch model).

    Args:
      directory: where to write `config.json` and `model.safetensors`.
      seed: torch seed for the random weights.
      **overrides: fields replacing those of `TINY_QWEN3`.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fields = dict(TINY_QWEN3, **overrides)
    config = Qwen3Config(**fields)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    # Random init leaves norms at 1.0; perturb them so the tests see their effect.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
    path = pathlib.Path(directory)
    model.save_pretrained(path)
    return path, model


def tiny_qwen3_config(*, max_position_embeddings: int = 4096, **overrides):
    """A `pau_jax` Qwen3Config of a 1-layer model over the real Qwen3 vocabulary (151,936 rows).

    With the offline Qwen3 tokenizer it makes a real chat policy that is cheap on a CPU.
    """
    from pau_jax.models import qwen3

    fields = dict(
        vocab_size=151936,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        tie_word_embeddings=True,
        max_position_embeddings=max_position_embeddings,
    )
    return qwen3.Qwen3Config(**dict(fields, **overrides))


def save_tiny_chat_checkpoint(directory, *, seed: int = 0, max_position_embeddings: int = 4096):
    """Writes a tiny random `pau_jax` Qwen3 over the real vocabulary with the offline tokenizer.

    A Hugging Face folder (`config.json`, safetensors, tokenizer files) that any seat,
    server or tool can load as a chat model; returns its path.
    """
    from flax import nnx

    from pau_jax.models import qwen3
    from pau_jax.tokenizer import save_offline_tokenizer

    config = tiny_qwen3_config(max_position_embeddings=max_position_embeddings)
    path = pathlib.Path(directory)
    qwen3.save_hf(qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed)), config, path)
    save_offline_tokenizer(path)
    return path
