"""Checks of a gin configuration before a run: names that match nothing, required values unset.

Gin accepts a command-line macro that no binding uses (`--gin.ADAPTR=...` next to
`%ADAPTER`) and a binding in a scope that no reference enters; both would leave
the run silently on its defaults, so `check_command_line` refuses them with a
"did you mean" hint, and `check_gin_files` does the same for the user's own gin
files (those outside the repository's `gin/`), naming the file and line, and
also refuses there a reference to a macro that is never set. Gin's own errors
about unknown names are shortened by `explain`, with the same kind of hint.
`missing_required` lists what a run mode needs but the configuration leaves
unset: a seat (the eval judge and coder, the distillation teacher) or a required
field bound to None (`CHECKPOINT = None`), found without calling anything, so no
model is loaded; `missing_inputs` lists what the run would read but is not there
(checkpoint folders, dataset splits), again without loading it.

gin-config 0.5.0's tables are read by `gin_tables.py`, and whether the inputs are
there is `run_inputs.py`'s.
"""

import difflib
import inspect
import io
import pathlib
import re
import tokenize
import typing

from gin import config as gin_config

from pau_jax import gin_tables, run_inputs
from pau_jax.policy.backends import SELF

_SEAT_VALUES = f"a *BackendConfig or '{SELF}'"
# Entry parameters that default to None but must be set, per run mode (see `_seats`).
REQUIRED_SEATS = {"eval": ("judge", "coder"), "distill": ("teacher",)}


class ConfigError(ValueError):
    """A mistake in the configuration; the message is short and says what to change."""


# Gin's messages (gin-config 0.5.0) about names that match nothing, and its location lines.
_UNKNOWN_REFERENCE = re.compile(r"No configurable matching reference '@(?P<selector>[^'(]+)")
_UNKNOWN_CONFIGURABLE = re.compile(r"No configurable matching '(?P<selector>[^']+)'")
_UNKNOWN_PARAMETER = re.compile(
    r"Configurable '(?P<selector>[^']+)' doesn't have a parameter named '(?P<name>[^']+)'"
)
_UNSET_MACRO = re.compile(r"No bindings specified for '(?P<name>[^']+)/gin\.macro'")
_LOCATION = re.compile(
    r'\n  In (?:file "(?P<file>[^"]+)",|bindings string) line (?P<line>\d+)\n    (?P<text>[^\n]*)'
)
_CALL = re.compile(r"\n  In call to configurable '[^']*' \([^\n]*\)")


def _did_you_mean(word: str, candidates, shown=repr) -> str:
    match = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return f" (did you mean {shown(match[0])}?)" if match else ""


def explain(error: BaseException) -> str:
    """A short message for an error raised by gin or inside a configurable gin called.

    Gin's "In call to configurable" lines are dropped; its messages about unknown
    configurables, parameters and macros get a "did you mean" hint, and where a
    binding was parsed is kept as one line.
    """
    if isinstance(error, tokenize.TokenError):  # An unclosed bracket or string, no location.
        return f"gin cannot parse the configuration: {error.args[0]} (an unclosed bracket?)"
    if isinstance(error, SyntaxError) and error.lineno is not None:
        in_file = error.filename not in (None, "<string>")
        where = f"{error.filename}, line {error.lineno}" if in_file else "a command-line binding"
        return f"gin syntax error: {error.msg}\n  in {where}: {(error.text or '').strip()}"
    text = _CALL.sub("", str(error))
    head = text.split("\n", 1)[0]
    if m := _UNKNOWN_REFERENCE.match(head):
        given = m["selector"]
        head = f"unknown configurable '@{given}'{_did_you_mean(given, gin_tables.selectors(given))}"
    elif m := _UNKNOWN_CONFIGURABLE.match(head):
        given = m["selector"]
        head = f"unknown configurable '{given}'{_did_you_mean(given, gin_tables.selectors(given))}"
    elif m := _UNKNOWN_PARAMETER.match(head):
        hint = _did_you_mean(m["name"], gin_tables.parameter_names(m["selector"]))
        head = f"'{m['selector']}' has no parameter '{m['name']}'{hint}"
    elif m := _UNSET_MACRO.match(head):
        name = m["name"]
        users = sorted(
            {
                b
                for b, ref in gin_tables.references()
                if gin_tables.is_macro(ref) and ref.scopes == [name]
            }
        )
        hint = _did_you_mean(
            name, [n for n in gin_tables.macro_values() if n != name], "%{}".format
        )
        return f"%{name} is used by {', '.join(users) or 'a binding'} but never set{hint}"
    elif location := _LOCATION.search(text):
        head = text[: location.start()]
    else:
        return text
    if location := _LOCATION.search(text):
        where = "a command-line binding"
        if location["file"]:
            where = f"{location['file']}, line {location['line']}"
        head += f"\n  in {where}: {location['text'].strip()}"
    return head


def _command_line_keys(bindings) -> list[str]:
    """The keys of command-line bindings (`X` of `X = V`), in order."""
    keys = []
    for binding in bindings:
        for line in binding.splitlines():
            key, eq, _ = line.partition("=")
            if eq and line[:1].strip() and not line.startswith(("#", "include ", "import ")):
                keys.append(key.strip())
    return keys


def _used():
    """(macros some binding references, scopes some reference enters)."""
    references = [ref for _, ref in gin_tables.references()]
    macros = {ref.scopes[0] for ref in references if gin_tables.is_macro(ref) and ref.scopes}
    return macros, {s for ref in references for s in ref.scopes}


def _key_problems(key: str, used_macros, scopes, shown=str) -> list[str]:
    """Why binding `key` changes nothing: a macro no binding uses, a scope no reference enters.

    Args:
      key: the `X` of a binding `X = V`.
      used_macros, scopes: from `_used`.
      shown: how a name is written in the message (`--gin.{}` on the command line).
    """
    if "." not in key and "/" not in key:
        if key in used_macros:
            return []
        hint = _did_you_mean(key, used_macros, shown)
        return [f"{shown(key)} sets a macro that no binding uses{hint}"]
    problems = []
    for scope in key.split("/")[:-1]:
        if scope not in scopes:
            hint = _did_you_mean(scope, scopes)
            problems.append(
                f"{shown(key)} binds in scope '{scope}', which no reference enters{hint}"
            )
    return problems


def check_command_line(bindings) -> None:
    """Refuses command-line bindings that change nothing.

    Args:
      bindings: the command-line bindings (`X = V`), already parsed into gin.

    Raises:
      ConfigError: a macro that no binding references, or a binding in a scope that
        no reference enters; one line each, with the closest known name.
    """
    used_macros, scopes = _used()
    flag = "--gin.{}".format
    problems = [
        problem
        for key in _command_line_keys(bindings)
        for problem in _key_problems(key, used_macros, scopes, flag)
    ]
    if problems:
        raise ConfigError("\n".join(problems))


def _statements(text: str):
    """(line, key or None, [(line, macro name)]) of each statement of a gin file.

    `key` is the `X` of `X = V` (None for `include` and `import` lines); the macros are
    the `%NAME` references in the statement, at the line of each.
    """
    statement = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if statement:
                yield _statement(statement)
            statement = []
        elif token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            statement.append(token)


def _statement(tokens):
    """(line, key or None, [(line, macro name)]) of one statement's tokens (see `_statements`)."""
    key = None
    if tokens[0].string not in ("include", "import", "from"):
        equals = next((i for i, t in enumerate(tokens) if t.string == "="), None)
        if equals is not None:
            key = "".join(t.string for t in tokens[:equals])
    macros = []
    for i, token in enumerate(tokens[:-1]):
        if token.string == "%":
            name, j = tokens[i + 1].string, i + 2
            while j + 1 < len(tokens) and tokens[j].string in (".", "/"):
                name += tokens[j].string + tokens[j + 1].string
                j += 2
            macros.append((token.start[0], name))
    return tokens[0].start[0], key, macros


def _includes(text: str) -> list[str]:
    """The files a gin file includes, as written."""
    words = (line.split(None, 1) for line in text.splitlines())
    return [w[1].strip().strip("'\"") for w in words if len(w) == 2 and w[0] == "include"]


def check_gin_files(paths, resolve=None) -> None:
    """Refuses what a user's own gin files set or use that would change nothing or is never set.

    Run after the files are parsed and before gin finalizes the configuration. The
    user's files are `paths` and, recursively, the files they include that `resolve`
    finds (the repository's shipped files are left out by the caller).

    Args:
      paths: the user's gin files.
      resolve: `resolve(name) -> path or None` for an included name; None: not followed.

    Raises:
      ConfigError: one line per problem, each naming the file and line: a macro that
        no binding uses, a binding in a scope that no reference enters, a reference to
        a macro that is never set; with the closest known name.
    """
    used_macros, scopes = _used()
    bound = set(gin_tables.macro_values()) | {name for name, _ in gin_config._CONSTANTS.items()}
    problems, seen, todo = [], set(), [str(p) for p in paths]
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        text = pathlib.Path(path).read_text(encoding="utf-8")
        for line, key, macros in _statements(text):
            if key is not None:
                problems += [
                    f"{path}, line {line}: {p}" for p in _key_problems(key, used_macros, scopes)
                ]
            for at, name in macros:
                if name not in bound:
                    hint = _did_you_mean(name, bound, "%{}".format)
                    problems.append(f"{path}, line {at}: %{name} is never set{hint}")
        if resolve is not None:
            todo += [f for f in map(resolve, _includes(text)) if f is not None]
    if problems:
        raise ConfigError("\n".join(problems))


def _admits_none(annotation) -> bool:
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):
        return "None" in annotation or "Optional" in annotation
    return annotation is None or type(None) in typing.get_args(annotation)


def _how_to_set(binding: str, macros: list[str], values: str) -> str:
    flag = macros[0] if macros else binding
    return f"{binding} (set --gin.{flag}: {values})"


def _walk(selector: str, scopes: tuple[str, ...], called: bool, seen: set, missing: list):
    """Appends to `missing` the required parameters left unset under `selector`, recursively.

    Args:
      selector: a complete selector of a configurable.
      scopes: the scopes it is called in.
      called: whether gin calls it with no arguments (an evaluated reference `@x()`);
        a function passed on (`@x`) gets some arguments from its caller.
      seen: (scopes, selector) already walked.
      missing: one description per unset parameter.
    """
    found = gin_tables.first_visit(scopes, selector, seen)
    if found is None:
        return
    configurable, bindings, parameters = found
    for name, parameter in parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        binding = gin_tables.binding_name("/".join(scopes), selector, name)
        required = parameter.default is inspect.Parameter.empty
        if name not in bindings:
            if required and called:
                missing.append(f"{binding} (not bound: set --gin.{binding})")
            continue
        value, macros, value_scopes = gin_tables.resolve(bindings[name], scopes)
        if value is None and required and not _admits_none(parameter.annotation):
            missing.append(_how_to_set(binding, macros, _annotation_text(parameter.annotation)))
        for item in gin_tables.flat(value):
            item, _, item_scopes = gin_tables.resolve(item, value_scopes)
            if isinstance(item, gin_config.ConfigurableReference):
                inner = tuple(item.scopes) or item_scopes
                _walk(item.configurable.selector, inner, item.evaluate, seen, missing)


def _annotation_text(annotation) -> str:
    if annotation is inspect.Parameter.empty:
        return "a value"
    return f"a {getattr(annotation, '__name__', annotation)}"


def _seats(mode: str, entry: str) -> tuple[str, ...]:
    if mode == "eval":
        modes, _, _ = gin_tables.argument(entry, "modes")
        if isinstance(modes, (tuple, list)) and set(modes) == {"gold"}:
            return ("coder",)  # The gold mode runs the coder only.
    return REQUIRED_SEATS.get(mode, ())


def missing_required(mode: str, entry: str, passed: tuple[str, ...] = ("run_dir",)) -> list[str]:
    """What run mode `mode` needs but the parsed configuration leaves unset.

    Args:
      mode: the run mode ('eval', 'train', ...).
      entry: the complete selector of its entry function (`pau_jax.experiment.evaluate`).
      passed: the entry's parameters the launcher passes itself.

    Returns:
      One description per missing value, naming the flag that sets it.
    """
    missing = []
    for seat in _seats(mode, entry):
        value, macros, _ = gin_tables.argument(entry, seat)
        binding = gin_tables.binding_name("", entry, seat)
        if value is None:
            missing.append(_how_to_set(binding, macros, _SEAT_VALUES))
        elif isinstance(value, str) and value != SELF:
            missing.append(f"{binding} is {value!r}, not {_SEAT_VALUES}")
    found = []
    _walk(entry, (), True, set(), found)
    passed_names = {gin_tables.binding_name("", entry, name) for name in passed}
    missing += [m for m in found if m.split(" ", 1)[0] not in passed_names]
    return list(dict.fromkeys(missing))


def missing_inputs(mode: str, entry: str) -> list[str]:
    """What a run of mode `mode` would read but is not there, found without loading anything.

    Checks every checkpoint folder a seat or the actor names (config.json, whole
    safetensors weights: `hub.checkpoint_problem`), adapter folders, that the actor
    has a checkpoint or a random model, and that each dataset split is built, or
    will be built by the run. Values computed when the run starts (`@f()`) are not
    checked.

    Args:
      mode: the run mode.
      entry: the complete selector of its entry function.

    Returns:
      One line per problem.
    """
    problems = []
    for selector, values, macros in gin_tables.calls(entry, (), set()):
        problems += run_inputs.input_problems(selector.rsplit(".", 1)[-1], values, macros, mode)
    return list(dict.fromkeys(problems))
