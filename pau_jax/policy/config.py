"""Sampling settings of a policy's replies (`SamplingConfig`); importing this module does not import JAX."""

import dataclasses
import math


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How replies are sampled.

    Attributes:
      max_new_tokens: token budget of one reply.
      temperature: 0 for greedy.
      top_k: 0 for no limit.
      top_p: 1 for no limit.
      repetition_penalty: > 0; 1 for none. Hugging Face's `repetition_penalty`: the logit
        of every token in the prompt or the reply so far is divided by it if positive, else
        multiplied, before temperature/top-k/top-p (see `pau_jax.sampling.generate`).
      max_prompt_tokens: None for no limit; a conversation whose encoded prompt is longer
        is not sampled: its `Completion` has finish_reason 'prompt_length' and no tokens.
        This reproduces trainers that end a multi-turn episode once its prompt exceeds
        their maximum prompt length (the episode runner ends such episodes).
      seed: base seed; call n of a policy uses seed + n, so a run is reproducible.
      enable_thinking: passed to the chat template (Qwen3's thinking switch).
    """

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_prompt_tokens: int | None = None
    seed: int = 0
    enable_thinking: bool = False

    def __post_init__(self):
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(
                f"repetition_penalty must be finite and > 0 (1.0 means none), "
                f"got {self.repetition_penalty}"
            )
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(
                f"max_prompt_tokens must be None (no limit) or >= 1, got {self.max_prompt_tokens}"
            )
