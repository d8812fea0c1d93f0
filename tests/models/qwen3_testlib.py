"""Shared by the model tests: tiny checkpoints, left-padded batches, logits (ours, transformers')."""

import pathlib

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from pau_jax.models import lora

TOL = 1e-4


def left_padded(vocab_size: int, lengths, *, seed: int = 0):
    """Random ids [B, T] int32 and mask [B, T] int32, row b holding lengths[b] real tokens at the end."""
    rng = np.random.default_rng(seed)
    total = max(lengths)
    ids = rng.integers(0, vocab_size, (len(lengths), total)).astype(np.int32)
    mask = np.zeros((len(lengths), total), np.int32)
    for row, length in enumerate(lengths):
        mask[row, total - length :] = 1
        ids[row, : total - length] = 0
    return ids, mask


# One batch for the logits tests of all modules, so a model's forward compiles once per process.
BATCH_LENGTHS = (9, 6, 3, 1)


def batch(vocab_size: int):
    """The shared left-padded test batch: ids and mask [4, 9]."""
    return left_padded(vocab_size, BATCH_LENGTHS, seed=2)


def positions(mask: np.ndarray) -> np.ndarray:
    """[B, T] positions of left-padded rows: cumsum(mask) - 1 clipped at 0."""
    return np.maximum(np.cumsum(mask, axis=-1) - 1, 0).astype(np.int32)


@nnx.jit
def _forward(model, ids, mask, positions):
    return model(ids, mask, positions)


def ours(model, ids: np.ndarray, mask: np.ndarray, positions=None) -> np.ndarray:
    """Our [B, T, V] logits (jitted)."""
    return np.asarray(_forward(model, ids, mask, positions))


def theirs(torch_model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers' [B, T, V] logits, given the same positions through position_ids."""
    with torch.no_grad():
        out = torch_model(
            input_ids=torch.from_numpy(ids.astype(np.int64)),
            attention_mask=torch.from_numpy(mask.astype(np.int64)),
            position_ids=torch.from_numpy(positions(mask).astype(np.int64)),
        )
    return out.logits.float().numpy()


def max_real_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Largest |a - b| over real (mask == 1) positions of [B, T, V] logits."""
    return float(np.abs(a - b)[mask.astype(bool)].max())


def built_once(tmp_path_factory, make, variants: dict, *, seed: int):
    """A getter of tiny checkpoints built on first use: name -> make(directory, seed=, **variant).

    ``make`` returns (path, torch model); each variant is saved in its own temporary directory.
    """
    built = {}

    def get(name):
        if name not in built:
            built[name] = make(tmp_path_factory.mktemp(name), seed=seed, **variants[name])
        return built[name]

    return get


def perturb_and_save(torch_model, directory, *, bias_scale: float = 0.0):
    """Saves a random transformers model with ``save_pretrained``; returns (path, model).

    Random init leaves norms at 1.0 and biases at 0.0: norm weights get N(0, 0.1^2) noise
    and biases N(0, bias_scale^2), so the tests see their effect.
    """
    with torch.no_grad():
        for name, param in torch_model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.add_(bias_scale * torch.randn_like(param))
    path = pathlib.Path(directory)
    torch_model.save_pretrained(path)
    return path, torch_model


def theirs_greedy(torch_model, prompts, max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy ``generate`` of token-id prompts (left-padded, no EOS): new tokens."""
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    with torch.no_grad():
        out = torch_model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[:, width:].tolist()


def randomise_lora_b(model, *, seed: int = 0, scale: float = 0.1) -> None:
    """Sets every adapter's B to N(0, scale^2) float32 values, so the adapters change the logits."""
    rng = np.random.default_rng(seed)
    for adapter in lora.adapters(model).values():
        value = scale * rng.standard_normal(adapter.lora_b.shape)
        adapter.lora_b.set_value(jnp.asarray(value, np.float32))


def gin_config(config_class, module: str, gin_file):
    """The config that ``gin_file`` binds for ``config_class`` registered under ``module``."""
    import importlib.util  # noqa: F401  (gin-config 0.5.0 needs it imported before parsing)

    import gin

    configurable = gin.external_configurable(config_class, module=module)
    gin.clear_config()
    try:
        gin.parse_config_file(str(gin_file))
        return configurable()
    finally:
        gin.clear_config()
