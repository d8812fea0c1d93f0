"""The record returned by generation and the host-side cut at stop strings."""

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class SampleOutput:
    """Generated continuations, one row per sample, prompt-major (prompt i, sample g: i*G + g).

    Attributes:
      tokens: per row, the generated ids, including the stop token that ended the row.
      logprobs: per row, [n] float32 log-prob of each token under the distribution it was
        drawn from (after temperature, top-k and top-p; 0 for greedy rows).
      plain_logprobs: per row, [n] float32 log_softmax(logits / T) at each token (T = 1 for
        greedy rows), under the automaton's mask if any, without the penalty: what a
        learner scoring the tokens at temperature T (with the same masks) computes.
      lengths: [R] int number of generated tokens per row.
      finish_reasons: per row, "stop" (a stop token or stop string) or "length".
      texts: per row, the decoded text cut before the first stop string; None when no
        decode function was given.
      num_prefilled: how many distinct prompts were prefilled.
      prefill_seconds: wall time of the prefill (including any compilation).
      decode_seconds: wall time of the decode loop (including any compilation).
      prefill_tokens: prompt tokens the prefill computed (distinct prompts, all but their
        last token, padding excluded).
      reused_tokens: prompt tokens whose keys and values came from a prefix cache.
      states: with an automaton, per row [n] int32 each token's automaton state before it
        was drawn (`token_mask.effective_masks` gives the token's mask); else None.
    """

    tokens: list[list[int]]
    logprobs: list[np.ndarray]
    plain_logprobs: list[np.ndarray]
    lengths: np.ndarray
    finish_reasons: list[str]
    texts: list[str] | None
    num_prefilled: int
    prefill_seconds: float
    decode_seconds: float
    prefill_tokens: int = 0
    reused_tokens: int = 0
    states: list[np.ndarray] | None = None

    def padded_tokens(self, pad_id: int = 0) -> np.ndarray:
        """Returns the tokens as an [R, max(lengths)] int32 array padded with `pad_id`."""
        out = np.full((len(self.tokens), int(self.lengths.max(initial=0))), pad_id, np.int32)
        for row, ids in enumerate(self.tokens):
            out[row, : len(ids)] = ids
        return out


def stop_position(text: str, stop_strings: Sequence[str]) -> int:
    """Where the first of `stop_strings` starts in `text`; -1 when none occurs."""
    hits = [text.find(s) for s in stop_strings if s in text]
    return min(hits) if hits else -1


def cut_at_stop_string(
    tokens: Sequence[int], decode: Callable[[Sequence[int]], str], stop_strings: Sequence[str]
) -> tuple[int, str, bool]:
    """Finds the shortest token prefix whose text contains a stop string.

    Assumes containment is monotone in the prefix length (true for ordinary detokenisers),
    and finds the prefix by bisection with O(log n) decode calls.

    Args:
      tokens: generated ids of one row.
      decode: maps ids to text.
      stop_strings: strings that end generation.

    Returns:
      (number of tokens kept, text before the first stop string, whether one was found).
    """

    text = decode(tokens)
    if not stop_strings or stop_position(text, stop_strings) < 0:
        return len(tokens), text, False
    lo, hi = 0, len(tokens)  # decode(tokens[:lo]) has no stop string, tokens[:hi] has one.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if stop_position(decode(tokens[:mid]), stop_strings) >= 0:
            hi = mid
        else:
            lo = mid
    text = decode(tokens[:hi])
    return hi, text[: stop_position(text, stop_strings)], True
