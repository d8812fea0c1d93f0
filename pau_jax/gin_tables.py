"""What gin-config 0.5.0's tables hold, read without calling anything: names, macros, bindings.

The registered selectors and their parameters (`gin.config._REGISTRY`), the macros and
references of the parsed configuration (`gin.config._CONFIG`), macros followed as gin
follows them (`resolve`), and the configurables a run calls with the values it gives
them (`calls`). `config_check.py` builds its checks on these.
"""

import dataclasses
import inspect

import gin
from gin import config as gin_config

# The selector gin keeps a macro under (`%X` is `@X/gin.macro()`).
MACRO = "gin.macro"


def selectors(given: str) -> list[str]:
    """Registered selectors, cut to as many dotted components as `given` has."""
    n = given.count(".") + 1
    return [
        ".".join(s.split(".")[-n:])
        for s, _ in gin_config._REGISTRY.items()
        if not s.startswith("gin.")
    ]


def parameter_names(selector: str) -> list[str]:
    """The parameters of the configurable `selector` names ([] if none, or no signature)."""
    configurable = gin_config._REGISTRY.get_match(selector)
    if configurable is None:
        return []
    try:
        return list(inspect.signature(configurable.wrapped).parameters)
    except (TypeError, ValueError):  # A callable without a signature (a builtin).
        return []


def macro_values() -> dict[str, object]:
    """Macro name -> its value, for every macro the configuration sets."""
    return {
        scope: args.get("value")
        for (scope, sel), args in gin_config._CONFIG.items()
        if sel == MACRO
    }


def is_macro(value) -> bool:
    """Whether `value` is a macro (`%X`), which gin keeps as a reference."""
    return (
        isinstance(value, gin_config.ConfigurableReference)
        and value.configurable.wrapped is gin_config.macro
    )


def flat(value):
    """`value` and everything nested in it (tuples, lists, dicts)."""
    yield value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from flat(item)


def references():
    """(binding, reference) for every reference in the configuration (macros included)."""
    for (scope, selector), args in gin_config._CONFIG.items():
        for name, value in args.items():
            binding = scope if selector == MACRO else binding_name(scope, selector, name)
            for item in flat(value):
                if isinstance(item, gin_config.ConfigurableReference):
                    yield binding, item


def binding_name(scope: str, selector: str, name: str) -> str:
    """Parameter `name` of `selector` in `scope`, written as a binding (`scope/x.name`)."""
    minimal = gin_config._REGISTRY.minimal_selector(selector)
    return f"{scope}/{minimal}.{name}" if scope else f"{minimal}.{name}"


def resolve(value, scopes: tuple[str, ...]):
    """(value with macros followed, the macro names followed, the scopes it is evaluated in).

    As in gin, a reference with a scope (`@judge/x()`, and a macro `%X`, which is
    `@X/gin.macro()`) is called in that scope alone; one without inherits `scopes`.
    """
    macros, values = [], macro_values()
    while is_macro(value) and value.scopes:
        name = "/".join(value.scopes)
        macros.append(name)
        scopes = tuple(value.scopes)
        value = values.get(name)
    return value, macros, scopes


def first_visit(scopes: tuple, selector: str, seen: set):
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


def argument(selector: str, name: str):
    """The value gin gives parameter `name` of `selector` (its default when unbound)."""
    bindings = gin.get_bindings(selector, resolve_references=False)
    if name in bindings:
        return resolve(bindings[name], ())
    configurable = gin_config._REGISTRY.get_match(selector)
    default = inspect.signature(configurable.wrapped).parameters[name].default
    return default, [], ()


def calls(selector: str, scopes: tuple[str, ...], seen: set):
    """(selector, {parameter: value}, {parameter: macro}) of each configurable the run calls.

    `selector` is called in `scopes` with no arguments, and so is every configurable
    its values evaluate (`@x()`), recursively; macros are followed (the first one of
    each parameter is given) and unbound parameters have their defaults. A function
    passed on (`@x`) is left out: its caller may give it other arguments.
    """
    found = first_visit(scopes, selector, seen)
    if found is None:
        return
    configurable, bindings, parameters = found
    values, macros = {}, {}
    for name, parameter in parameters.items():
        if name in bindings:
            value, followed, value_scopes = resolve(bindings[name], scopes)
            macros.update({name: followed[0]} if followed else {})
        else:
            value, value_scopes = parameter.default, scopes
        values[name] = value
        for item in flat(value):
            item, _, item_scopes = resolve(item, value_scopes)
            if isinstance(item, gin_config.ConfigurableReference) and item.evaluate:
                inner = tuple(item.scopes) or item_scopes
                yield from calls(item.configurable.selector, inner, seen)
            elif dataclasses.is_dataclass(item) and not isinstance(item, type):
                fields = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
                yield type(item).__name__, fields, {}  # A default value, e.g. `ActorConfig()`.
    yield configurable.selector, values, macros
