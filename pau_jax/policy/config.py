"""Sampling settings of a policy's replies (`SamplingConfig`) and the prefix cache's default budget.

Importing this module does not import JAX.
"""

import dataclasses
import math

# GiB for the keys and values of earlier prompts and replies of a local sampler
# (`pau_jax.sampling.prefix_cache`): the default of every setting that sizes one
# (`backends.LocalBackendConfig`, `rl.rollout.RolloutConfig`, `rl.critic.CriticConfig`,
# `training.run.Run.base_policy`); `backends.prefix_cache(gib)` builds it, 0 turns it off.
DEFAULT_PREFIX_CACHE_GIB = 2.0

# Weights a local sampler's decode steps read (`pau_jax.models.quantization`): 'float32', or
# 'q8' (an 8-bit copy, int8 in blocks of 32 with a scale each, read by decode steps only; the
# prefill, the learner and LoRA keep float32). The same names as `quantization.DECODE_WEIGHTS`.
DECODE_WEIGHTS = ("float32", "q8")


def check_decode_weights(owner: str, value: str) -> None:
    """Raises a one-line ValueError unless ``value`` (``<owner>.decode_weights``) is known."""
    if value not in DECODE_WEIGHTS:
        raise ValueError(f"{owner}.decode_weights must be one of {DECODE_WEIGHTS}, got {value!r}")


# `SamplingConfig.structured`: structured decoding of the agent's replies (off: the paper).
STRUCTURED = ("off", "end_at_answer", "constrain_inputs", "typed_inputs")


def check_prefix_cache_gib(owner: str, gib: float) -> None:
    """Raises a one-line ValueError unless ``gib`` (``<owner>.prefix_cache_gib``) is >= 0."""
    if not gib >= 0:
        raise ValueError(
            f"{owner}.prefix_cache_gib must be >= 0 GiB (0 turns the prefix cache off), got {gib}"
        )


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
      structured: structured decoding, for the phases the episode runner names
        (`env.answer_shape.answer_shape`); a local policy only. 'off' (default, the paper:
        format errors are counted); 'end_at_answer': a revision reply ends with the
        token that completes its first `Decision: CONTINUE|STOP` label (the parser reads
        the same decision unless a reply holds several); 'constrain_inputs': that, and
        an input reply is masked, token by token, to a fenced Python literal tuple of
        the function's arity (`sampling.input_grammar`), ending with its closing fence;
        'typed_inputs': as 'constrain_inputs', each argument also shaped like the values
        at its position in the shown examples (`env.input_example.argument_shapes`: an
        int stays an int, a list of str a list of str). Not with `enable_thinking`.
      resample_repeats: up to this many more draws for an input reply whose arguments
        repeat a shown example or an earlier call (`env.answer_shape.AnswerShape.repeats`), each
        at `resample_temperature` (a greedy policy would repeat itself); the last draw is
        kept. 0 (default, the paper): none. A local policy only; evaluation only.
      resample_temperature: the temperature of those draws (> 0).
    """

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_prompt_tokens: int | None = None
    seed: int = 0
    enable_thinking: bool = False
    structured: str = "off"
    resample_repeats: int = 0
    resample_temperature: float = 1.0

    def __post_init__(self):
        if self.resample_repeats < 0 or not self.resample_temperature > 0:
            raise ValueError(
                "resample_repeats must be >= 0 and resample_temperature > 0, got "
                f"{self.resample_repeats} and {self.resample_temperature}"
            )
        if self.structured not in STRUCTURED:
            raise ValueError(f"structured must be one of {STRUCTURED}, got {self.structured!r}")
        if self.structured != "off" and self.enable_thinking:
            raise ValueError(
                "structured decoding does not read thinking: set structured='off' or "
                "enable_thinking=False"
            )
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(
                f"repetition_penalty must be finite and > 0 (1.0 means none), "
                f"got {self.repetition_penalty}"
            )
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(
                f"max_prompt_tokens must be None (no limit) or >= 1, got {self.max_prompt_tokens}"
            )
