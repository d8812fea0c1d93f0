"""A tiny random Qwen3 with LoRA, a left-padded training batch, and a NumPy GRPO reference."""

import numpy as np
from flax import nnx

from pau_jax.models import lora, qwen3

CONFIG = qwen3.Qwen3Config(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=64,
)
RANK, ALPHA = 4, 8


def tiny_model(*, with_lora: bool = True, seed: int = 0) -> qwen3.Qwen3ForCausalLM:
    """The same random base weights for a given seed; adapters with a random (non-zero) B."""
    model = qwen3.Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(seed))
    if with_lora:
        lora.apply_lora(model, rank=RANK, alpha=ALPHA, seed=seed + 1)
        rng = np.random.default_rng(seed + 2)
        for adapter in lora.adapters(model).values():
            b = 0.2 * rng.standard_normal(adapter.lora_b.shape)
            adapter.lora_b.set_value(np.asarray(b, np.float32))
    return model


# Rows: real lengths and completion lengths (tokens at the end of the row's real span).
# Row 3 has no completion token: a padding row that must not count.
LENGTHS = (10, 8, 6, 9)
COMPLETIONS = (4, 3, 2, 0)


def batch_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Left-padded ids [4, 10], attention mask, loss mask and per-sequence advantages."""
    rng = np.random.default_rng(seed)
    rows, total = len(LENGTHS), max(LENGTHS)
    ids = rng.integers(1, CONFIG.vocab_size, (rows, total)).astype(np.int32)
    attention = np.zeros((rows, total), np.int32)
    loss = np.zeros((rows, total), np.float32)
    for row, (length, completion) in enumerate(zip(LENGTHS, COMPLETIONS)):
        attention[row, total - length :] = 1
        ids[row, : total - length] = 0
        if completion:
            loss[row, total - completion :] = 1.0
    advantages = rng.standard_normal(rows).astype(np.float32)
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "loss_mask": loss,
        "advantages": advantages,
    }


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def next_token_logprobs(logits: np.ndarray, ids: np.ndarray, temperature: float = 1.0):
    """[B, T] log-prob of ids[:, t] under logits[:, t - 1] / temperature; column 0 is 0."""
    lp = log_softmax(logits / temperature)
    out = np.zeros(ids.shape, np.float64)
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            out[b, t] = lp[b, t - 1, ids[b, t]]
    return out


def grpo_loss(logp, old, ref, adv, mask, *, eps_low, eps_high, beta, mode, max_length=None):
    """The GRPO objective written token by token in float64 (position 0 never counts)."""
    rows, length = logp.shape
    per_row_sum, per_row_count = [], []
    for b in range(rows):
        total, count = 0.0, 0
        for t in range(1, length):
            if mask[b, t] == 0:
                continue
            a = adv[b] if np.ndim(adv) == 1 else adv[b, t]
            ratio = np.exp(logp[b, t] - old[b, t])
            surrogate = min(a * ratio, a * min(max(ratio, 1 - eps_low), 1 + eps_high))
            d = ref[b, t] - logp[b, t]
            total += -surrogate + beta * (np.exp(d) - d - 1)
            count += 1
        per_row_sum.append(total)
        per_row_count.append(count)
    if mode == "token-mean":
        return sum(per_row_sum) / sum(per_row_count)
    used = [b for b in range(rows) if per_row_count[b]]
    if mode == "sequence-mean-token-mean":
        return sum(per_row_sum[b] / per_row_count[b] for b in used) / len(used)
    return sum(per_row_sum[b] / max_length for b in used) / len(used)
