"""Static safety filter: rejects functions that touch the system, the network or the interpreter."""

import ast

from pau_jax.data.sources import parse_quietly

BANNED_MODULES = frozenset(
    {
        "asyncio",
        "builtins",
        "ctypes",
        "ftplib",
        "gc",
        "glob",
        "http",
        "importlib",
        "inspect",
        "io",
        "marshal",
        "mmap",
        "multiprocessing",
        "os",
        "pathlib",
        "pickle",
        "platform",
        "pty",
        "requests",
        "resource",
        "shelve",
        "shutil",
        "signal",
        "smtplib",
        "socket",
        "sqlite3",
        "subprocess",
        "sys",
        "tempfile",
        "threading",
        "urllib",
        "webbrowser",
        "zipfile",
    }
)
BANNED_CALLS = frozenset(
    {
        "__import__",
        "breakpoint",
        "compile",
        "eval",
        "exec",
        "exit",
        "globals",
        "input",
        "locals",
        "open",
        "quit",
        "vars",
    }
)
# Attribute names that reach into interpreter internals.
BANNED_ATTRIBUTES = frozenset(
    {
        "__builtins__",
        "__class__",
        "__code__",
        "__dict__",
        "__globals__",
        "__subclasses__",
        "__bases__",
        "__mro__",
        "__getattribute__",
        "f_globals",
        "f_locals",
        "gi_frame",
    }
)


def _bound_names(tree: ast.AST) -> set[str]:
    """Names the code binds itself (parameters, assignments, definitions); imports excluded."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
    return bound


def unsafe_reasons(code: str) -> tuple[str, ...]:
    """Lists why a piece of code is unsafe to run in the benchmark.

    Args:
      code: a Python module.

    Returns:
      Sorted distinct reasons such as "import os" or "call open"; empty when the code
      passes the filter. Code that does not parse is reported as "syntax error".
    """
    try:
        tree = parse_quietly(code)
    except SyntaxError:
        return ("syntax error",)
    reasons = set()
    bound = _bound_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] if node.level == 0 else ["relative import"]
        else:
            modules = []
        for module in modules:
            root = module.split(".")[0]
            if root in BANNED_MODULES or module == "relative import":
                reasons.add(f"import {root}")
        if isinstance(node, ast.Name) and node.id not in bound:
            if node.id in BANNED_CALLS:
                reasons.add(f"call {node.id}")
            elif node.id in BANNED_MODULES:
                reasons.add(f"name {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRIBUTES:
            reasons.add(f"attribute {node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in BANNED_ATTRIBUTES:
                reasons.add(f"string {node.value}")
    return tuple(sorted(reasons))


def is_safe(code: str) -> bool:
    """True when `unsafe_reasons(code)` is empty."""
    return not unsafe_reasons(code)
