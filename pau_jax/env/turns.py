"""Token ids carried on a multi-turn conversation, so a local policy extends its last prompt by ids.

The runner puts the token ids of a policy's previous reply (and of the prompt it answered)
on that reply's assistant message under `TOKENS`; `policy.local.LocalPolicy` then builds the
next prompt as those ids + the ids of the messages appended since, never re-encoding text
the model already saw. Every other reader sees plain `{"role", "content"}` messages:
`plain` strips the key (the HTTP client sends only role and content), and the messages an
episode records never carry it.
"""

from collections.abc import Sequence
from typing import Any

TOKENS = "tokens"  # {"prompt_ids": (...), "reply_ids": (...)} on an assistant message


def plain(conversation: Sequence[dict]) -> list[dict]:
    """The conversation as role and content only."""
    return [{"role": m["role"], "content": m["content"]} for m in conversation]


def without_tokens(conversation: Sequence[dict]) -> list[dict]:
    """The conversation with the `TOKENS` key dropped (other keys kept)."""
    return [{k: v for k, v in m.items() if k != TOKENS} for m in conversation]


def with_tokens(conversation: Sequence[dict], reply: Any) -> list[dict]:
    """The conversation with `reply`'s ids on the assistant message that holds its text.

    Args:
      conversation: a multi-turn conversation whose last assistant message is `reply`'s
        text (otherwise, or with no assistant message, it is returned unchanged).
      reply: the policy's reply to the conversation up to that message: an object with
        `text`, `prompt_ids` and `token_ids` (e.g. `LocalPolicy`'s `Completion`); a plain
        text or a reply without ids leaves the conversation as it is.
    """
    prompt_ids, reply_ids = getattr(reply, "prompt_ids", ()), getattr(reply, "token_ids", ())
    at = next(
        (i for i in reversed(range(len(conversation))) if conversation[i]["role"] == "assistant"),
        None,
    )
    if at is None or not prompt_ids or not reply_ids:
        return list(conversation)
    if conversation[at]["content"] != getattr(reply, "text", None):
        return list(conversation)
    out = list(conversation)
    tokens = {"prompt_ids": tuple(prompt_ids), "reply_ids": tuple(reply_ids)}
    out[at] = {**conversation[at], TOKENS: tokens}
    return out


def last_tokens(conversation: Sequence[dict]) -> tuple[int, tuple, tuple] | None:
    """(index, prompt ids, reply ids) of the last assistant message carrying ids; None if none.

    Only an assistant message followed by non-assistant messages counts (the prompt
    continues after it).
    """
    for i in reversed(range(len(conversation))):
        message = conversation[i]
        if message["role"] == "assistant":
            tokens = message.get(TOKENS)
            if tokens is None or i == len(conversation) - 1:
                return None
            return i, tuple(tokens["prompt_ids"]), tuple(tokens["reply_ids"])
    return None
