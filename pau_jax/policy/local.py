"""A policy backed by the JAX sampler over a local model and its tokenizer."""

import dataclasses
from collections.abc import Sequence

import numpy as np

from pau_jax.sampling import generate


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How replies are sampled.

    Attributes:
      max_new_tokens: token budget of one reply.
      temperature: 0 for greedy.
      top_k: 0 for no limit.
      top_p: 1 for no limit.
      seed: base seed; call n of a policy uses seed + n, so a run is reproducible.
      enable_thinking: passed to the chat template (Qwen3's thinking switch).
    """

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    enable_thinking: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Completion:
    """One reply: its text, why it ended ('stop' or 'length'), token counts and the tokens.

    Attributes:
      text: the reply decoded without special tokens.
      finish_reason: 'stop' (a stop token) or 'length' (the token budget).
      prompt_tokens: length of the prompt.
      completion_tokens: number of sampled tokens (the stop token included).
      prompt_ids: the prompt's token ids (chat template applied).
      token_ids: the sampled token ids, the stop token that ended the reply included.
      logprobs: per sampled token, log_softmax(logits / T) at the sampling temperature T
        (T = 1 for greedy replies): what a learner scoring the tokens at T computes.
    """

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    prompt_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()


# End-of-turn / end-of-text tokens of the supported chat formats (Qwen, Llama 3).
_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


class LocalPolicy:
    """Renders conversations with the tokenizer's chat template and samples replies.

    Stops at the end-of-turn and end-of-text tokens the tokenizer has (Qwen:
    `<|im_end|>`, `<|endoftext|>`; Llama 3: `<|eot_id|>`, `<|eom_id|>`,
    `<|end_of_text|>`), plus its eos. Replies are decoded without special tokens. Statistics of the last call
    (tokens generated, seconds) are kept in `last_stats`.
    """

    def __init__(self, model, tokenizer, sampling: SamplingConfig = SamplingConfig()):
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling
        self._calls = 0
        self.last_stats: dict[str, float] = {}
        stop = {tokenizer.eos_token_id}
        for token in _STOP_TOKENS:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                stop.add(token_id)
        self.stop_token_ids = tuple(sorted(t for t in stop if t is not None))

    def encode(self, conversation: Sequence[dict]) -> list[int]:
        """Token ids of the prompt for one conversation (generation prompt appended)."""
        ids = self.tokenizer.apply_chat_template(
            list(conversation),
            add_generation_prompt=True,
            tokenize=True,
            enable_thinking=self.sampling.enable_thinking,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def complete(
        self, conversations: Sequence[Sequence[dict]], sampling: SamplingConfig | None = None
    ) -> list[Completion]:
        """Replies with their tokens and log-probs, under `sampling` (default: the policy's own)."""
        if not conversations:
            return []
        s = sampling or self.sampling
        prompts = [self.encode(c) for c in conversations]
        out = generate(
            self.model,
            prompts,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            stop_token_ids=self.stop_token_ids,
            seed=s.seed + self._calls,
        )
        self._calls += 1
        self.last_stats = {
            "prompt_tokens": float(sum(len(p) for p in prompts)),
            "generated_tokens": float(np.sum(out.lengths)),
            "prefill_seconds": out.prefill_seconds,
            "decode_seconds": out.decode_seconds,
        }
        return [
            Completion(
                text=self.tokenizer.decode(ids, skip_special_tokens=True),
                finish_reason=reason,
                prompt_tokens=len(prompt),
                completion_tokens=len(ids),
                prompt_ids=tuple(prompt),
                token_ids=tuple(int(i) for i in ids),
                logprobs=tuple(float(x) for x in logprobs),
            )
            for ids, logprobs, reason, prompt in zip(
                out.tokens, out.plain_logprobs, out.finish_reasons, prompts, strict=True
            )
        ]

    def __call__(self, conversations: Sequence[Sequence[dict]]) -> list[str]:
        return [c.text for c in self.complete(conversations)]
