"""A policy backed by the JAX sampler over a local model and its tokenizer."""

import dataclasses
import sys
from collections.abc import Sequence

import numpy as np

from pau_jax.env import turns
from pau_jax.policy import check_per_row, turn_ids
from pau_jax.policy.config import SamplingConfig
from pau_jax.sampling import constraint, generate, output, token_bytes, token_mask
from pau_jax.sampling.prefix_cache import PrefixCache
from pau_jax.sandbox.args import MAX_CHARS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Completion:
    """One reply: its text, why it ended, token counts and the tokens.

    Attributes:
      text: the reply decoded without special tokens.
      finish_reason: 'stop' (a stop token), 'length' (the token budget) or
        'prompt_length' (the prompt exceeded `SamplingConfig.max_prompt_tokens`; nothing
        was sampled, the text is empty).
      prompt_tokens: length of the prompt.
      completion_tokens: number of sampled tokens (the stop token included).
      prompt_ids: the prompt's token ids (chat template applied).
      token_ids: the sampled token ids, the stop token that ended the reply included.
      logprobs: per sampled token, log_softmax(logits / T) at the sampling temperature T
        (T = 1 for greedy replies) of the model's raw logits, before any repetition
        penalty, over the tokens a structured-decoding mask allowed: what a learner
        scoring the tokens at T under the same masks computes.
      masks: per sampled token, the packed set of tokens its mask allowed
        (`sampling.token_mask.effective_masks`; None: every token), recorded by a policy
        built with ``record_masks=True`` (an AAC actor); () otherwise, or when no token
        of the reply was masked.
    """

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    prompt_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    masks: tuple = dataclasses.field(default=(), compare=False, repr=False)


def _masks(automaton, states, max_new_tokens: int) -> tuple:
    """A reply's per-token masks (`token_mask.effective_masks`); () when none masked a token."""
    remaining = max_new_tokens - np.arange(len(states))
    masks = token_mask.effective_masks(automaton, states, remaining)
    return tuple(masks) if any(m is not None for m in masks) else ()


# Redraw n of call seed k uses seed k + n * stride (clear of the next calls' seeds).
_RETRY_SEED_STRIDE = 1_000_003

# `SamplingConfig.structured` modes that mask input replies.
_MASKED = ("constrain_inputs", "typed_inputs")
# A grader's answer shape -> its masked component (under any structured mode but 'off').
_GRADER_COMPONENTS = {"rating": constraint.RATING, "code": constraint.CODE}

# End-of-turn / end-of-text tokens of the supported chat formats (Qwen, Llama 3).
_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


def _input_bounds(max_new_tokens: int) -> dict[str, int]:
    """The token bounds of a masked input reply of `max_new_tokens` tokens (`constraint.Component`).

    The input grammar accepts literals of any length, but the runner reads an input with
    `sandbox.args.parse_call_args`, which refuses more than `MAX_CHARS` characters, and
    Python refuses an int of more than `sys.get_int_max_str_digits()` digits. A regular
    grammar cannot count that far (a state per character in every context), so the
    bound is kept at the token level instead: every token of a masked reply has at most
    `MAX_CHARS // max_new_tokens` bytes and `digits // max_new_tokens` digits, so no
    reply the mask allows is refused for its length. At 512 tokens that leaves out the
    1,007 Qwen tokens over 19 bytes (0.7%: runs of spaces or punctuation, long words of
    non-Latin scripts).
    """
    digits = sys.get_int_max_str_digits()
    if max_new_tokens > MAX_CHARS or (digits and max_new_tokens > digits):
        raise ValueError(
            f"structured inputs need max_new_tokens <= {min(MAX_CHARS, digits or MAX_CHARS)} "
            f"(the input parser's limits), got {max_new_tokens}; lower it or set structured='off'"
        )
    return {
        "max_piece_bytes": MAX_CHARS // max_new_tokens,
        "max_piece_digits": digits // max_new_tokens if digits else 0,
    }


class LocalPolicy:
    """Renders conversations with the tokenizer's chat template and samples replies.

    Stops at the end-of-turn and end-of-text tokens the tokenizer has (Qwen:
    `<|im_end|>`, `<|endoftext|>`; Llama 3: `<|eot_id|>`, `<|eom_id|>`,
    `<|end_of_text|>`), plus its eos. Replies are decoded without special tokens. Statistics of the last call
    (tokens generated and prefilled, prefix tokens reused, seconds) are kept in `last_stats`.

    Args:
      model: the decoder.
      tokenizer: its tokenizer, with a chat template.
      sampling: default settings of a call.
      prefix_cache: keys and values of earlier prompts and replies, reused when a new prompt
        starts with one (`pau_jax.sampling.prefix_cache`): the next phase of an episode then
        prefills only what was appended. Greedy replies are the same with or without it.
        A cache empties itself when the model's weights change. None (the default)
        disables reuse; `backends.prefix_cache(gib)` sizes the one that every seat and
        training run builds (`config.DEFAULT_PREFIX_CACHE_GIB` unless configured).
      record_masks: give each reply's per-token structured-decoding masks
        (`Completion.masks`), for a learner that scores masked rollouts (the AAC actor);
        off elsewhere (a masked grader's replies do not need them).
    """

    def __init__(
        self,
        model,
        tokenizer,
        sampling: SamplingConfig = SamplingConfig(),
        prefix_cache: PrefixCache | None = None,
        *,
        record_masks: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.prefix_cache = prefix_cache
        self.record_masks = record_masks
        self._calls = 0
        self.last_stats: dict[str, float] = {}
        stop = {tokenizer.eos_token_id}
        vocab = tokenizer.get_vocab()  # A token the tokenizer knows (its unk token included).
        for token in _STOP_TOKENS:
            if token in vocab:
                stop.add(int(vocab[token]))
        self.stop_token_ids = tuple(sorted(t for t in stop if t is not None))
        self._end_texts = tuple(tokenizer.convert_ids_to_tokens(list(self.stop_token_ids)))
        self._vocab: token_bytes.Vocabulary | None = None  # token bytes, for structured decoding

    def _automaton(self, answers, stops, keep, s: SamplingConfig):
        """(automaton, per-row starts) for the kept rows, or (None, None) when no row needs one.

        A row follows the input grammar of its arity ('constrain_inputs'; 'typed_inputs'
        with its arguments' shapes; an input shape), with tokens bounded so the reply stays
        readable (`_input_bounds`), a grader's rating line or closed code block (a rating
        or code shape, under any structured mode but 'off'), the revision detector ('end_at_answer' or
        'constrain_inputs', a decision shape; with the row's stop strings too), or a
        stop-string detector (stop strings alone).
        """
        structured, components = s.structured, {}
        for i in keep:
            shape = answers[i] if answers is not None and structured != "off" else None
            row_stop = tuple(stops[i]) if stops is not None else ()
            if shape is not None and shape.kind == "input" and structured in _MASKED:
                typed = shape.shapes if structured == "typed_inputs" else ()
                components[i] = constraint.Component(
                    "input", arity=shape.arity, shapes=typed, **_input_bounds(s.max_new_tokens)
                )
            elif shape is not None and shape.kind in _GRADER_COMPONENTS:
                components[i] = _GRADER_COMPONENTS[shape.kind]
            elif shape is not None and shape.kind == "decision":
                components[i] = constraint.Component("decision", stop=row_stop)
            elif row_stop:
                components[i] = constraint.Component("stop", stop=row_stop)
        if not components:
            return None, None
        if self._vocab is None:
            self._vocab = token_bytes.vocabulary(self.tokenizer)
        distinct = sorted(set(components.values()), key=repr)
        automaton = constraint.build_components(
            self._vocab, self.stop_token_ids, distinct, vocab_size=self.model.config.vocab_size
        )
        starts = [
            automaton.starts[distinct.index(components[i])] if i in components else automaton.free
            for i in keep
        ]
        return automaton, starts

    def encode(self, conversation: Sequence[dict]) -> list[int]:
        """Token ids of the prompt for one conversation (generation prompt appended).

        A multi-turn conversation whose last reply carries its ids (`env.turns.TOKENS`) is
        extended by ids (`turn_ids.extend`): the previous prompt and the reply as sampled,
        then the appended messages encoded on their own; any other is rendered whole.
        """
        extended = turn_ids.extend(self.tokenizer, self._render, conversation, self._end_texts)
        if extended is not None:
            return extended
        ids = self.tokenizer.apply_chat_template(
            turns.without_tokens(conversation),
            add_generation_prompt=True,
            tokenize=True,
            enable_thinking=self.sampling.enable_thinking,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The chat template's text of plain messages."""
        return self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            enable_thinking=self.sampling.enable_thinking,
        )

    def complete(
        self,
        conversations: Sequence[Sequence[dict]],
        sampling: SamplingConfig | None = None,
        *,
        repetition_penalties: Sequence[float] | None = None,
        answers: Sequence | None = None,
        stop: Sequence[Sequence[str]] | None = None,
    ) -> list[Completion]:
        """Replies with their tokens and log-probs, under `sampling` (default: the policy's own).

        Conversations whose prompt exceeds `sampling.max_prompt_tokens` get an empty
        'prompt_length' completion; the others are sampled in one batch (none, if none is
        left). Row r of that batch draws from seed (seed + n, r), so skipping a prompt
        shifts the draws of the sampled replies after it (greedy replies are unaffected).

        Args:
          conversations: chat conversations (lists of {"role", "content"} messages).
          sampling: settings of this call.
          repetition_penalties: one penalty per conversation, replacing
            `sampling.repetition_penalty` (rows of one batch may differ).
          answers: one `env.answer_shape.AnswerShape` (or None) per conversation: what its
            reply must hold, used when `sampling.structured` is not 'off', and which
            arguments it must not repeat (`sampling.resample_repeats`).
          stop: per conversation, strings that end its reply (OpenAI/vLLM `stop`): the
            sampler ends the row with the token that completes the first one, and the text
            is cut before it (finish reason 'stop'; `token_ids` keep that last token).

        Returns:
          One `Completion` per conversation, in order.
        """
        if not conversations:
            return []
        s = sampling or self.sampling
        if repetition_penalties is None:
            repetition_penalties = [s.repetition_penalty] * len(conversations)
        if len(repetition_penalties) != len(conversations):
            raise ValueError(
                f"repetition_penalties has {len(repetition_penalties)} values for "
                f"{len(conversations)} conversations; pass one per conversation"
            )
        check_per_row(conversations, answers=answers, stop=stop)
        prompts = [self.encode(c) for c in conversations]
        limit = s.max_prompt_tokens
        keep = [i for i, p in enumerate(prompts) if limit is None or len(p) <= limit]
        seed = s.seed + self._calls
        self._calls += 1
        completions = [
            Completion(
                text="",
                finish_reason="prompt_length",
                prompt_tokens=len(prompt),
                completion_tokens=0,
                prompt_ids=tuple(prompt),
            )
            for prompt in prompts
        ]
        self.last_stats = {
            "prompt_tokens": float(sum(len(prompts[i]) for i in keep)),
            "generated_tokens": 0.0,
            "prefill_seconds": 0.0,
            "decode_seconds": 0.0,
            "prompts_too_long": float(len(prompts) - len(keep)),
            "prefill_tokens": 0.0,
            "reused_tokens": 0.0,
        }
        if not keep:
            return completions
        penalties = [float(p) for p in repetition_penalties]
        drawn = self._sample(prompts, keep, s, seed, penalties, answers, stop)
        for attempt in range(s.resample_repeats if answers is not None else 0):
            redo = [i for i in keep if answers[i] is not None and answers[i].repeats(drawn[i].text)]
            if not redo:
                break
            again = dataclasses.replace(s, temperature=s.resample_temperature)
            retry_seed = seed + (attempt + 1) * _RETRY_SEED_STRIDE
            drawn.update(self._sample(prompts, redo, again, retry_seed, penalties, answers, stop))
            self.last_stats["redrawn"] = self.last_stats.get("redrawn", 0.0) + len(redo)
        for i, completion in drawn.items():
            completions[i] = completion
        return completions

    def _sample(self, prompts, rows, s: SamplingConfig, seed, penalties, answers, stop) -> dict:
        """One sampler call for `rows` of `prompts`: their `Completion`s by row, stats added up."""
        automaton, starts = self._automaton(answers, stop, rows, s)
        out = generate(
            self.model,
            [prompts[i] for i in rows],
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            repetition_penalty=[penalties[i] for i in rows],
            stop_token_ids=self.stop_token_ids,
            seed=seed,
            prefix_cache=self.prefix_cache,
            automaton=automaton,
            automaton_starts=starts,
        )
        stats = self.last_stats
        stats["prefill_tokens"] += float(out.prefill_tokens)
        stats["reused_tokens"] += float(out.reused_tokens)
        stats["generated_tokens"] += float(np.sum(out.lengths))
        stats["prefill_seconds"] += out.prefill_seconds
        stats["decode_seconds"] += out.decode_seconds
        drawn = {}
        masks = [()] * len(rows)
        if automaton is not None and self.record_masks:  # for a learner that scores masked
            masks = [_masks(automaton, states, s.max_new_tokens) for states in out.states]
        for i, ids, logprobs, reason, row_masks in zip(
            rows, out.tokens, out.plain_logprobs, out.finish_reasons, masks, strict=True
        ):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            at = output.stop_position(text, stop[i]) if stop is not None else -1
            if at >= 0:  # the sampler ended the row on the stop string; cut the text before it
                text, reason = text[:at], "stop"
            drawn[i] = Completion(
                text=text,
                finish_reason=reason,
                prompt_tokens=len(prompts[i]),
                completion_tokens=len(ids),
                prompt_ids=tuple(prompts[i]),
                token_ids=tuple(int(t) for t in ids),
                logprobs=tuple(float(x) for x in logprobs),
                masks=row_masks,
            )
        return drawn

    def __call__(self, conversations: Sequence[Sequence[dict]]) -> list[str]:
        """The reply texts of `complete(conversations)`."""
        return [c.text for c in self.complete(conversations)]
