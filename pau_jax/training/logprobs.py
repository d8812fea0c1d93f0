"""Log-probs of given tokens under a causal LM, chunked over positions (used by every loss).

Token alignment: for ids [B, T], ``logp[:, t] = log softmax(logits[:, t-1] / T)[ids[:, t]]``
for t >= 1 and ``logp[:, 0] = 0`` (no prediction exists for the first token).
"""

import jax
import jax.numpy as jnp


def logprobs_from_logits(
    logits: jax.Array, targets: jax.Array, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Log-prob of each target and the entropy, under softmax(logits / temperature).

    Args:
      logits: [..., V].
      targets: [...] int token ids.
      temperature: T > 0.

    Returns:
      ([...] float32 log-probs, [...] float32 entropies; the entropy carries no gradient).
    """
    scaled = logits.astype(jnp.float32) / temperature
    log_z = jax.nn.logsumexp(scaled, axis=-1)
    picked = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0]
    probs = jnp.exp(scaled - log_z[..., None])
    entropy = jax.lax.stop_gradient(log_z - jnp.sum(probs * scaled, axis=-1))
    return picked - log_z, entropy


def token_logprobs(
    model,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    remat: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Log-probs and entropies of the given tokens, without materialising [B, T, V] logits.

    The final hidden states are computed once; the language-model head, softmax
    and gather then run over chunks of at most ``chunk_tokens`` positions
    (``lax.map``), each chunk rematerialised in the backward pass, so peak
    memory holds one [chunk, V] block instead of B * T * V logits.

    Args:
      model: a causal LM with ``hidden_states`` and ``logits_from_hidden``.
      input_ids: [B, T] int32.
      attention_mask: [B, T], 1 for real tokens.
      temperature: rollout temperature.
      chunk_tokens: largest number of positions whose logits exist at once.
      remat: recompute each decoder layer's activations in the backward pass
        (``Decoder.hidden_states``); the values are the same.

    Returns:
      ([B, T] log-probs, [B, T] entropies of the predicting distribution), both
      0 in column 0.
    """
    if remat:
        hidden = model.hidden_states(input_ids, attention_mask, remat=True)  # [B, T, D]
    else:
        hidden = model.hidden_states(input_ids, attention_mask)
    b, t, d = hidden.shape
    n = b * (t - 1)
    if n == 0:
        zeros = jnp.zeros((b, t), jnp.float32)
        return zeros, zeros
    n_chunks = -(-n // chunk_tokens)
    size = -(-n // n_chunks)
    pad = n_chunks * size - n
    h = jnp.pad(hidden[:, :-1].reshape(n, d), ((0, pad), (0, 0))).reshape(n_chunks, size, d)
    targets = jnp.pad(input_ids[:, 1:].reshape(n), (0, pad)).reshape(n_chunks, size)

    @jax.checkpoint
    def chunk(args):
        h_chunk, target_chunk = args
        return logprobs_from_logits(model.logits_from_hidden(h_chunk), target_chunk, temperature)

    logp, entropy = jax.lax.map(chunk, (h, targets))

    def unchunk(x):
        return jnp.pad(x.reshape(-1)[:n].reshape(b, t - 1), ((0, 0), (1, 0)))

    return unchunk(logp), unchunk(entropy)
