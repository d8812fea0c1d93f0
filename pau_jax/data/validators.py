"""Input validators: `validate_input_args` synthesised from observed argument types, and its insertion."""

import ast
from collections.abc import Sequence

from pau_jax.data import argtypes
from pau_jax.data.anonymize import ENTRY_NAME, INNER_NAME, ScopedRenamer

VALIDATOR_NAME = "validate_input_args"


def _check(expr: str, spec: argtypes.TypeSpec, depth: int) -> str:
    """A Python boolean expression that is True when `expr` belongs to `spec`."""
    kind = spec.kind
    if kind == "any":
        return "True"
    if kind == "None":
        return f"{expr} is None"
    if kind in argtypes.SCALARS:
        return f"type({expr}) is {kind}"
    if kind == "union":
        return "(" + " or ".join(_check(expr, m, depth) for m in spec.args) + ")"
    var = f"x{depth}"
    if kind in ("list", "set", "frozenset", "tuple..."):
        container = "tuple" if kind == "tuple..." else kind
        if spec.args[0] == argtypes.NEVER:
            return f"type({expr}) is {container}"
        inner = _check(var, spec.args[0], depth + 1)
        if inner == "True":
            return f"type({expr}) is {container}"
        return f"(type({expr}) is {container} and all({inner} for {var} in {expr}))"
    if kind == "dict":
        key, value = f"k{depth}", f"v{depth}"
        parts = [
            c
            for c in (
                _check(key, spec.args[0], depth + 1) if spec.args[0] != argtypes.NEVER else "True",
                _check(value, spec.args[1], depth + 1)
                if spec.args[1] != argtypes.NEVER
                else "True",
            )
            if c != "True"
        ]
        if not parts:
            return f"type({expr}) is dict"
        joined = " and ".join(parts)
        return f"(type({expr}) is dict and all({joined} for {key}, {value} in {expr}.items()))"
    if kind == "tuple":
        parts = [f"type({expr}) is tuple", f"len({expr}) == {len(spec.args)}"]
        parts += [
            c
            for i, a in enumerate(spec.args)
            if (c := _check(f"{expr}[{i}]", a, depth + 1)) != "True"
        ]
        return "(" + " and ".join(parts) + ")"
    raise ValueError(f"cannot write a check for type {spec}")


def validator_source(arg_names: Sequence[str], specs: Sequence[argtypes.TypeSpec]) -> str:
    """Source of `validate_input_args(arg0, ...)`.

    The function raises TypeError("argK must be <type>, got <type name>") for the first
    argument outside its type, and returns None otherwise.

    Args:
      arg_names: parameter names, e.g. ("arg0", "arg1").
      specs: one TypeSpec per parameter.
    """
    if len(arg_names) != len(specs):
        raise ValueError(f"{len(arg_names)} arguments but {len(specs)} types")
    lines = [f"def {VALIDATOR_NAME}({', '.join(arg_names)}):"]
    for name, spec in zip(arg_names, specs):
        check = _check(name, spec, 0)
        if check == "True":
            continue
        message = f"{name} must be {spec}, got "
        lines.append(f"    if not {check}:")
        lines.append(f"        raise TypeError({message!r} + type({name}).__name__)")
    if len(lines) == 1:
        lines.append("    return None")
    return "\n".join(lines) + "\n"


def attach(code: str, validator: str) -> str:
    """Inserts the validator before test_func and calls it first inside test_func.

    When test_func refers to itself (recursion), the anonymised function becomes
    `_test_func` and test_func is a wrapper that validates and calls it, so that only the
    outermost call is validated.

    Args:
      code: anonymised module defining test_func.
      validator: source of validate_input_args.

    Returns:
      The executable code ("test_func_validated").
    """
    tree = ast.parse(code)
    entries = [
        i
        for i, node in enumerate(tree.body)
        if isinstance(node, ast.FunctionDef) and node.name == ENTRY_NAME
    ]
    if not entries:
        raise ValueError(f"no top-level {ENTRY_NAME} in the code")
    index = entries[0]
    node = tree.body[index]
    names = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
    call = ast.parse(f"{VALIDATOR_NAME}({', '.join(names)})").body[0]
    recursive = any(isinstance(n, ast.Name) and n.id == ENTRY_NAME for n in ast.walk(tree))
    if recursive:
        ScopedRenamer(ENTRY_NAME, INNER_NAME, target_is_global=True).visit(tree)
        wrapper = ast.parse(
            f"def {ENTRY_NAME}({', '.join(names)}):\n    return {INNER_NAME}({', '.join(names)})\n"
        ).body[0]
        wrapper.args = node.args
        wrapper.body.insert(0, call)
        tree.body.insert(index + 1, wrapper)
    else:
        node.body.insert(0, call)
    tree.body.insert(index, ast.parse(validator).body[0])
    ast.fix_missing_locations(tree)
    return ast.unparse(tree) + "\n"
