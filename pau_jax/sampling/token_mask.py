"""Structured decoding on the device: a `constraint.TokenAutomaton`'s token mask and step.

`mask_logits` (over `budget_mask`, the kept tokens: the grammar's, `allowed_tokens`,
and the budget rule), `advance` and `is_complete` are pure, per row, and jittable;
`effective_masks` gives on the host the mask each sampled token was drawn under, for a
learner that scores the tokens under the same masks.
"""

import jax
import jax.numpy as jnp
import numpy as np

from pau_jax.sampling.constraint import TokenAutomaton


def allowed_tokens(automaton: TokenAutomaton, states: jax.Array) -> jax.Array:
    """[B] states -> [B, V] bool: which tokens each row may sample."""
    words = jnp.asarray(automaton.masks)[jnp.asarray(automaton.mask_row)[states]]  # [B, W]
    shifts = jnp.arange(32, dtype=jnp.uint32)
    bits = (words[:, :, None] >> shifts) & jnp.uint32(1)  # [B, W, 32]
    return bits.reshape(states.shape[0], -1)[:, : automaton.vocab_size].astype(bool)


def mask_logits(
    automaton: TokenAutomaton,
    states: jax.Array,
    logits: jax.Array,
    remaining: jax.Array | None = None,
) -> jax.Array:
    """[B] states, [B, V] logits -> [B, V] logits with disallowed tokens at -inf.

    A row in state `automaton.free` is returned unchanged. With `remaining` ([B] tokens
    left, this one included), a token is also disallowed when the answer could not be
    completed in the tokens left after it (`distance`), unless no token could: then the
    grammar's mask alone applies. So a reply completes within its budget whenever its
    start state's distance fits.
    """
    keep = budget_mask(automaton, states, remaining)
    return jnp.where(keep, logits, jnp.asarray(-jnp.inf, logits.dtype))


def budget_mask(
    automaton: TokenAutomaton, states: jax.Array, remaining: jax.Array | None = None
) -> jax.Array:
    """[B, V] bool: the tokens `mask_logits` keeps (the grammar's, and the budget rule)."""
    keep = allowed_tokens(automaton, states)
    if remaining is not None:
        nxt = jnp.asarray(automaton.next_state)[states].astype(jnp.int32)  # [B, C]
        near = jnp.asarray(automaton.distance)[jnp.maximum(nxt, 0)] < remaining[:, None]
        fits = keep & near[:, jnp.asarray(automaton.token_class)]
        keep = jnp.where(jnp.any(fits, axis=-1, keepdims=True), fits, keep)
    return keep


def effective_masks(
    automaton: TokenAutomaton, states: np.ndarray, remaining: np.ndarray
) -> list[np.ndarray | None]:
    """Per token, the set `mask_logits` allowed it from: packed [ceil(V / 32)] uint32 bits.

    On the host, for a learner that scores the tokens under the same masks as the sampler
    (`training.logprobs.token_logprobs`'s ``masks``). None where every token of the
    vocabulary was allowed (the `free` state, a detector), so unmasked tokens cost nothing.

    Args:
      automaton: the automaton the tokens were sampled under.
      states: [n] each token's state before it was drawn (`SampleOutput.states`).
      remaining: [n] the tokens left in the budget at each, that token included.
    """
    masks, mask_row = np.asarray(automaton.masks), np.asarray(automaton.mask_row)
    next_state = np.asarray(automaton.next_state).astype(np.int32)
    distance, token_class = np.asarray(automaton.distance), np.asarray(automaton.token_class)
    vocab = automaton.vocab_size
    out = []
    for state, left in zip(np.asarray(states).tolist(), np.asarray(remaining).tolist()):
        keep = np.unpackbits(masks[mask_row[state]].view(np.uint8), bitorder="little")[:vocab]
        keep = keep.astype(bool)
        near = (distance[np.maximum(next_state[state], 0)] < left)[token_class]
        fits = keep & near
        if fits.any():
            keep = fits
        if keep.all():
            out.append(None)
            continue
        padded = np.zeros(masks.shape[1] * 32, bool)
        padded[:vocab] = keep
        out.append(np.packbits(padded, bitorder="little").view("<u4").astype(np.uint32))
    return out


def advance(automaton: TokenAutomaton, states: jax.Array, tokens: jax.Array) -> jax.Array:
    """[B] states, [B] sampled tokens -> [B] next states (`dead` after a disallowed token)."""
    classes = jnp.asarray(automaton.token_class)[tokens]
    nxt = jnp.asarray(automaton.next_state)[states, classes].astype(jnp.int32)
    return jnp.where(nxt < 0, automaton.dead, nxt)


def is_complete(automaton: TokenAutomaton, states: jax.Array) -> jax.Array:
    """[B] states -> [B] bool: the answer is complete (only stop tokens remain)."""
    return jnp.asarray(automaton.accepting)[states]
