"""Parsers for the agent's outputs in each phase of a PAU episode.

Every parser first strips `<think>…</think>` blocks (and an unterminated
trailing `<think>` block), so reasoning models can be used as they are, and reads
a fenced block as code (both `text_blocks`'s). Parsers never raise on model text:
they return a result with `ok=False` and a reason.

An argument text that is a literal as a whole is read as one, even where a string
in it looks like a call `f(...)`.
"""

import ast
import dataclasses
import re

from pau_jax.env import text_blocks
from pau_jax.env.text_blocks import strip_think  # also read as `parse.strip_think`
from pau_jax.sandbox import parse_call_args

_INPUT_LINE = re.compile(r"^[ \t>*_#-]*(?:input|arguments|args|call)\s*[:=]\s*(.+)$", re.I | re.M)
_LABEL = re.compile(r"\b(?:decision|label|action)\s*[:=]\s*\**\s*(continue|stop)\b", re.I)
_BARE_LABEL = re.compile(r"\b(CONTINUE|STOP)\b")
_HYPOTHESIS = re.compile(
    r"(?:^|\n)[ \t>*_#-]*(?:revised\s+|final\s+|updated\s+)?(?:hypothesis|description)\s*[:=]\s*",
    re.I,
)


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


INPUT_FORMATS = ("lenient", "strict")

# Names a model gives the function when it writes a call instead of bare arguments.
_CALL_NAMES = ("test_func", "f", "func", "function")
_CALL_START = re.compile(r"(?<![\w.])(?:" + "|".join(_CALL_NAMES) + r")\s*\(")
_DEFINITION = re.compile(r"^\s*def\s+\w+\s*\(", re.M)
_PROMPT_MARK = re.compile(r"^\s*(?:>>>|\.\.\.)\s?", re.M)
_ASSIGNMENT = re.compile(r"^\s*(arg\d+)\s*=\s*(.+?)\s*$")
_INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_NAME = re.compile(r"[A-Za-z_][\w.]*(?:\(\))?")


def _closing_paren(text: str, open_at: int) -> int | None:
    """Index of the parenthesis closing ``text[open_at]`` (string literals skipped), or None."""
    depth, quote, i = 0, "", open_at
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif text.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif c in "'\"":
            quote = text[i : i + 3] if text[i : i + 3] in text_blocks.TRIPLE_QUOTES else c
            i += len(quote) - 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i if c == ")" else None
        i += 1
    return None


def _call_arguments(call_text: str) -> str | None:
    """The argument text of one call ``name(...)``, keywords ``argN=`` put in position order."""
    source = call_text.strip()
    try:
        node = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
        return None
    parts = [ast.get_source_segment(source, a) for a in node.args]
    named = {k.arg: ast.get_source_segment(source, k.value) for k in node.keywords}
    if named:
        wanted = [f"arg{i}" for i in range(len(parts), len(parts) + len(named))]
        if sorted(named, key=str) != sorted(wanted):
            return None
        parts += [named[name] for name in wanted]
    if any(p is None for p in parts):
        return None
    return ", ".join(parts)


def _string_spans(text: str, start: int, stop: int) -> list[tuple[int, int]]:
    """(start, end) of the string literals of the code `text[start:stop]`."""
    spans, i = [], start
    while i < stop:
        if text[i] in "'\"":
            end = text_blocks.string_end(text, i) or stop
            spans.append((i, end))
            i = end
        else:
            i += 1
    return spans


def _calls(text: str) -> list[str]:
    """Argument texts of the calls of ``test_func`` (or ``f``, ``func``) in ``text``, in order.

    A call's name inside a string literal of a call already read is text, not a call.
    """
    found, strings = [], []
    for match in _CALL_START.finditer(text):
        if any(a <= match.start() < b for a, b in strings):
            continue
        if re.search(r"\bdef\s+$", text[: match.start()]):
            continue  # a definition's header, not a call
        end = _closing_paren(text, match.end() - 1)
        if end is None:
            continue
        args = _call_arguments(text[match.start() : end + 1])
        if args is not None:
            found.append(args)
            strings += _string_spans(text, match.end(), end)
    return found


def _assigned_arguments(code: str) -> str | None:
    """``arg0 = 1`` and ``arg1 = 'a'`` lines (each of arg0..argN once) as ``1, 'a'``."""
    assigned = {}
    for line in code.splitlines():
        if not line.strip():
            continue
        match = _ASSIGNMENT.match(line)
        if match is None:
            return None
        assigned[match.group(1)] = match.group(2)
    if not assigned or sorted(assigned) != sorted(f"arg{i}" for i in range(len(assigned))):
        return None
    return ", ".join(assigned[f"arg{i}"] for i in range(len(assigned)))


def _is_literal(text: str) -> bool:
    """Whether `text` is one Python literal (what `sandbox.args.parse_call_args` evaluates)."""
    try:
        ast.literal_eval(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return False
    return True


def _region_candidates(region: str) -> list[str]:
    """What one fenced block or line may hold: its last call's arguments, assignments, or itself."""
    region = _PROMPT_MARK.sub("", region).strip().rstrip(";").strip()
    if not region:
        return []
    if _is_literal(region):  # e.g. `('f(x)',)`: a string that holds a call is no call
        return [region]
    calls = _calls(region)
    if calls:
        return [calls[-1]]
    assigned = _assigned_arguments(region)
    if assigned is not None:
        return [assigned]
    if _DEFINITION.search(region):
        return []
    return [region]


def input_candidates(text: str) -> list[str]:
    """Argument texts a generation-phase output may mean, most likely first (the lenient parser).

    Beyond ``extract_input``'s forms it reads what has one meaning: a call
    ``test_func(...)`` (or ``f(...)``, ``func(...)``; keyword arguments ``argN=``
    put in position order) in a fence, on an ``Input:`` line or in the prose, a
    ``>>>`` prompt before it, ``arg0 = ...`` assignment lines, and, last, the one
    inline code span of a reply that has exactly one (spans holding a bare name such
    as `test_func` are not counted). A fence that holds only a function definition
    is no input. The environment takes the first candidate that parses as the
    function's arguments.
    """
    body = strip_think(text)
    regions = [content for _, _, content in reversed(text_blocks.fences(body))]
    regions += [line.strip(" \t*_`") for line in reversed(_INPUT_LINE.findall(body))]
    single = body.strip(" \t\n*_`")
    if "\n" not in single:
        regions.append(single)
    out: list[str] = []
    for region in regions:
        out += [c for c in _region_candidates(region) if c not in out]
    prose = text_blocks.without_fences(body)
    out += [args for args in reversed(_calls(prose)) if args not in out]
    spans = [
        span.strip()
        for span in _INLINE_CODE.findall(prose)
        if span.strip() and not _NAME.fullmatch(span.strip())
    ]
    if len(spans) == 1 and spans[0] not in out:
        out.append(spans[0])
    return out


def expected_form(n_params: int | None = None) -> str:
    """The argument form an error message asks for: ``(arg0, arg1)``, ``(arg0,)``, ``()``."""
    if n_params is None:
        return "(arg0, arg1)"
    names = ", ".join(f"arg{i}" for i in range(n_params))
    return f"({names},)" if n_params == 1 else f"({names})"


def no_input_reason(text: str, n_params: int | None = None) -> str:
    """Why ``input_candidates`` found nothing in ``text`` (one line the agent is shown)."""
    body = strip_think(text)
    if not body:
        return "empty output"
    if _DEFINITION.search(body):
        return "the reply defines a function instead of giving argument values"
    return f"no input found: expected ```{expected_form(n_params)}``` or 'Input: …'"


def extract_input(text: str) -> InputParse:
    """Finds the argument tuple text in a generation-phase output.

    Accepted forms, in order of preference: the last fenced code block
    (```python …``` or ``` … ```), the last `Input: …` line, or the whole
    remaining text when it is a single line.
    """
    body = strip_think(text)
    if not body:
        return InputParse(ok=False, reason="empty output")
    fences = text_blocks.fences(body)
    if fences:
        candidate = fences[-1][2].strip()
        if candidate:
            return InputParse(ok=True, args_text=candidate)
    lines = _INPUT_LINE.findall(body)
    if lines:
        return InputParse(ok=True, args_text=lines[-1].strip(" \t*_`"))
    single = body.strip(" \t\n*_`")
    if "\n" not in single:
        return InputParse(ok=True, args_text=single)
    return InputParse(ok=False, reason="no input found: expected ```(arg0, arg1)``` or 'Input: …'")


def read_input(text: str, n_params: int, input_format: str) -> tuple[str, tuple | None, str]:
    """(argument text, argument tuple or None, error) of a generation-phase output.

    'strict' reads one argument text (``extract_input``); 'lenient' tries
    each of ``input_candidates`` in turn and keeps the first that parses as
    ``n_params`` arguments (the error is then that of the most likely one).
    """
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
    if input_format == "strict":
        extracted = extract_input(text)
        texts, error = ([extracted.args_text] if extracted.ok else []), extracted.reason
    else:
        texts = input_candidates(text)
        error = no_input_reason(text, n_params)
    first_error = ""
    for args_text in texts:
        try:
            return args_text, parse_call_args(args_text, n_params), ""
        except ValueError as e:
            first_error = first_error or str(e)
    return (texts[0] if texts else ""), None, first_error or error


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
