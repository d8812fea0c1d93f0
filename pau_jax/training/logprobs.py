"""Log-probs of given tokens under a causal LM, chunked over positions (used by every loss).

Token alignment: for ids [B, T], ``logp[:, t] = log softmax(logits[:, t-1] / T)[ids[:, t]]``
for t >= 1 and ``logp[:, 0] = 0`` (no prediction exists for the first token).
"""

import jax
import jax.numpy as jnp


def logprobs_from_logits(
    logits: jax.Array, targets: jax.Array, temperature: float = 1.0, allowed=None
) -> tuple[jax.Array, jax.Array]:
    """Log-prob of each target and the entropy, under softmax(logits / temperature).

    Args:
      logits: [..., V].
      targets: [...] int token ids.
      temperature: T > 0.
      allowed: [..., V] bool, the tokens a structured-decoding mask allowed; the
        softmax is then over those only (the masked policy). None: every token.

    Returns:
      ([...] float32 log-probs, [...] float32 entropies; the entropy carries no gradient).
    """
    scaled = logits.astype(jnp.float32) / temperature
    if allowed is not None:
        scaled = jnp.where(allowed, scaled, -jnp.inf)
    log_z = jax.nn.logsumexp(scaled, axis=-1)
    picked = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0]
    probs = jnp.exp(scaled - log_z[..., None])
    weighted = probs * scaled if allowed is None else jnp.where(allowed, probs * scaled, 0.0)
    entropy = jax.lax.stop_gradient(log_z - jnp.sum(weighted, axis=-1))
    return picked - log_z, entropy


def unpack_masks(words: jax.Array, vocab_size: int) -> jax.Array:
    """[..., W] uint32 packed masks (bit t % 32 of word t // 32) -> [..., vocab_size] bool."""
    shifts = jnp.arange(32, dtype=jnp.uint32)
    bits = (words[..., None] >> shifts) & jnp.uint32(1)
    return bits.reshape(*words.shape[:-1], -1)[..., :vocab_size].astype(bool)


def token_logprobs(
    model,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    remat: bool = False,
    positions: jax.Array | None = None,
    masks: tuple[jax.Array, jax.Array] | None = None,
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
      positions: [B, P] int32, the only columns whose log-probs are wanted (a loss's
        sampled tokens); 0 pads a row. The head then runs on B * P positions instead of
        B * (T - 1): the vocabulary projection, softmax and its backward are most of
        the cost of a long prompt whose tokens are not in the loss. Every other column
        is 0 in the outputs; the wanted columns are the same numbers as without it.
      masks: with ``positions``, (table [B, R, W] uint32 each row's packed masks, index
        [B, P] int32 an entry of its row's table per position): each listed column's
        log-prob is taken under the tokens its mask allows (a structured-decoding
        sampler's masked policy); entry 0 of a row's table allows every token.

    Returns:
      ([B, T] log-probs, [B, T] entropies of the predicting distribution), both
      0 in column 0.
    """
    if remat:
        hidden = model.hidden_states(input_ids, attention_mask, remat=True)  # [B, T, D]
    else:
        hidden = model.hidden_states(input_ids, attention_mask)
    b, t, d = hidden.shape
    if positions is not None:
        return _logprobs_at(model, hidden, input_ids, positions, temperature, chunk_tokens, masks)
    if masks is not None:
        raise ValueError("masks need positions (the columns they belong to)")
    n = b * (t - 1)
    if n == 0:
        zeros = jnp.zeros((b, t), jnp.float32)
        return zeros, zeros
    logp, entropy = _chunked_head(
        model, hidden[:, :-1].reshape(n, d), input_ids[:, 1:].reshape(n), temperature, chunk_tokens
    )

    def unchunk(x):
        return jnp.pad(x.reshape(b, t - 1), ((0, 0), (1, 0)))

    return unchunk(logp), unchunk(entropy)


def _logprobs_at(model, hidden, input_ids, positions, temperature, chunk_tokens, masks=None):
    """``token_logprobs`` of the columns ``positions`` [B, P] only, scattered into [B, T]."""
    b, t, d = hidden.shape
    p = positions.shape[1]
    if b * p == 0:
        zeros = jnp.zeros((b, t), jnp.float32)
        return zeros, zeros
    positions = positions.astype(jnp.int32)
    wanted = (positions > 0).astype(jnp.float32)
    # Column t is predicted by the hidden state of column t - 1.
    h = jnp.take_along_axis(hidden, jnp.maximum(positions - 1, 0)[..., None], axis=1)
    targets = jnp.take_along_axis(input_ids, positions, axis=1)
    words = None
    if masks is not None:  # [B, P, W]: each position's packed mask, unpacked chunk by chunk
        table, index = masks
        words = jnp.take_along_axis(table, index[..., None], axis=1).reshape(b * p, -1)
    logp, entropy = _chunked_head(
        model, h.reshape(b * p, d), targets.reshape(b * p), temperature, chunk_tokens, words
    )
    rows = jnp.arange(b)[:, None]

    def scatter(x):  # padding entries (column 0) add 0
        return jnp.zeros((b, t), jnp.float32).at[rows, positions].add(x.reshape(b, p) * wanted)

    return scatter(logp), scatter(entropy)


def _chunked_head(model, hidden, targets, temperature, chunk_tokens, words=None):
    """Log-probs and entropies of ``targets`` [N] from ``hidden`` [N, D], ``chunk_tokens`` at once.

    With ``words`` [N, W] (each position's packed mask), each position's softmax is over
    the tokens its mask allows.
    """
    n, d = hidden.shape
    n_chunks = -(-n // chunk_tokens)
    size = -(-n // n_chunks)
    pad = n_chunks * size - n
    h = jnp.pad(hidden, ((0, pad), (0, 0))).reshape(n_chunks, size, d)
    targets = jnp.pad(targets, (0, pad)).reshape(n_chunks, size)
    chunks = (h, targets)
    if words is not None:
        chunks += (jnp.pad(words, ((0, pad), (0, 0))).reshape(n_chunks, size, -1),)

    @jax.checkpoint
    def chunk(args):
        logits = model.logits_from_hidden(args[0])
        allowed = unpack_masks(args[2], logits.shape[-1]) if len(args) > 2 else None
        return logprobs_from_logits(logits, args[1], temperature, allowed)

    logp, entropy = jax.lax.map(chunk, chunks)
    return logp.reshape(-1)[:n], entropy.reshape(-1)[:n]
