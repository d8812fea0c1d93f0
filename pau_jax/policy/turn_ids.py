"""Prompt ids of a multi-turn conversation, extended by ids rather than re-encoded.

The next prompt of a conversation whose last assistant message carries ids
(`env.turns.TOKENS`: the prompt it answered and the reply as sampled) is::

    previous prompt ids + reply ids [+ end-of-turn ids] + ids of the appended text

The appended text is what the chat template writes after the reply's end-of-turn
token: the template is rendered for the conversation without the new messages (no
generation prompt) and with them (generation prompt), and the text after the
same end-of-turn occurrence is tokenised alone, on its own boundary. A reply that
ended without the end-of-turn token (its token budget ran out, or another stop
token ended it) gets the end-of-turn ids the template writes there. Each phase's
prompt is then a token prefix of the next, as the model saw them.
"""

from collections.abc import Callable, Sequence

from pau_jax.env import turns

# render(messages, add_generation_prompt) -> the chat template's text.
Render = Callable[[list[dict], bool], str]


def _occurrence(text: str, needle: str, n: int) -> int:
    """Index of the n-th (from 1) occurrence of `needle` in `text`, or -1."""
    at = -1
    for _ in range(n):
        at = text.find(needle, at + 1)
        if at < 0:
            return -1
    return at


def appended_text(
    render: Render, conversation: Sequence[dict], at: int, end_texts: Sequence[str]
) -> tuple[str, str]:
    """(end-of-turn text closing message `at`, the template's text of the messages after it).

    Args:
      render: the chat template as a function (see `Render`).
      conversation: plain messages; message `at` is an assistant reply.
      at: index of that reply.
      end_texts: end-of-turn / end-of-text token texts the template may close a turn with.

    Raises:
      ValueError: the template closes the assistant turn with none of `end_texts`.
    """
    before = render(list(conversation[: at + 1]), False)
    found = [(before.rfind(t), t) for t in end_texts if t and before.rfind(t) >= 0]
    if not found:
        raise ValueError(
            f"the chat template closes an assistant turn with none of {list(end_texts)}; "
            "a multi_turn conversation needs an end-of-turn token (use conversation='fresh')"
        )
    position, end = max(found)
    count = before[: position + len(end)].count(end)
    after = render(list(conversation), True)
    closing = _occurrence(after, end, count)
    if closing < 0:
        raise ValueError(
            "the chat template writes the conversation before the appended messages "
            "differently with them; use conversation='fresh' with this template"
        )
    return end, after[closing + len(end) :]


def extend(
    tokenizer,
    render: Render,
    conversation: Sequence[dict],
    end_texts: Sequence[str],
) -> list[int] | None:
    """The prompt ids of `conversation` grown from its last reply's ids; None without them.

    Args:
      tokenizer: the policy's tokenizer (`encode(text, add_special_tokens=False)`).
      render: the chat template (see `Render`).
      conversation: messages, the last assistant one carrying `env.turns.TOKENS`.
      end_texts: the texts of the policy's stop tokens.

    Returns:
      previous prompt ids + reply ids (+ the end-of-turn ids when the reply does not end
      with them) + the ids of the appended text; None when no assistant message carries ids.
    """
    found = turns.last_tokens(conversation)
    if found is None:
        return None
    at, prompt_ids, reply_ids = found
    end, text = appended_text(render, turns.plain(conversation), at, end_texts)
    end_ids = list(tokenizer.encode(end, add_special_tokens=False))
    reply = list(reply_ids)
    if reply[-len(end_ids) :] != end_ids:
        reply += end_ids
    appended = list(tokenizer.encode(text, add_special_tokens=False))
    return [int(i) for i in (*prompt_ids, *reply, *appended)]
