"""Parsers for the agent's outputs in each phase of a PAU episode.

Every parser first strips `<think>…</think>` blocks (and an unterminated
trailing `<think>` block), so reasoning models can be used as they are. Parsers
never raise on model text: they return a result with `ok=False` and a reason.
"""

import ast
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


INPUT_FORMATS = ("lenient", "strict")

# Names a model gives the function when it writes a call instead of bare arguments.
_CALL_NAMES = ("test_func", "f", "func", "function")
_CALL_START = re.compile(r"(?<![\w.])(?:" + "|".join(_CALL_NAMES) + r")\s*\(")
_DEFINITION = re.compile(r"^\s*def\s+\w+\s*\(", re.M)
_PROMPT_MARK = re.compile(r"^\s*(?:>>>|\.\.\.)\s?", re.M)
_ASSIGNMENT = re.compile(r"^\s*(arg\d+)\s*=\s*(.+?)\s*$")
_TRIPLE_QUOTES = ("'''", '"""')
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
            quote = text[i : i + 3] if text[i : i + 3] in _TRIPLE_QUOTES else c
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


def _calls(text: str) -> list[str]:
    """Argument texts of the calls of ``test_func`` (or ``f``, ``func``) in ``text``, in order."""
    found = []
    for match in _CALL_START.finditer(text):
        if re.search(r"\bdef\s+$", text[: match.start()]):
            continue  # a definition's header, not a call
        end = _closing_paren(text, match.end() - 1)
        if end is None:
            continue
        args = _call_arguments(text[match.start() : end + 1])
        if args is not None:
            found.append(args)
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


def _region_candidates(region: str) -> list[str]:
    """What one fenced block or line may hold: its last call's arguments, assignments, or itself."""
    region = _PROMPT_MARK.sub("", region).strip().rstrip(";").strip()
    if not region:
        return []
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
    regions = [fence[1] for fence in reversed(_FENCE.findall(body))]
    regions += [line.strip(" \t*_`") for line in reversed(_INPUT_LINE.findall(body))]
    single = body.strip(" \t\n*_`")
    if "\n" not in single:
        regions.append(single)
    out: list[str] = []
    for region in regions:
        out += [c for c in _region_candidates(region) if c not in out]
    out += [args for args in reversed(_calls(_FENCE.sub("", body))) if args not in out]
    spans = [
        span.strip()
        for span in _INLINE_CODE.findall(_FENCE.sub("", body))
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
