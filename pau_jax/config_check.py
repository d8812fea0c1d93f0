"""Checks of a gin configuration before a run: names that match nothing, required values unset.

Gin accepts a command-line macro that no binding uses (`--gin.ADAPTR=...` next to
`%ADAPTER`) and a binding in a scope that no reference enters; both would leave
the run silently on its defaults, so `check_command_line` refuses them with a
"did you mean" hint. Gin's own errors about unknown names are shortened by
`explain`, with the same kind of hint. `missing_required` lists what a run mode
needs but the configuration leaves unset: a seat (the eval judge and coder, the
distillation teacher) or a required field bound to None (`CHECKPOINT = None`),
found without calling anything, so no model is loaded.

Reads gin-config 0.5.0's tables (`gin.config._CONFIG`, `gin.config._REGISTRY`).
"""

import difflib
import inspect
import re
import tokenize
import typing

import gin
from gin import config as gin_config

from pau_jax.policy.backends import SELF

_MACRO = "gin.macro"
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


def _selectors(given: str) -> list[str]:
    """Registered selectors, cut to as many dotted components as `given` has."""
    n = given.count(".") + 1
    return [
        ".".join(s.split(".")[-n:])
        for s, _ in gin_config._REGISTRY.items()
        if not s.startswith("gin.")
    ]


def _parameters(selector: str) -> list[str]:
    configurable = gin_config._REGISTRY.get_match(selector)
    if configurable is None:
        return []
    try:
        return list(inspect.signature(configurable.wrapped).parameters)
    except (TypeError, ValueError):  # A callable without a signature (a builtin).
        return []


def _macro_values() -> dict[str, object]:
    return {
        scope: args.get("value")
        for (scope, sel), args in gin_config._CONFIG.items()
        if sel == _MACRO
    }


def _is_macro(value) -> bool:
    return (
        isinstance(value, gin_config.ConfigurableReference)
        and value.configurable.wrapped is gin_config.macro
    )


def _flat(value):
    """`value` and everything nested in it (tuples, lists, dicts)."""
    yield value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flat(item)


def _references():
    """(binding, reference) for every reference in the configuration (macros included)."""
    for (scope, selector), args in gin_config._CONFIG.items():
        for name, value in args.items():
            binding = scope if selector == _MACRO else _binding_name(scope, selector, name)
            for item in _flat(value):
                if isinstance(item, gin_config.ConfigurableReference):
                    yield binding, item


def _binding_name(scope: str, selector: str, name: str) -> str:
    minimal = gin_config._REGISTRY.minimal_selector(selector)
    return f"{scope}/{minimal}.{name}" if scope else f"{minimal}.{name}"


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
        head = f"unknown configurable '@{given}'{_did_you_mean(given, _selectors(given))}"
    elif m := _UNKNOWN_CONFIGURABLE.match(head):
        given = m["selector"]
        head = f"unknown configurable '{given}'{_did_you_mean(given, _selectors(given))}"
    elif m := _UNKNOWN_PARAMETER.match(head):
        hint = _did_you_mean(m["name"], _parameters(m["selector"]))
        head = f"'{m['selector']}' has no parameter '{m['name']}'{hint}"
    elif m := _UNSET_MACRO.match(head):
        name = m["name"]
        users = sorted({b for b, ref in _references() if _is_macro(ref) and ref.scopes == [name]})
        hint = _did_you_mean(name, [n for n in _macro_values() if n != name], "%{}".format)
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


def check_command_line(bindings) -> None:
    """Refuses command-line bindings that change nothing.

    Args:
      bindings: the command-line bindings (`X = V`), already parsed into gin.

    Raises:
      ConfigError: a macro that no binding references, or a binding in a scope that
        no reference enters; one line each, with the closest known name.
    """
    references = [ref for _, ref in _references()]
    used_macros = {ref.scopes[0] for ref in references if _is_macro(ref) and ref.scopes}
    scopes = {s for ref in references for s in ref.scopes}
    problems = []
    for key in _command_line_keys(bindings):
        if "." not in key and "/" not in key:
            if key not in used_macros:
                hint = _did_you_mean(key, used_macros, "--gin.{}".format)
                problems.append(f"--gin.{key} sets a macro that no binding uses{hint}")
            continue
        for scope in key.split("/")[:-1]:
            if scope not in scopes:
                hint = _did_you_mean(scope, scopes)
                problems.append(
                    f"--gin.{key} binds in scope '{scope}', which no reference enters{hint}"
                )
    if problems:
        raise ConfigError("\n".join(problems))


def _resolve(value, scopes: tuple[str, ...]):
    """(value with macros followed, the macro names followed, the scopes it is evaluated in).

    As in gin, a reference with a scope (`@judge/x()`, and a macro `%X`, which is
    `@X/gin.macro()`) is called in that scope alone; one without inherits `scopes`.
    """
    macros, values = [], _macro_values()
    while _is_macro(value) and value.scopes:
        name = "/".join(value.scopes)
        macros.append(name)
        scopes = tuple(value.scopes)
        value = values.get(name)
    return value, macros, scopes


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
    if (scopes, selector) in seen:
        return
    seen.add((scopes, selector))
    configurable = gin_config._REGISTRY.get_match(selector)
    if configurable is None:
        return
    bindings = gin.get_bindings("/".join((*scopes, selector)), resolve_references=False)
    try:
        parameters = inspect.signature(configurable.wrapped).parameters
    except (TypeError, ValueError):
        parameters = {}
    for name, parameter in parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        binding = _binding_name("/".join(scopes), selector, name)
        required = parameter.default is inspect.Parameter.empty
        if name not in bindings:
            if required and called:
                missing.append(f"{binding} (not bound: set --gin.{binding})")
            continue
        value, macros, value_scopes = _resolve(bindings[name], scopes)
        if value is None and required and not _admits_none(parameter.annotation):
            missing.append(_how_to_set(binding, macros, _annotation_text(parameter.annotation)))
        for item in _flat(value):
            item, _, item_scopes = _resolve(item, value_scopes)
            if isinstance(item, gin_config.ConfigurableReference):
                inner = tuple(item.scopes) or item_scopes
                _walk(item.configurable.selector, inner, item.evaluate, seen, missing)


def _annotation_text(annotation) -> str:
    if annotation is inspect.Parameter.empty:
        return "a value"
    return f"a {getattr(annotation, '__name__', annotation)}"


def _argument(selector: str, name: str):
    """The value gin gives parameter `name` of `selector` (its default when unbound)."""
    bindings = gin.get_bindings(selector, resolve_references=False)
    if name in bindings:
        return _resolve(bindings[name], ())
    configurable = gin_config._REGISTRY.get_match(selector)
    default = inspect.signature(configurable.wrapped).parameters[name].default
    return default, [], ()


def _seats(mode: str, entry: str) -> tuple[str, ...]:
    if mode == "eval":
        modes, _, _ = _argument(entry, "modes")
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
        value, macros, _ = _argument(entry, seat)
        binding = _binding_name("", entry, seat)
        if value is None:
            missing.append(_how_to_set(binding, macros, _SEAT_VALUES))
        elif isinstance(value, str) and value != SELF:
            missing.append(f"{binding} is {value!r}, not {_SEAT_VALUES}")
    found = []
    _walk(entry, (), True, set(), found)
    passed_names = {_binding_name("", entry, name) for name in passed}
    missing += [m for m in found if m.split(" ", 1)[0] not in passed_names]
    return list(dict.fromkeys(missing))
