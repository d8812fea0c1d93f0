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

Reads gin-config 0.5.0's tables (`gin.config._CONFIG`, `gin.config._REGISTRY`).
"""

import dataclasses
import difflib
import inspect
import io
import json
import pathlib
import re
import tokenize
import typing

import gin
from gin import config as gin_config

from pau_jax import hub
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


def _used():
    """(macros some binding references, scopes some reference enters)."""
    references = [ref for _, ref in _references()]
    macros = {ref.scopes[0] for ref in references if _is_macro(ref) and ref.scopes}
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
    bound = set(_macro_values()) | {name for name, _ in gin_config._CONSTANTS.items()}
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


def _first_visit(scopes: tuple, selector: str, seen: set):
    """(configurable, bindings, parameters) of `selector` called in `scopes`, the first time.

    None when it was walked already or gin knows no such configurable; `seen` records it.
    """
    if (scopes, selector) in seen:
        return None
    seen.add((scopes, selector))
    configurable = gin_config._REGISTRY.get_match(selector)
    if configurable is None:
        return None
    bindings = gin.get_bindings("/".join((*scopes, selector)), resolve_references=False)
    try:
        parameters = inspect.signature(configurable.wrapped).parameters
    except (TypeError, ValueError):
        parameters = {}
    return configurable, bindings, parameters


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
    found = _first_visit(scopes, selector, seen)
    if found is None:
        return
    configurable, bindings, parameters = found
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


def _calls(selector: str, scopes: tuple[str, ...], seen: set):
    """(selector, {parameter: value}, {parameter: macro}) of each configurable the run calls.

    `selector` is called in `scopes` with no arguments, and so is every configurable
    its values evaluate (`@x()`), recursively; macros are followed (the first one of
    each parameter is given) and unbound parameters have their defaults. A function
    passed on (`@x`) is left out: its caller may give it other arguments.
    """
    found = _first_visit(scopes, selector, seen)
    if found is None:
        return
    configurable, bindings, parameters = found
    values, macros = {}, {}
    for name, parameter in parameters.items():
        if name in bindings:
            value, followed, value_scopes = _resolve(bindings[name], scopes)
            macros.update({name: followed[0]} if followed else {})
        else:
            value, value_scopes = parameter.default, scopes
        values[name] = value
        for item in _flat(value):
            item, _, item_scopes = _resolve(item, value_scopes)
            if isinstance(item, gin_config.ConfigurableReference) and item.evaluate:
                inner = tuple(item.scopes) or item_scopes
                yield from _calls(item.configurable.selector, inner, seen)
            elif dataclasses.is_dataclass(item) and not isinstance(item, type):
                fields = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
                yield type(item).__name__, fields, {}  # A default value, e.g. `ActorConfig()`.
    yield configurable.selector, values, macros


def _dataset_problem(config, split, data_dir, manual_dir, build: bool) -> str | None:
    """Why split `split` (None: any) of `pau/<config>` under `data_dir` is not built nor buildable."""
    from pau_jax.tasks import pau_dataset

    if not (isinstance(config, str) and isinstance(data_dir, str)):
        return None  # Computed when the run starts.
    root = pathlib.Path(data_dir).expanduser() / pau_dataset.DATASET_NAME / config
    infos = sorted(root.glob("*/dataset_info.json"))
    if infos:
        try:
            splits = {s["name"] for s in json.loads(infos[-1].read_text())["splits"]}
        except (json.JSONDecodeError, KeyError, TypeError):
            return f"{infos[-1]} is not valid (cut short?); rebuild pau/{config}"
        if not isinstance(split, str) or split in splits:
            return None
        return f"pau/{config} under {data_dir} has no split {split!r} (it has {sorted(splits)})"
    if build and isinstance(manual_dir, str):
        if pathlib.Path(manual_dir).expanduser().is_dir():
            return None
        return (
            f"pau/{config} is not built under {data_dir}, and manual_dir {manual_dir} "
            "is not a folder"
        )
    if build and config == "debug":
        return None  # Built from the builder's dummy data.
    return (
        f"pau/{config} is not built under {data_dir}; build it (docs/dataset.md), or "
        "pass DATA_DIR/DATASET_CONFIG of a built one"
    )


def _adapter_problem(path: str) -> str | None:
    folder = pathlib.Path(path).expanduser()
    if not (folder / "adapter_config.json").is_file():
        return f"adapter {folder} has no adapter_config.json (not a PEFT adapter folder)"
    return None


def _actor_problem(values: dict, macros: dict) -> str | None:
    if values.get("checkpoint") is None and values.get("model_config") is None:
        flag = macros.get("checkpoint", "pau_jax.training.run.ActorConfig.checkpoint")
        return (
            f"the actor has no checkpoint (set --gin.{flag}: a Hugging Face model "
            "directory) and no ActorConfig.model_config (a random model)"
        )
    return None


def _input_problems(name: str, values: dict, macros: dict, mode: str) -> list[str]:
    """What configurable `name` called with `values` would read but is not there."""
    paths = {
        "ActorConfig": ("checkpoint",),
        "LocalBackendConfig": ("checkpoint_dir",),
        "LocalEmbeddingConfig": ("checkpoint_dir",),
        "quickstart": ("checkpoint",),
    }.get(name, ())
    get = values.get
    problems = [hub.checkpoint_problem(get(p)) for p in paths if isinstance(get(p), str)]
    if name == "ActorConfig" and mode != "quickstart":  # quickstart gives the actor its model
        problems.append(_actor_problem(values, macros))
    if name == "LocalBackendConfig" and isinstance(get("adapter_dir"), str):
        problems.append(_adapter_problem(get("adapter_dir")))
    if name == "DatasetConfig":
        build = get("build_if_missing") is True
        problems.append(
            _dataset_problem(get("config"), get("split"), get("data_dir"), get("manual_dir"), build)
        )
    if name == "quickstart":  # It builds its dataset when missing.
        config, data_dir = get("dataset_config"), get("data_dir")
        problems.append(_dataset_problem(config, None, data_dir, get("manual_dir"), True))
    return [p for p in problems if p is not None]


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
    for selector, values, macros in _calls(entry, (), set()):
        problems += _input_problems(selector.rsplit(".", 1)[-1], values, macros, mode)
    return list(dict.fromkeys(problems))
