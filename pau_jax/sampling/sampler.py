"""`generate`: batched sampling of token-id prompts over a KV cache, and the assembly of its output.

The model is split once per call into a static graph definition and its state (base
weights and any LoRA adapters, never merged); the jitted programs take the state as an
argument, so new weights never recompile. A call runs two parts: the prefill
(`prefill.prefill_rows`) caches each distinct prompt but its last token, whole or after a
prefix reused from a `PrefixCache`, and copies it to the prompt's G sample rows; the decode
(`decode_loop.decode_rows`) feeds one token per row per step (first the last prompt token) and
stops when every row has hit a stop token or the token budget. `batching.BatchLayout` states
the slot layout of the cache; the host then cuts the buffers into rows (`_assemble`),
applying stop strings.

A model placed on a mesh (``parallel.shard_model``, usually in the sampler layout) is
sampled under that mesh: rows are split over the ``batch`` mesh axes and the cache over
the key/value heads where the sizes divide (``sharding.constrain``); otherwise replicated.
"""

import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pau_jax.models import sharding
from pau_jax.sampling import (
    batching,
    constraint,
    decode_loop,
    output,
    prefill,
    prefix_reuse,
    runtime,
)
from pau_jax.sampling import prefix_cache as prefix_cache_lib
from pau_jax.sampling import settings as settings_lib

_log = logging.getLogger(__name__)


def trace_counts() -> dict[str, int]:
    """How many times the prefill, decode and prefix-gather functions were traced so far."""
    return dict(runtime.TRACES) | prefix_reuse.trace_counts()


def call_counts() -> dict[str, int]:
    """Prefill and decode calls so far, and the prompt rows prefilled (counted on the host)."""
    return dict(runtime.CALLS)


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
      `plain_logprobs` are log_softmax(logits / T) of the raw logits, masked by the
      automaton (not penalised): what a learner computes, given each token's mask
      (`states`, `token_mask.effective_masks`).
    """
    settings_lib.check_arguments(max_new_tokens, n_samples, stop_token_ids, stop_strings, decode)
    prompt_lists = settings_lib.checked_prompts(prompts, prompt_mask, model.config.vocab_size)
    per_row = settings_lib.per_row_settings(
        len(prompt_lists), n_samples, max_top_k, temperature=temperature, top_k=top_k,
        top_p=top_p, repetition_penalty=repetition_penalty,
    )  # fmt: skip
    starts = _automaton_starts(automaton, automaton_starts, prompt_lists, n_samples, model)
    layout = batching.layout_batch(prompt_lists, n_samples)
    buffer_len = batching.bucket_size(max_new_tokens, **batching.NEW_TOKENS_BUCKET)
    rooms = batching.cache_rooms(layout.input_ids.shape[1], buffer_len)
    _log.debug(
        "generate: %d prompts x %d samples, width %d, cache rooms %s",
        len(prompt_lists), n_samples, layout.input_ids.shape[1], rooms,
    )  # fmt: skip
    graphdef, state = nnx.split(model)
    cache_dtype = jnp.dtype(model.dtype if cache_dtype is None else cache_dtype)
    mesh = sharding.mesh_of(state)  # its activation and cache constraints apply under it
    prefix_cache = prefill.usable_prefix_cache(prefix_cache, mesh)
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        cache, stats = prefill.prefill_rows(
            graphdef, state, layout, prefix_cache, rooms[0], cache_dtype
        )
        start = time.perf_counter()
        settings = settings_lib.decode_settings(
            layout, per_row, stop_token_ids=stop_token_ids, max_new_tokens=max_new_tokens,
            seed=seed, buffer_len=buffer_len, max_top_k=max_top_k, automaton=automaton,
            starts=starts,
        )  # fmt: skip
        carry = decode_loop.decode_rows(
            graphdef, state, cache, layout, settings, rooms, model.config
        )
        results = [carry[k] for k in ("tokens", "logprobs", "plain", "lengths", "stopped")]
    tokens, logprobs, plain, lengths, stopped = (np.asarray(x) for x in results)
    stats["decode_seconds"] = time.perf_counter() - start
    if prefix_cache is not None:
        prefix_cache.store_rows(carry["cache"], layout, tokens, lengths)
    trace = np.asarray(carry["trace"]) if automaton is not None else None
    del carry, cache, results  # freed before the heap's free pages go back to the OS
    runtime.release_freed_memory()
    return _assemble(
        tokens, logprobs, plain, lengths, stopped, layout, decode, stop_strings, trace, **stats
    )


def _automaton_starts(automaton, starts, prompt_lists, n_samples: int, model):
    """Each row's first automaton state (`settings.automaton_starts`), the vocabulary checked."""
    vocab_size = model.config.vocab_size
    if automaton is not None and automaton.vocab_size != vocab_size:
        raise ValueError(
            f"the automaton covers {automaton.vocab_size} tokens, the model "
            f"{vocab_size}; build it with vocab_size=model.config.vocab_size"
        )
    return settings_lib.automaton_starts(automaton, starts, len(prompt_lists), n_samples)


def _assemble(
    tokens, logprobs, plain, lengths, stopped, layout, decode, stop_strings, trace, **timings
) -> output.SampleOutput:
    """Cuts the device buffers into per-row results, applying stop strings on the host.

    ``trace`` [B, N]: each token's automaton state (with an automaton), else None.
    """
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
        states=None if trace is None else [trace[r, :n].copy() for r, n in enumerate(out_lengths)],
        **timings,
    )
