"""Inputs and logits shared by the model tests: left-padded batches, ours and transformers'."""

import numpy as np
import torch
from flax import nnx

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
