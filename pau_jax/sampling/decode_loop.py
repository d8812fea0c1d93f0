"""The decode: a jitted `lax.while_loop` feeding one token per row per step over a donated carry.

`decode_rows` builds the carry (`_start`: the prefilled cache and per-row buffers), then calls
`_decode` once per cache length, growing the cache between segments (`_grow`) only while some
row still needs slots (`batching.cache_rooms`). Each step writes one cache slot in place,
samples under the call's `settings.DecodeSettings` (temperature, top-k/top-p, a per-row
repetition penalty, an automaton for structured decoding) and ends rows at a stop token,
a completed answer or the token budget.

A repetition penalty adds a [B, V] bool "seen" mask to the carry: built once from the
prompts (padding excluded), marked with each new token, applied before the other filters.
It exists only in a second compiled decode program, used when some row's penalty is not 1;
an automaton likewise only in a third, so calls without them do no extra work per step.
"""

import functools
import logging
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from pau_jax.models import kv_cache, quantization, sharding
from pau_jax.sampling import batching, logits, runtime, token_mask
from pau_jax.sampling import settings as settings_lib

_log = logging.getLogger(__name__)

# Each step reads every layer's cache (attention over the earlier slots) and then writes one
# slot of it in place. XLA's CPU copy insertion cannot order the two inside the while loop
# without its region analysis and copies every cache array twice per step; the option is a
# DebugOptions field, so other backends accept and ignore it.
_COMPILER_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}


@functools.partial(jax.jit, static_argnames=("buffer_len", "vocab_size"))
def _start(
    cache,
    last_prompt_tokens,
    active,
    prompt_ids=None,
    prompt_mask=None,
    row_source=None,
    states=None,
    *,
    buffer_len,
    vocab_size,
):
    """The decode loop's carry before the first step.

    Args:
      cache: KVCache from `_prefill`.
      last_prompt_tokens: [B] the last token of each row's prompt (fed at step 0).
      active: [B] bool; inactive rows are done from the start.
      prompt_ids: [U, W] the prefilled prompts, with a repetition penalty only.
      prompt_mask: [U, W] 1 on those tokens, with a penalty only.
      row_source: [B] prompt index of every row, with a penalty only.
      states: [B] each row's first automaton state, with an automaton only.
      buffer_len: N, size of the per-row output buffers.
      vocab_size: V, size of the seen-token mask (with a penalty).

    Returns:
      The carry dict: step, last, tokens/logprobs/plain [B, N], lengths, stopped, done,
      cache, with a penalty seen [B, V] (every id of the row's prompt, its last token
      included, padding excluded), and with an automaton its states [B] and trace [B, N]
      (each token's state before it was drawn).
    """
    batch = last_prompt_tokens.shape[0]
    zeros = jnp.zeros((batch, buffer_len), jnp.float32)
    carry = dict(
        step=jnp.int32(0),
        last=last_prompt_tokens,
        tokens=jnp.zeros((batch, buffer_len), jnp.int32),
        logprobs=zeros,
        plain=zeros,
        lengths=jnp.zeros(batch, jnp.int32),
        stopped=jnp.zeros(batch, bool),
        done=~active,
        cache=cache,
    )
    if states is not None:
        carry["states"] = states
        carry["trace"] = jnp.zeros((batch, buffer_len), jnp.int32)
    if prompt_ids is not None:
        ids = jnp.concatenate(
            [jnp.take(prompt_ids, row_source, axis=0), last_prompt_tokens[:, None]], 1
        )
        real = jnp.concatenate(
            [jnp.take(prompt_mask, row_source, axis=0), jnp.ones((batch, 1), prompt_mask.dtype)], 1
        )
        seen = logits.seen_tokens(ids, real, vocab_size)
        carry["seen"] = sharding.constrain(seen, ("batch", None))
    return carry


@functools.partial(jax.jit, static_argnames=("cache_len",))
def _grow(carry, *, cache_len):
    """The carry with its cache grown to `cache_len` slots (the new ones empty)."""
    runtime.TRACES["grow"] += 1
    return dict(carry, cache=runtime.constrain_cache(kv_cache.grow(carry["cache"], cache_len)))


@functools.partial(
    jax.jit,
    static_argnames=("graphdef",),
    donate_argnames=("carry",),
    compiler_options=_COMPILER_OPTIONS,
)
def _decode(graphdef, state, carry, settings: settings_lib.DecodeSettings):
    """Samples tokens until every row is done or the cache is full.

    Step i feeds one token (the last prompt token, then the token of step i - 1) into
    cache slot W + i and samples the token of step i from its logits. A call runs from
    the carry's step until every row is done, `max_new_tokens` steps were taken or the
    cache's S slots are full (step S - W); the caller then grows the cache and calls again.

    Args:
      graphdef: the model's static graph definition.
      state: the model's state (parameters).
      carry: the loop state from `_start` (or a previous call): the KVCache (keys
        [B, K, S, H], values [B, K, H, S]) with the prompts but their last token in slots
        [0, W), then the tokens so far.
      settings: the call's `DecodeSettings`.

    Returns:
      The carry after the last step taken.
    """
    runtime.TRACES["decode"] += 1
    model = nnx.merge(graphdef, state)
    width, prompt_lens, stop_ids = settings.width, settings.prompt_lens, settings.stop_ids
    max_new_tokens, repetition_penalty = settings.max_new_tokens, settings.repetition_penalty
    penalise = repetition_penalty is not None
    automaton = settings.automaton
    last_step = jnp.minimum(max_new_tokens, carry["cache"].max_len - width)

    def step_once(carry):
        step = carry["step"]
        step_logits, cache = model.decode(
            carry["last"][:, None],
            positions=(prompt_lens - 1 + step)[:, None],
            cache=carry["cache"],
            cache_index=width + step,
        )
        raw = step_logits[:, -1]
        scores = raw
        if penalise:
            if raw.shape[-1] != carry["seen"].shape[-1]:
                raise ValueError(
                    f"the model gives {raw.shape[-1]} logits but config.vocab_size is "
                    f"{carry['seen'].shape[-1]}; repetition_penalty needs them equal"
                )
            scores = logits.repetition_penalty_logits(raw, carry["seen"], repetition_penalty)
        plain_logits = raw if penalise else None
        if automaton is not None:
            remaining = max_new_tokens - carry["lengths"]
            keep = token_mask.budget_mask(automaton, carry["states"], remaining)
            lowest = jnp.asarray(-jnp.inf, scores.dtype)
            scores = jnp.where(keep, scores, lowest)
            # The plain log-probs are those of the masked policy without the penalty: what
            # a learner applying the same mask computes (`token_mask.effective_masks`).
            plain_logits = jnp.where(keep, raw, lowest)
        tokens, logprobs, plain = logits.sample_tokens(
            scores,
            jax.lax.dynamic_index_in_dim(settings.uniforms, step, axis=1, keepdims=False),
            settings.temperature,
            settings.top_k,
            settings.top_p,
            max_top_k=settings.max_top_k,
            plain_logits=plain_logits,
        )
        live = ~carry["done"]
        tokens = jnp.where(live, tokens, 0)
        hit_stop = live & jnp.any(tokens[:, None] == stop_ids[None, :], axis=-1)
        lengths = carry["lengths"] + live
        extra = dict(seen=logits.mark_seen(carry["seen"], tokens)) if penalise else {}
        if automaton is not None:  # a row whose answer is complete ends with this token
            extra["trace"] = carry["trace"].at[:, step].set(carry["states"])
            states = token_mask.advance(automaton, carry["states"], tokens)
            extra["states"] = jnp.where(live, states, carry["states"])
            hit_stop = hit_stop | (live & token_mask.is_complete(automaton, states))
        return dict(
            **extra,
            step=step + 1,
            last=tokens,
            tokens=carry["tokens"].at[:, step].set(tokens),
            logprobs=carry["logprobs"].at[:, step].set(jnp.where(live, logprobs, 0.0)),
            plain=carry["plain"].at[:, step].set(jnp.where(live, plain, 0.0)),
            lengths=lengths,
            stopped=carry["stopped"] | hit_stop,
            done=carry["done"] | hit_stop | (lengths >= max_new_tokens),
            cache=cache,
        )

    def keep_going(carry):
        return (carry["step"] < last_step) & ~jnp.all(carry["done"])

    # Modules with a quantised copy of their weights read it in these steps only.
    with quantization.decode_step():
        return jax.lax.while_loop(keep_going, step_once, carry)


def decode_rows(
    graphdef,
    state,
    cache: kv_cache.KVCache,
    layout: batching.BatchLayout,
    settings: settings_lib.DecodeSettings,
    rooms: Sequence[int],
    config,
) -> dict:
    """Decodes every row from its prefilled cache, one `_decode` call per cache length.

    The cache starts with W + rooms[0] slots and grows to W + rooms[i] before segment i,
    only while some row is not done (`batching.cache_rooms`).

    Args:
      graphdef: the model's static graph definition.
      state: the model's state (parameters).
      cache: the prefilled KVCache (`_prefill_rows`).
      layout: the call's layout.
      settings: the call's `DecodeSettings`.
      rooms: the new-token room of each cache length; the last is the buffer size N.
      config: the model's config; its `vocab_size` V sizes the seen-token mask (with a
        penalty).

    Returns:
      The final carry (see `_start`).
    """
    width = layout.input_ids.shape[1]
    penalty_inputs = {}
    if settings.repetition_penalty is not None:
        penalty_inputs = {
            name: jnp.asarray(getattr(layout, field))
            for name, field in (
                ("prompt_ids", "input_ids"),
                ("prompt_mask", "mask"),
                ("row_source", "row_source"),
            )
        }
    # Without a penalty the carry has no seen-token mask and the decode program none;
    # without an automaton, no states.
    carry = _start(
        cache,
        jnp.asarray(layout.last_tokens),
        jnp.asarray(layout.active),
        **penalty_inputs,
        states=settings.starts,
        buffer_len=rooms[-1],
        vocab_size=config.vocab_size,
    )
    runtime.CALLS["decode"] += 1
    for segment, room in enumerate(rooms):
        if segment:
            if bool(jnp.all(carry["done"])):
                break
            carry = _grow(carry, cache_len=width + room)
        runtime.CALLS["decode_segments"] += 1
        carry = _decode(graphdef, state, carry, settings)
    _log.debug("decoded %d rows over %d cache lengths", layout.num_rows, segment + 1)
    return carry
