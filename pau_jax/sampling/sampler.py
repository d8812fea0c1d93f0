"""Batched generation over a KV cache: a jitted prefill and a jitted `lax.while_loop` decode.

The model is split once per call into a static graph definition and its state (base
weights and any LoRA adapters, never merged); both jitted functions take the state as an
argument, so new weights never recompile. `generate` runs two parts: the prefill
(`_prefill_rows`) caches each distinct prompt but its last token, computing no logits, either
whole or after a prefix reused from a `PrefixCache`, and copies the cache to the prompt's G
sample rows; the decode (`_decode_rows`) feeds one token per row per step (first the last
prompt token), writes one cache slot in place (the cache is donated; the model state is
not, since the caller keeps the model) and stops when every row has hit a stop token or
the token budget, growing the cache between segments. `batching.BatchLayout` states the
slot layout of the cache.

A repetition penalty (Hugging Face's `repetition_penalty`) adds a [B, V] bool "seen" mask
to the decode carry: built once from the prompts (padding excluded), marked with each new
token, and applied to the logits before temperature/top-k/top-p. It exists only in a
second compiled decode program, used when some row's penalty is not 1, so calls without
a penalty do no extra work per step.

A model placed on a mesh (``parallel.shard_model``, usually in the sampler layout) is
sampled under that mesh: rows are split over the ``batch`` mesh axes and the cache over
the key/value heads where the sizes divide (``sharding.constrain``); otherwise replicated.
"""

import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pau_jax.models import kv_cache, sharding
from pau_jax.sampling import batching, constraint, logits, output
from pau_jax.sampling import prefix_cache as prefix_cache_lib
from pau_jax.sampling import settings as settings_lib

_log = logging.getLogger(__name__)
_TRACES: collections.Counter = collections.Counter()
_CALLS: collections.Counter = collections.Counter()
# Each step reads every layer's cache (attention over the earlier slots) and then writes one
# slot of it in place. XLA's CPU copy insertion cannot order the two inside the while loop
# without its region analysis and copies every cache array twice per step; the option is a
# DebugOptions field, so other backends accept and ignore it.
_DECODE_COMPILER_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}
# Logical axes of the cached keys [B, K, S, H] and values [B, K, H, S].
_KEY_AXES = ("batch", "act_kv_heads", "length", None)
_VALUE_AXES = ("batch", "act_kv_heads", None, "length")


def trace_counts() -> dict[str, int]:
    """How many times the prefill, decode and prefix-gather functions were traced so far."""
    return dict(_TRACES) | prefix_cache_lib.trace_counts()


def call_counts() -> dict[str, int]:
    """Prefill and decode calls so far, and the prompt rows prefilled (counted on the host)."""
    return dict(_CALLS)


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_len", "cache_dtype"))
def _prefill(graphdef, state, input_ids, mask, row_source, *, cache_len, cache_dtype):
    """Caches the distinct prompts (all but their last token) and lays them out as decode rows.

    The last prompt token is left for the first decode step, so the prefill computes no
    logits at all and every decode step has the same shape.

    Args:
      graphdef: the model's static graph definition.
      state: the model's state (parameters).
      input_ids: [U, W] prompts without their last token, left-padded.
      mask: [U, W] 1 on those tokens.
      row_source: [B] prompt index of every decode row, or None when row b is prompt b
        (one sample per prompt and as many rows as prompts: nothing to copy).
      cache_len: S, cache slots (W plus the first decode segment's steps).
      cache_dtype: dtype of cached keys and values.

    Returns:
      KVCache with B rows of S slots, slots [0, W) filled (`batching.BatchLayout`).
    """
    _TRACES["prefill"] += 1
    model = nnx.merge(graphdef, state)
    cache = kv_cache.init_cache(model.config, input_ids.shape[0], cache_len, cache_dtype)
    positions = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
    _, cache = model.decode(
        input_ids,
        positions=positions,
        cache=cache,
        cache_index=jnp.int32(0),
        attention_mask=mask,
        last_only=True,
        cache_is_empty=True,
    )
    return _constrain_cache(_to_rows(cache, row_source))


def _to_rows(cache: kv_cache.KVCache, row_source) -> kv_cache.KVCache:
    """The cache of each decode row (a copy of its prompt's), or `cache` itself for None."""
    if row_source is None:
        return cache
    return jax.tree.map(lambda x: jnp.take(x, row_source, axis=0), cache)


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_len"))
def _prefill_extend(
    graphdef, state, prefix_k, prefix_v, prefix_mask, input_ids, mask, starts, row_source,
    *, cache_len,
):  # fmt: skip
    """Like `_prefill`, on top of cached prefixes: only the tokens after them are computed.

    The result has the slots of `_prefill` for the same prompts (`batching.BatchLayout`
    states where the reused prefix and the T-slot block of new tokens lie).

    Args:
      graphdef: the model's static graph definition.
      state: the model's state (parameters).
      prefix_k: L arrays [U, K, W, H], each prompt's reused prefix in its slots.
      prefix_v: L arrays [U, K, H, W], the same for values.
      prefix_mask: [U, W] bool, True on reused slots.
      input_ids: [U, T] the rest of each prompt but its last token, left-padded.
      mask: [U, T] 1 on those tokens.
      starts: [U] int32 length of each prompt's prefix (the position of its first new token).
      row_source: [B] prompt index of every decode row, or None (row b is prompt b).
      cache_len: S, cache slots (W plus the first decode segment's steps).

    Returns:
      KVCache with B rows of S slots, slots [0, W) filled as by `_prefill`.
    """
    _TRACES["prefill_extend"] += 1
    model = nnx.merge(graphdef, state)
    width = prefix_mask.shape[1]
    # The model runs on a cache of exactly the W prefill slots, so attention reads no empty
    # decode slot; the decode room is added afterwards.
    cache = kv_cache.KVCache(k=tuple(prefix_k), v=tuple(prefix_v), mask=prefix_mask)
    positions = starts[:, None] + jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
    _, cache = model.decode(
        input_ids,
        positions=positions,
        cache=cache,
        cache_index=jnp.int32(width - input_ids.shape[1]),
        attention_mask=mask,
        last_only=True,
        overlay=True,
    )
    return _constrain_cache(kv_cache.grow(_to_rows(cache, row_source), cache_len))


def _constrain_cache(cache: kv_cache.KVCache) -> kv_cache.KVCache:
    """Places the cache's rows over the batch mesh axes and its heads over tp (no-op off mesh)."""
    return kv_cache.KVCache(
        k=tuple(sharding.constrain(k, _KEY_AXES) for k in cache.k),
        v=tuple(sharding.constrain(v, _VALUE_AXES) for v in cache.v),
        mask=sharding.constrain(cache.mask, ("batch", "length")),
    )


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
      included, padding excluded), and with an automaton its states [B].
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
    _TRACES["grow"] += 1
    return dict(carry, cache=_constrain_cache(kv_cache.grow(carry["cache"], cache_len)))


@functools.partial(
    jax.jit,
    static_argnames=("graphdef",),
    donate_argnames=("carry",),
    compiler_options=_DECODE_COMPILER_OPTIONS,
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
    _TRACES["decode"] += 1
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
        if automaton is not None:
            remaining = max_new_tokens - carry["lengths"]
            scores = constraint.mask_logits(automaton, carry["states"], scores, remaining)
        tokens, logprobs, plain = logits.sample_tokens(
            scores,
            jax.lax.dynamic_index_in_dim(settings.uniforms, step, axis=1, keepdims=False),
            settings.temperature,
            settings.top_k,
            settings.top_p,
            max_top_k=settings.max_top_k,
            plain_logits=raw if penalise or automaton is not None else None,
        )
        live = ~carry["done"]
        tokens = jnp.where(live, tokens, 0)
        hit_stop = live & jnp.any(tokens[:, None] == stop_ids[None, :], axis=-1)
        lengths = carry["lengths"] + live
        extra = dict(seen=logits.mark_seen(carry["seen"], tokens)) if penalise else {}
        if automaton is not None:  # a row whose answer is complete ends with this token
            states = constraint.advance(automaton, carry["states"], tokens)
            extra["states"] = jnp.where(live, states, carry["states"])
            hit_stop = hit_stop | (live & constraint.is_complete(automaton, states))
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

    return jax.lax.while_loop(keep_going, step_once, carry)


def _usable_prefix_cache(prefix_cache, mesh):
    """`prefix_cache`, or None under a device mesh (logged), where prompts are prefilled whole."""
    if mesh is None or prefix_cache is None:
        return prefix_cache
    _log.info(
        "prefix cache off: the model is on a device mesh %s, so prompts are prefilled whole",
        dict(mesh.shape),
    )
    return None


def _prefill_rows(
    graphdef,
    state,
    layout: batching.BatchLayout,
    prefix_cache: prefix_cache_lib.PrefixCache | None,
    room: int,
    cache_dtype: jnp.dtype,
) -> tuple[kv_cache.KVCache, dict]:
    """The decode rows' cache with every prompt but its last token prefilled.

    With a `prefix_cache` that holds a prefix of some prompt, only the tokens after the
    cached prefixes are computed (`_prefill_extend`); otherwise the prompts are prefilled
    whole (`_prefill`). Both give the slots of `batching.BatchLayout`.

    Args:
      graphdef: the model's static graph definition.
      state: the model's state (parameters).
      layout: the call's layout.
      prefix_cache: a cache to reuse (bound to `state` and `cache_dtype` first), or None.
      room: the first decode segment's steps; the cache has S = W + room slots.
      cache_dtype: dtype of cached keys and values.

    Returns:
      (KVCache with B rows of S slots, the `SampleOutput` fields prefill_seconds,
      prefill_tokens and reused_tokens by name).
    """
    start = time.perf_counter()
    cache_len = layout.input_ids.shape[1] + room
    reuse = None
    if prefix_cache is not None:
        prefix_cache.bind(state, cache_dtype)
        reuse = prefix_cache.plan_reuse(layout)
    _CALLS["prefill"] += 1
    _CALLS["prefill_rows"] += layout.input_ids.shape[0]
    row_source = None if layout.rows_are_prompts else jnp.asarray(layout.row_source)
    if reuse is None:
        prefill_tokens, reused_tokens = sum(len(p) - 1 for p in layout.prompts), 0
        cache = _prefill(
            graphdef,
            state,
            jnp.asarray(layout.input_ids),
            jnp.asarray(layout.mask),
            row_source,
            cache_len=cache_len,
            cache_dtype=cache_dtype,
        )
    else:
        prefill_tokens, reused_tokens = int(reuse.suffix_mask.sum()), int(reuse.starts.sum())
        cache = _prefill_extend(
            graphdef,
            state,
            reuse.prefix_k,
            reuse.prefix_v,
            jnp.asarray(reuse.prefix_mask),
            jnp.asarray(reuse.suffix_ids),
            jnp.asarray(reuse.suffix_mask),
            jnp.asarray(reuse.starts),
            row_source,
            cache_len=cache_len,
        )
    jax.block_until_ready(cache)
    seconds = time.perf_counter() - start
    _CALLS["prefill_tokens"] += prefill_tokens
    _CALLS["reused_tokens"] += reused_tokens
    return cache, dict(
        prefill_seconds=seconds, prefill_tokens=prefill_tokens, reused_tokens=reused_tokens
    )


def _decode_rows(
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
    _CALLS["decode"] += 1
    for segment, room in enumerate(rooms):
        if segment:
            if bool(jnp.all(carry["done"])):
                break
            carry = _grow(carry, cache_len=width + room)
        _CALLS["decode_segments"] += 1
        carry = _decode(graphdef, state, carry, settings)
    return carry


def generate(
    model: nnx.Module,
    prompts,
    *,
    max_new_tokens: int,
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    repetition_penalty=1.0,
    stop_token_ids: Sequence[int] = (),
    n_samples: int = 1,
    seed: int = 0,
    prompt_mask=None,
    stop_strings: Sequence[str] = (),
    decode: Callable[[Sequence[int]], str] | None = None,
    max_top_k: int = 64,
    cache_dtype=None,
    prefix_cache: prefix_cache_lib.PrefixCache | None = None,
    automaton: constraint.TokenAutomaton | None = None,
    automaton_starts=None,
) -> output.SampleOutput:
    """Samples continuations of token-id prompts.

    Args:
      model: a decoder with `decode(...)` and `config` (e.g. `qwen3.Qwen3ForCausalLM`),
        with or without LoRA adapters.
      prompts: P token-id lists (any lengths), or a [P, T] integer array with `prompt_mask`.
      max_new_tokens: budget of generated tokens per row.
      temperature, top_k, top_p, repetition_penalty: each a scalar, [P] or [P * G].
        temperature: 0 for greedy. top_k: 0 for no limit, else at most `max_top_k`. top_p:
        nucleus mass in (0, 1]. repetition_penalty: > 0, 1 for none; as Hugging Face's,
        the logit of every id in the row's prompt (padding excluded) or tokens so far is
        divided by it if positive, else multiplied, before the others (a second decode
        program, which carries a [B, V] seen-token mask).
      stop_token_ids: ids that end a row (kept as the row's last token).
      n_samples: G, samples per prompt; each distinct prompt is prefilled once.
      seed: row r draws from numpy's default_rng((seed, r)), whatever the other rows and
        the buckets.
      prompt_mask: with an array `prompts`, [P, T] with 1 on real tokens.
      stop_strings: strings that end a row, found on the host with `decode`.
      decode: maps token ids to text; needed for `stop_strings`, and fills `texts`.
      max_top_k: static candidate-set size for top-k and top-p.
      cache_dtype: dtype of the KV cache; defaults to the model's parameter dtype.
      prefix_cache: a `PrefixCache` to reuse and fill with every row's prompt and reply;
        emptied when the weights or the cache dtype change; off under a device mesh (logged).
      automaton: a `constraint.TokenAutomaton` (structured decoding): each step, a row's
        logits are masked to the tokens its state allows (before the penalty's processed
        logits are sampled, after it is applied), and a row ends ("stop") with the token
        that completes its answer. None (the default) compiles the program without it.
      automaton_starts: each row's first state, one of `automaton.starts` or
        `automaton.free` (unconstrained): None (all `automaton.start`), a scalar, [P] or
        [P * G].

    Returns:
      A `SampleOutput` with P * G rows, prompt-major. With a penalty or an automaton,
      `logprobs` are those of the penalised and masked distribution drawn from;
      `plain_logprobs` stay log_softmax(logits / T) of the raw logits (what a learner
      computes).
    """
    settings_lib.check_arguments(max_new_tokens, n_samples, stop_token_ids, stop_strings, decode)
    prompt_lists = settings_lib.checked_prompts(prompts, prompt_mask, model.config.vocab_size)
    per_row = settings_lib.per_row_settings(
        len(prompt_lists), n_samples, max_top_k, temperature=temperature, top_k=top_k,
        top_p=top_p, repetition_penalty=repetition_penalty,
    )  # fmt: skip
    starts = settings_lib.automaton_starts(
        automaton, automaton_starts, len(prompt_lists), n_samples
    )
    if automaton is not None and automaton.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"the automaton covers {automaton.vocab_size} tokens, the model "
            f"{model.config.vocab_size}; build it with vocab_size=model.config.vocab_size"
        )
    layout = batching.layout_batch(prompt_lists, n_samples)
    buffer_len = batching.bucket_size(max_new_tokens, **batching.NEW_TOKENS_BUCKET)
    rooms = batching.cache_rooms(layout.input_ids.shape[1], buffer_len)
    graphdef, state = nnx.split(model)
    cache_dtype = jnp.dtype(model.dtype if cache_dtype is None else cache_dtype)

    # Under the model's mesh (if any), so the activation and cache constraints apply.
    mesh = sharding.mesh_of(state)
    prefix_cache = _usable_prefix_cache(prefix_cache, mesh)
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        cache, stats = _prefill_rows(graphdef, state, layout, prefix_cache, rooms[0], cache_dtype)
        start = time.perf_counter()
        settings = settings_lib.decode_settings(
            layout, per_row, stop_token_ids=stop_token_ids, max_new_tokens=max_new_tokens,
            seed=seed, buffer_len=buffer_len, max_top_k=max_top_k, automaton=automaton,
            starts=starts,
        )  # fmt: skip
        carry = _decode_rows(graphdef, state, cache, layout, settings, rooms, model.config)
        results = [carry[k] for k in ("tokens", "logprobs", "plain", "lengths", "stopped")]
    tokens, logprobs, plain, lengths, stopped = (np.asarray(x) for x in results)
    stats["decode_seconds"] = time.perf_counter() - start
    if prefix_cache is not None:
        prefix_cache.store_rows(carry["cache"], layout, tokens, lengths)
    return _assemble(
        tokens, logprobs, plain, lengths, stopped, layout, decode, stop_strings, **stats
    )


def _assemble(
    tokens, logprobs, plain, lengths, stopped, layout, decode, stop_strings, **timings
) -> output.SampleOutput:
    """Cuts the device buffers into per-row results, applying stop strings on the host."""
    out_tokens, out_logprobs, out_plain, out_lengths, reasons, texts = [], [], [], [], [], []
    for row in range(layout.num_rows):
        n = int(lengths[row])
        ids = tokens[row, :n].tolist()
        reason = "stop" if stopped[row] else "length"
        if decode is not None:
            n, text, cut = output.cut_at_stop_string(ids, decode, stop_strings)
            ids = ids[:n]
            reason = "stop" if cut else reason
            texts.append(text)
        out_tokens.append(ids)
        out_logprobs.append(logprobs[row, :n].copy())
        out_plain.append(plain[row, :n].copy())
        out_lengths.append(n)
        reasons.append(reason)
    return output.SampleOutput(
        tokens=out_tokens,
        logprobs=out_logprobs,
        plain_logprobs=out_plain,
        lengths=np.asarray(out_lengths, np.int64),
        finish_reasons=reasons,
        texts=texts if decode is not None else None,
        num_prefilled=layout.num_distinct,
        **timings,
    )
