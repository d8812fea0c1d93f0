"""The blocks of a model's reply that every parser treats alike: think blocks and code fences.

`strip_think` removes `<think>…</think>` blocks (and an unterminated trailing `<think>`
block), so reasoning models can be used as they are. A fenced block is read as code: its
end is the first ``` outside a string literal (`string_end` finds a literal's end), and
the think tags inside it are text, so a literal argument holding backticks or `<think>`
reads as written. `fences` lists a text's fenced blocks, `without_fences` cuts them out.
"""

import re

_THINK_OR_FENCE = re.compile(r"<think>|</think>|```")
_FENCE_OPEN = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?")
TRIPLE_QUOTES = ("'''", '"""')


def string_end(text: str, at: int) -> int | None:
    """The index after the string literal whose opening quote is `text[at]`; None if unterminated.

    A backslash takes the next character (also in raw strings, where it keeps a quote
    in); a one-quote string ends at its line.
    """
    quote = text[at : at + 3] if text[at : at + 3] in TRIPLE_QUOTES else text[at]
    i = at + len(quote)
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text.startswith(quote, i):
            return i + len(quote)
        elif text[i] == "\n" and len(quote) == 1:
            return None
        else:
            i += 1
    return None


def _fence_close(text: str, start: int) -> int:
    """Index of the ``` that closes a fenced block whose content starts at `start`; -1 if none.

    The first ``` outside a string literal, if every literal before it is terminated
    (the block then reads as code); otherwise, as for prose, the first ``` at all.
    """
    plain, i = text.find("```", start), start
    while 0 <= plain and i < len(text):
        if text.startswith("```", i):
            return i
        if text[i] in "'\"":
            end = string_end(text, i)
            if end is None:
                return plain
            i = end
        else:
            i += 1
    return plain


def fences(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of each fenced block ```lang ... ``` of `text`, in order."""
    found, pos = [], 0
    while (opening := _FENCE_OPEN.search(text, pos)) is not None:
        close = _fence_close(text, opening.end())
        if close < 0:
            break
        found.append((opening.start(), close + 3, text[opening.end() : close]))
        pos = close + 3
    return found


def without_fences(text: str) -> str:
    """`text` with its fenced blocks cut out."""
    kept, pos = [], 0
    for start, end, _ in fences(text):
        kept.append(text[pos:start])
        pos = end
    return "".join(kept) + text[pos:]


def strip_think(text: str) -> str:
    """Removes `<think>…</think>` blocks and an unterminated trailing `<think>`.

    A stray `</think>` goes too; a fenced block outside a think block is kept whole
    (think tags in it are code, e.g. in a string literal).
    """
    kept, pos = [], 0
    while (tag := _THINK_OR_FENCE.search(text, pos)) is not None:
        kept.append(text[pos : tag.start()])
        pos = tag.end()
        if tag.group() == "<think>":
            close = text.find("</think>", pos)
            pos = len(text) if close < 0 else close + len("</think>")
        elif tag.group() == "```":
            close = _fence_close(text, _FENCE_OPEN.match(text, tag.start()).end())
            end = tag.end() if close < 0 else close + 3
            kept.append(text[tag.start() : end])
            pos = end
    kept.append(text[pos:])
    return "".join(kept).strip()
