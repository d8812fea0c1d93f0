"""Batched generation over a KV cache: a jitted prefill and a jitted `lax.while_loop` decode.

The model is split once per call into a static graph definition and its state (base
weights and any LoRA adapters, never merged); both jitted functions take the state as an
argument, so new weights never recompile. The prefill caches each distinct prompt but its last
token, computing no logits, and copies the cache to the prompt's G sample rows; the decode
loop feeds one token per row per step (first the last prompt token), writes one cache
slot in place (the cache is donated; the model state is not, since the caller keeps the
model) and stops when every row has hit a stop token or the token budget.

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
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pau_jax.models import kv_cache, sharding
from pau_jax.sampling import batching, logits, output
from pau_jax.sampling import prefix_cache as prefix_cache_lib

_TRACES: collections.Counter = collections.Counter()
_CALLS: collections.Counter = collections.Counter()
MAX_STOP_IDS = 8
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
      KVCache with B rows of S slots, slots [0, W) filled.
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

    The result has the layout of `_prefill` for the same prompts: prompt u's tokens but
    its last fill the slots up to W - 1, its reused prefix first, then the T-slot block of
    new tokens (left-padded), whose padding may lie over reused slots: only real new tokens
    are written (`Decoder.decode(..., overlay=True)`).

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
      buffer_len: N, size of the per-row output buffers.
      vocab_size: V, size of the seen-token mask (with a penalty).

    Returns:
      The carry dict: step, last, tokens/logprobs/plain [B, N], lengths, stopped, done,
      cache and, with a penalty, seen [B, V] (every id of the row's prompt, its last
      token included, padding excluded).
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
    static_argnames=("graphdef", "max_top_k"),
    donate_argnames=("carry",),
    compiler_options=_DECODE_COMPILER_OPTIONS,
)
def _decode(
    graphdef,
    state,
    carry,
    width,
    prompt_lens,
    temperature,
    top_k,
    top_p,
    stop_ids,
    max_new_tokens,
    uniforms,
    repetition_penalty=None,
    *,
    max_top_k,
):
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
      width: int32 scalar W, the prefilled width (slot of step 0).
      prompt_lens: [B] prompt lengths.
      temperature, top_k, top_p: [B] per-row sampling settings.
      stop_ids: [MAX_STOP_IDS] int32 stop ids, padded with -1.
      max_new_tokens: int32 scalar budget (<= N).
      uniforms: [B, N, 2] float32 uniforms in [0, 1), the randomness of each draw.
      repetition_penalty: [B] float32 per-row penalty, or None for none (a separate
        compiled program: without it the carry has no seen-token mask).
      max_top_k: static candidate-set size.

    Returns:
      The carry after the last step taken.
    """
    _TRACES["decode"] += 1
    model = nnx.merge(graphdef, state)
    penalise = repetition_penalty is not None
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
        tokens, logprobs, plain = logits.sample_tokens(
            scores,
            jax.lax.dynamic_index_in_dim(uniforms, step, axis=1, keepdims=False),
            temperature,
            top_k,
            top_p,
            max_top_k=max_top_k,
            plain_logits=raw if penalise else None,
        )
        live = ~carry["done"]
        tokens = jnp.where(live, tokens, 0)
        hit_stop = live & jnp.any(tokens[:, None] == stop_ids[None, :], axis=-1)
        lengths = carry["lengths"] + live
        extra = dict(seen=logits.mark_seen(carry["seen"], tokens)) if penalise else {}
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


def _per_row(value, name: str, num_prompts: int, n_samples: int, dtype) -> np.ndarray:
    """Expands a scalar, per-prompt or per-row setting to one value per row."""
    arr = np.asarray(value, dtype)
    if arr.ndim == 0:
        return np.full(num_prompts * n_samples, arr, dtype)
    if arr.shape == (num_prompts,):
        return np.repeat(arr, n_samples)
    if arr.shape == (num_prompts * n_samples,):
        return arr
    raise ValueError(
        f"{name} must be a scalar or have {num_prompts} (per prompt) or "
        f"{num_prompts * n_samples} (per row) values, got shape {arr.shape}"
    )


def _uniforms(seed: int, rows: int, steps: int) -> np.ndarray:
    """[rows, steps, 2] float32 uniforms in [0, 1); row r comes from default_rng((seed, r))."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return np.stack(
        [np.random.default_rng((seed, r)).random((steps, 2), np.float32) for r in range(rows)]
    )


def _padded(values: np.ndarray, rows: int, fill) -> np.ndarray:
    """Pads a per-row array to the bucketed row count."""
    out = np.full(rows, fill, values.dtype)
    out[: len(values)] = values
    return out


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
) -> output.SampleOutput:
    """Samples continuations of token-id prompts.

    Args:
      model: a decoder with `decode(...)` and `config` (e.g. `qwen3.Qwen3ForCausalLM`),
        with or without LoRA adapters.
      prompts: P token-id lists (any lengths), or a [P, T] integer array with `prompt_mask`.
      max_new_tokens: budget of generated tokens per row.
      temperature: 0 for greedy, else the softmax temperature; scalar, [P] or [P * G].
      top_k: 0 for no limit, else keep the k most probable tokens (k <= `max_top_k`);
        scalar, [P] or [P * G].
      top_p: nucleus mass in (0, 1]; 1 for no limit; scalar, [P] or [P * G].
      repetition_penalty: > 0; 1 for none; scalar, [P] or [P * G]. As Hugging Face's
        `repetition_penalty`: every id in the row's prompt (padding excluded) or among its
        tokens so far has its logit divided by the penalty if positive, else multiplied,
        before temperature, top-k and top-p; greedy rows take the argmax of the penalised
        logits. With any row's penalty != 1, a second decode program runs that carries a
        [B, V] seen-token mask; otherwise nothing changes.
      stop_token_ids: ids that end a row (kept as the row's last token).
      n_samples: G, samples per prompt; each distinct prompt is prefilled once.
      seed: seed of the draws; row r draws from numpy's default_rng((seed, r)), so its
        samples do not depend on the other rows or the bucket sizes.
      prompt_mask: with an array `prompts`, [P, T] with 1 on real tokens.
      stop_strings: strings that end a row, found on the host with `decode`.
      decode: maps token ids to text; needed for `stop_strings`, and fills `texts`.
      max_top_k: static candidate-set size for top-k and top-p.
      cache_dtype: dtype of the KV cache; defaults to the model's parameter dtype.
      prefix_cache: a `PrefixCache` to reuse and fill: a prompt that starts with a cached
        sequence (at least `min_reuse` tokens) is prefilled only after it, and every row's
        prompt and reply are added to it. The cache empties itself when the model's weights
        or the cache dtype differ from those it was filled with. Not used under a device
        mesh (the prompts are then prefilled whole).

    Returns:
      A `SampleOutput` with P * G rows, prompt-major. With a penalty, `logprobs` are those
      of the penalised distribution the tokens were drawn from, while `plain_logprobs`
      stay log_softmax(logits / T) of the model's raw logits (what a learner computes).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if len(stop_token_ids) > MAX_STOP_IDS:
        raise ValueError(f"at most {MAX_STOP_IDS} stop_token_ids, got {len(stop_token_ids)}")
    if stop_strings and decode is None:
        raise ValueError("stop_strings need a decode function; pass decode=tokenizer.decode")
    prompt_lists = batching.prompts_as_lists(prompts, prompt_mask)
    config = model.config
    for i, prompt in enumerate(prompt_lists):
        if prompt and not 0 <= min(prompt) <= max(prompt) < config.vocab_size:
            raise ValueError(f"prompt {i} has ids outside [0, {config.vocab_size})")
    num_prompts = len(prompt_lists)
    temperature = _per_row(temperature, "temperature", num_prompts, n_samples, np.float32)
    top_k = _per_row(top_k, "top_k", num_prompts, n_samples, np.int32)
    top_p = _per_row(top_p, "top_p", num_prompts, n_samples, np.float32)
    if (temperature < 0).any() or not np.isfinite(temperature).all():
        raise ValueError("temperature must be finite and >= 0 (0 means greedy)")
    if (top_k < 0).any() or (top_k > max_top_k).any():
        raise ValueError(f"top_k must be in [0, max_top_k={max_top_k}]; raise max_top_k")
    if not ((top_p > 0) & (top_p <= 1)).all():
        raise ValueError("top_p must be in (0, 1]")
    repetition_penalty = _per_row(
        repetition_penalty, "repetition_penalty", num_prompts, n_samples, np.float32
    )
    if not (np.isfinite(repetition_penalty) & (repetition_penalty > 0)).all():
        raise ValueError("repetition_penalty must be finite and > 0 (1.0 means no penalty)")
    penalise = bool((repetition_penalty != 1.0).any())

    layout = batching.layout_batch(prompt_lists, n_samples)
    rows = len(layout.row_source)
    width = layout.input_ids.shape[1]
    buffer_len = batching.bucket_size(max_new_tokens, **batching.NEW_TOKENS_BUCKET)
    rooms = batching.cache_rooms(width, buffer_len)
    graphdef, state = nnx.split(model)
    if cache_dtype is None:
        cache_dtype = model.dtype

    # Under the model's mesh (if any), so the activation and cache constraints apply.
    mesh = sharding.mesh_of(state)
    if mesh is not None:
        prefix_cache = None
    distinct = layout.prompts
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        start = time.perf_counter()
        reuse = None
        if prefix_cache is not None:
            prefix_cache.bind(state, jnp.dtype(cache_dtype))
            reuse = prefix_cache_lib.plan_reuse(prefix_cache, distinct, layout)
        _CALLS["prefill"] += 1
        _CALLS["prefill_rows"] += layout.input_ids.shape[0]
        input_ids = jnp.asarray(layout.input_ids)
        mask = jnp.asarray(layout.mask)
        row_source = jnp.asarray(layout.row_source)
        if reuse is None:
            prefill_tokens, reused_tokens = sum(len(p) - 1 for p in distinct), 0
            cache = _prefill(
                graphdef,
                state,
                input_ids,
                mask,
                None if layout.rows_are_prompts else row_source,
                cache_len=width + rooms[0],
                cache_dtype=jnp.dtype(cache_dtype),
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
                None if layout.rows_are_prompts else row_source,
                cache_len=width + rooms[0],
            )
        jax.block_until_ready(cache)
        prefilled = time.perf_counter()
        _CALLS["prefill_tokens"] += prefill_tokens
        _CALLS["reused_tokens"] += reused_tokens
        stop_ids = np.full(MAX_STOP_IDS, -1, np.int32)
        stop_ids[: len(stop_token_ids)] = stop_token_ids
        # Without a penalty the carry has no seen-token mask and the decode program none.
        carry = _start(
            cache,
            jnp.asarray(layout.last_tokens),
            jnp.asarray(layout.active),
            *((input_ids, mask, row_source) if penalise else ()),
            buffer_len=buffer_len,
            vocab_size=config.vocab_size,
        )
        settings = (
            jnp.int32(width),
            jnp.asarray(layout.prompt_lens),
            jnp.asarray(_padded(temperature, rows, 0.0)),
            jnp.asarray(_padded(top_k, rows, 0)),
            jnp.asarray(_padded(top_p, rows, 1.0)),
            jnp.asarray(stop_ids),
            jnp.int32(max_new_tokens),
            jnp.asarray(_uniforms(seed, rows, buffer_len)),
            *((jnp.asarray(_padded(repetition_penalty, rows, 1.0)),) if penalise else ()),
        )
        _CALLS["decode"] += 1
        # One decode call per cache length: the cache grows only while some row needs it.
        for segment, room in enumerate(rooms):
            if segment:
                if bool(jnp.all(carry["done"])):
                    break
                carry = _grow(carry, cache_len=width + room)
            _CALLS["decode_segments"] += 1
            carry = _decode(graphdef, state, carry, *settings, max_top_k=max_top_k)
        results = [carry[k] for k in ("tokens", "logprobs", "plain", "lengths", "stopped")]
    tokens, logprobs, plain, lengths, stopped = (np.asarray(x) for x in results)
    decoded = time.perf_counter()
    if prefix_cache is not None:
        prefix_cache_lib.store_rows(
            prefix_cache, carry["cache"], layout, distinct, width, tokens, lengths
        )
    return _assemble(
        tokens, logprobs, plain, lengths, stopped, layout, decode, stop_strings,
        prefill_seconds=prefilled - start, decode_seconds=decoded - prefilled,
        prefill_tokens=prefill_tokens, reused_tokens=reused_tokens,
    )  # fmt: skip


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
