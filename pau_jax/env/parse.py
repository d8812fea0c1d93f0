"""Parsers for the agent's outputs in each phase of a PAU episode.

Every parser first strips `<think>…</think>` blocks (and an unterminated
trailing `<think>` block), so reasoning models can be used as they are. Parsers
never raise on model text: they return a result with `ok=False` and a reason.
"""

import dataclasses
import re

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_OPEN_THINK = re.compile(r"<think>.*\Z", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?(.*?)```", re.DOTALL)
_INPUT_LINE = re.compile(r"^[ \t>*_#-]*(?:input|arguments|args|call)\s*[:=]\s*(.+)$", re.I | re.M)
_LABEL = re.compile(r"\b(?:decision|label|action)\s*[:=]\s*\**\s*(continue|stop)\b", re.I)
_BARE_LABEL = re.compile(r"\b(CONTINUE|STOP)\b")
_HYPOTHESIS = re.compile(
    r"(?:^|\n)[ \t>*_#-]*(?:revised\s+|final\s+|updated\s+)?(?:hypothesis|description)\s*[:=]\s*",
    re.I,
)


def strip_think(text: str) -> str:
    """Removes `<think>…</think>` blocks and an unterminated trailing `<think>`."""
    text = _THINK_BLOCK.sub("", text)
    text = _OPEN_THINK.sub("", text)
    return text.replace("</think>", "").strip()


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputParse:
    """The argument text extracted from a generation-phase output."""

    ok: bool
    args_text: str = ""
    reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RevisionParse:
    """Hypothesis and CONTINUE/STOP decision from a revision-phase output."""

    ok: bool
    hypothesis: str = ""
    stop: bool = False
    reason: str = ""


def extract_input(text: str) -> InputParse:
    """Finds the argument tuple text in a generation-phase output.

    Accepted forms, in order of preference: the last fenced code block
    (```python …``` or ``` … ```), the last `Input: …` line, or the whole
    remaining text when it is a single line.
    """
    body = strip_think(text)
    if not body:
        return InputParse(ok=False, reason="empty output")
    fences = _FENCE.findall(body)
    if fences:
        candidate = fences[-1][1].strip()
        if candidate:
            return InputParse(ok=True, args_text=candidate)
    lines = _INPUT_LINE.findall(body)
    if lines:
        return InputParse(ok=True, args_text=lines[-1].strip(" \t*_`"))
    single = body.strip(" \t\n*_`")
    if "\n" not in single:
        return InputParse(ok=True, args_text=single)
    return InputParse(ok=False, reason="no input found: expected ```(arg0, arg1)``` or 'Input: …'")


def parse_revision(text: str) -> RevisionParse:
    """Extracts the revised hypothesis and the CONTINUE/STOP decision.

    The decision is the last `Decision: CONTINUE|STOP` label; failing that, the
    last bare upper-case CONTINUE or STOP word. The hypothesis is the text after
    the last `Hypothesis:` marker up to the decision; failing a marker, the text
    before the decision. Without a decision the parse fails (the episode
    continues and the step counts as a format error).
    """
    body = strip_think(text)
    labels = list(_LABEL.finditer(body))
    if labels:
        label = labels[-1]
    else:
        bare = list(_BARE_LABEL.finditer(body))
        label = bare[-1] if bare else None
    markers = list(_HYPOTHESIS.finditer(body))
    end = label.start() if label else len(body)
    starts = [m.end() for m in markers if m.end() <= end]
    start = starts[-1] if starts else 0
    hypothesis = body[start:end].strip().strip("*").strip()
    if label is None:
        return RevisionParse(
            ok=False,
            hypothesis=hypothesis,
            reason="no decision found: expected 'Decision: CONTINUE' or 'Decision: STOP'",
        )
    stop = label.group(1).upper() == "STOP"
    if not hypothesis:
        return RevisionParse(ok=False, stop=stop, reason="empty hypothesis")
    return RevisionParse(ok=True, hypothesis=hypothesis, stop=stop)


def parse_description(text: str) -> str:
    """The final description in in-context mode: text after the last `Description:` marker."""
    body = strip_think(text)
    markers = list(_HYPOTHESIS.finditer(body))
    if markers:
        body = body[markers[-1].end() :]
    return body.strip().strip("*").strip()
