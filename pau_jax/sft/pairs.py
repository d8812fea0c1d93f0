"""Training pairs of supervised fine-tuning: episode steps (or messages and an answer) as tokens.

A pair's prompt is the chat template of the step's ``messages`` with the generation
prompt (exactly what ``LocalPolicy`` feeds the sampler); its completion is the step's
``output`` followed by the end-of-turn token (``end_of_turn_id``), so the model learns to
stop. ``samples_from_records`` makes one pair per step of episode records
(``env.runner.episode_record``); ``sft.trainer`` batches and trains on them.
"""

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTExample:
    """One training pair: prompt token ids and the completion ids to imitate."""

    prompt_ids: list[int]
    completion_ids: list[int]


def end_of_turn_id(tokenizer) -> int:
    """The id that ends an assistant turn: ``<|im_end|>`` (Qwen) / ``<|eot_id|>`` (Llama) or eos."""
    vocab = tokenizer.get_vocab()
    for token in END_OF_TURN_TOKENS:
        if token in vocab:
            return int(vocab[token])
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no end-of-turn token and no eos token")
    return int(tokenizer.eos_token_id)


def _prompt_ids(tokenizer, messages: Sequence[dict], enable_thinking: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, tokenize=True, enable_thinking=enable_thinking
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def make_example(
    tokenizer, messages: Sequence[dict], completion: str, *, end: int, enable_thinking: bool = False
) -> SFTExample:
    """One pair: the chat template of ``messages`` with the generation prompt -> ``completion`` + ``end``.

    ``end`` is the end-of-turn id (``end_of_turn_id``), so the model learns to stop.
    """
    output = tokenizer.encode(completion, add_special_tokens=False)
    return SFTExample(
        prompt_ids=_prompt_ids(tokenizer, messages, enable_thinking),
        completion_ids=[int(i) for i in output] + [end],
    )


def pad_id(tokenizer) -> int:
    """The tokenizer's padding id, 0 when it has none (padding carries no loss and no attention)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def samples_from_records(
    records: Iterable[dict[str, Any]],
    tokenizer,
    *,
    enable_thinking: bool = False,
    skip_unparsed: bool = False,
) -> list[SFTExample]:
    """Training pairs from episode records, one per step, in order.

    Args:
      records: JSON episode records (``steps`` with ``messages`` and ``output``).
      tokenizer: the policy's tokenizer (its chat template renders the prompts).
      enable_thinking: passed to the chat template, as ``SamplingConfig`` does.
      skip_unparsed: drop steps whose output the environment could not parse.

    Returns:
      The pairs: prompt = the chat template of ``messages`` with the generation
      prompt, completion = ``output`` tokens then the end-of-turn token.
    """
    end = end_of_turn_id(tokenizer)
    examples = []
    for r, record in enumerate(records):
        if "steps" not in record:
            raise ValueError(f"record {r} has no 'steps'; pass episode records (episodes.jsonl)")
        for s, step in enumerate(record["steps"]):
            if "messages" not in step or "output" not in step:
                raise ValueError(f"record {r} step {s} lacks 'messages' or 'output'")
            if skip_unparsed and not step.get("parse_ok", True):
                continue
            examples.append(
                make_example(
                    tokenizer,
                    step["messages"],
                    step["output"],
                    end=end,
                    enable_thinking=enable_thinking,
                )
            )
    return examples
