"""The settings of one `generate` call: argument checks, per-row values, `DecodeSettings`."""

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pau_jax.sampling import batching, constraint

MAX_STOP_IDS = 8


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeSettings:
    """The settings of one call's decode loop: device arrays, and one static size.

    A pytree: the arrays are leaves, `max_top_k` is part of the tree structure (a new
    value compiles a new decode program), and so is whether `repetition_penalty` is None.

    Attributes:
      width: int32 scalar W, the prefilled width (slot of step 0, `batching.BatchLayout`).
      prompt_lens: [B] prompt lengths.
      temperature: [B] float32, 0 for greedy.
      top_k: [B] int32, 0 for no limit.
      top_p: [B] float32 nucleus mass, 1 for no limit.
      stop_ids: [MAX_STOP_IDS] int32 stop ids, padded with -1.
      max_new_tokens: int32 scalar budget (<= N).
      uniforms: [B, N, 2] float32 uniforms in [0, 1), the randomness of each draw.
      repetition_penalty: [B] float32 per-row penalty, or None for none (a separate
        compiled program: without it the carry has no seen-token mask).
      automaton: a `constraint.TokenAutomaton` on the device whose mask applies to every
        row's logits before sampling (rows in its `free` state are unchanged) and whose
        completion ends a row, or None for none (a separate compiled program, the carry
        without automaton states).
      starts: [B] int32 each row's first automaton state, with an automaton only.
      max_top_k: static candidate-set size of top-k and top-p.
    """

    width: jax.Array
    prompt_lens: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    stop_ids: jax.Array
    max_new_tokens: jax.Array
    uniforms: jax.Array
    repetition_penalty: jax.Array | None = None
    automaton: constraint.TokenAutomaton | None = None
    starts: jax.Array | None = None
    max_top_k: int = dataclasses.field(metadata=dict(static=True))


def check_arguments(max_new_tokens, n_samples, stop_token_ids, stop_strings, decode) -> None:
    """Raises a one-line ValueError on a bad budget, group size or stop setting."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if len(stop_token_ids) > MAX_STOP_IDS:
        raise ValueError(f"at most {MAX_STOP_IDS} stop_token_ids, got {len(stop_token_ids)}")
    if stop_strings and decode is None:
        raise ValueError("stop_strings need a decode function; pass decode=tokenizer.decode")


def checked_prompts(prompts, prompt_mask, vocab_size: int) -> list[list[int]]:
    """The prompts as token-id lists (`batching.prompts_as_lists`), every id in the vocabulary.

    Raises a one-line ValueError when a prompt holds an id outside [0, `vocab_size`).
    """
    prompt_lists = batching.prompts_as_lists(prompts, prompt_mask)
    for i, prompt in enumerate(prompt_lists):
        if prompt and not 0 <= min(prompt) <= max(prompt) < vocab_size:
            raise ValueError(f"prompt {i} has ids outside [0, {vocab_size})")
    return prompt_lists


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


def per_row_settings(
    num_prompts: int, n_samples: int, max_top_k: int, *, temperature, top_k, top_p,
    repetition_penalty,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The sampling settings with one checked value per row ([P * G] each).

    Args:
      num_prompts: P.
      n_samples: G.
      max_top_k: the largest top_k allowed.
      temperature, top_k, top_p, repetition_penalty: each a scalar, [P] or [P * G] (as
        `generate` takes them).

    Returns:
      The four settings by name, one value per row.
    """
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
    return dict(
        temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty
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


def decode_settings(
    layout: batching.BatchLayout,
    per_row: dict[str, np.ndarray],
    *,
    stop_token_ids: Sequence[int],
    max_new_tokens: int,
    seed: int,
    buffer_len: int,
    max_top_k: int,
    automaton: constraint.TokenAutomaton | None = None,
    starts: np.ndarray | None = None,
) -> DecodeSettings:
    """The `DecodeSettings` of a call: per-row settings padded to the B bucketed rows.

    The repetition penalty is left out (None) when no row has one, so the decode program
    without a seen-token mask runs. `starts` has one state per row ([P * G]); padding rows
    start `free`.
    """
    rows = len(layout.row_source)
    stop_ids = np.full(MAX_STOP_IDS, -1, np.int32)
    stop_ids[: len(stop_token_ids)] = stop_token_ids
    penalty = per_row["repetition_penalty"]
    return DecodeSettings(
        width=jnp.int32(layout.input_ids.shape[1]),
        prompt_lens=jnp.asarray(layout.prompt_lens),
        temperature=jnp.asarray(_padded(per_row["temperature"], rows, 0.0)),
        top_k=jnp.asarray(_padded(per_row["top_k"], rows, 0)),
        top_p=jnp.asarray(_padded(per_row["top_p"], rows, 1.0)),
        stop_ids=jnp.asarray(stop_ids),
        max_new_tokens=jnp.int32(max_new_tokens),
        uniforms=jnp.asarray(_uniforms(seed, rows, buffer_len)),
        repetition_penalty=(
            jnp.asarray(_padded(penalty, rows, 1.0)) if (penalty != 1.0).any() else None
        ),
        # A no-op for `constraint.build_components`' automata, which are on the device.
        automaton=None if automaton is None else jax.device_put(automaton),
        starts=(None if automaton is None else jnp.asarray(_padded(starts, rows, automaton.free))),
        max_top_k=max_top_k,
    )


def automaton_starts(automaton, starts, num_prompts: int, n_samples: int) -> np.ndarray | None:
    """Each row's first automaton state ([P * G] int32), checked; None without an automaton.

    `starts`: None (every row starts at `automaton.start`), a scalar, [P] or [P * G]; each
    one of `automaton.starts` or `automaton.free` (unconstrained).
    """
    if automaton is None:
        if starts is not None:
            raise ValueError("automaton_starts without an automaton; pass automaton= too")
        return None
    if starts is None:
        starts = automaton.start
    rows = _per_row(starts, "automaton_starts", num_prompts, n_samples, np.int32)
    valid = (*automaton.starts, automaton.free)
    if not np.isin(rows, valid).all():
        raise ValueError(
            f"automaton_starts must each be one of the automaton's starts or its free state "
            f"{valid}, got {sorted(set(rows.tolist()) - set(valid))}"
        )
    return rows
