"""AST anonymisation: entry function -> test_func(arg0, ...), without docstrings or annotations."""

import ast
import dataclasses
import warnings

from pau_jax.data.sources import parse_quietly

ENTRY_NAME = "test_func"
# Name of a recursive test_func's body once a validating wrapper takes its name.
INNER_NAME = "_test_func"
ARG_PREFIX = "arg"

_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class AnonymizeError(Exception):
    """The code cannot be anonymised; the message is a short exclusion reason."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Anonymized:
    """Result of anonymisation.

    Attributes:
      code: the anonymised module (imports, helpers, test_func).
      header: the first line of the entry function, e.g. "def test_func(arg0, arg1):".
      arg_names: new parameter names ("arg0", ...).
      original_arg_names: the entry function's original parameter names.
    """

    code: str
    header: str
    arg_names: tuple[str, ...]
    original_arg_names: tuple[str, ...]


def _binding_kind(scope: ast.AST, name: str) -> str:
    """How `name` is bound directly in a scope: "local", "global", "nonlocal" or "free"."""
    declared = None
    bound = False
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        a = scope.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
        bound = any(p is not None and p.arg == name for p in params)
    body = scope.body if isinstance(scope.body, list) else [scope.body]
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Global | ast.Nonlocal) and name in node.names:
            declared = "global" if isinstance(node, ast.Global) else "nonlocal"
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            bound |= node.id == name
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound |= node.name == name
            stack.extend(node.decorator_list)
            if not isinstance(node, ast.ClassDef):
                stack.extend([*node.args.defaults, *(d for d in node.args.kw_defaults if d)])
            else:
                stack.extend([*node.bases, *(k.value for k in node.keywords)])
            continue
        elif isinstance(node, ast.Lambda):
            stack.extend([*node.args.defaults, *(d for d in node.args.kw_defaults if d)])
            continue
        elif isinstance(node, _COMPREHENSIONS):
            stack.append(node.generators[0].iter)
            # Walrus targets inside a comprehension bind in the enclosing scope.
            stack.extend(n for n in ast.walk(node) if isinstance(n, ast.NamedExpr))
            continue
        elif isinstance(node, ast.alias):
            bound |= (node.asname or node.name.split(".")[0]) == name
        elif isinstance(node, ast.ExceptHandler):
            bound |= node.name == name
        elif isinstance(node, ast.MatchAs | ast.MatchStar):
            bound |= node.name == name
        elif isinstance(node, ast.MatchMapping):
            bound |= node.rest == name
        stack.extend(ast.iter_child_nodes(node))
    if declared:
        return declared
    return "local" if bound else "free"


class ScopedRenamer(ast.NodeTransformer):
    """Renames the references to one binding, respecting Python's scoping rules.

    Args:
      old: the name to replace.
      new: its replacement.
      target_is_global: True when the binding is a module global, False when it is a
        local of the function whose body is visited.
    """

    def __init__(self, old: str, new: str, target_is_global: bool):
        self.old, self.new, self.target_is_global = old, new, target_is_global
        self.active = True

    def _inner_active(self, scope: ast.AST) -> bool:
        kind = _binding_kind(scope, self.old)
        if kind == "local":
            return False
        if kind == "global":
            return self.target_is_global
        return self.active

    def _visit_with(self, nodes, active: bool):
        saved, self.active = self.active, active
        for node in nodes:
            self.visit(node)
        self.active = saved

    def visit_Name(self, node: ast.Name):
        if self.active and node.id == self.old:
            node.id = self.new
        return node

    def visit_Global(self, node: ast.Global):
        if self.target_is_global and node.names.count(self.old):
            node.names = [self.new if n == self.old else n for n in node.names]
        return node

    def visit_Nonlocal(self, node: ast.Nonlocal):
        if not self.target_is_global and self.active and node.names.count(self.old):
            node.names = [self.new if n == self.old else n for n in node.names]
        return node

    def visit_alias(self, node: ast.alias):
        if self.active and (node.asname or node.name.split(".")[0]) == self.old:
            if node.asname is None and "." in node.name:
                raise AnonymizeError("dotted import shadows a renamed name")
            node.asname = self.new
        return node

    def visit_ExceptHandler(self, node: ast.ExceptHandler):
        if self.active and node.name == self.old:
            node.name = self.new
        self.generic_visit(node)
        return node

    def _visit_function(self, node, body_base=None):
        decorators = getattr(node, "decorator_list", [])
        self._visit_with([*decorators, *node.args.defaults], self.active)
        self._visit_with([d for d in node.args.kw_defaults if d], self.active)
        if self.active and getattr(node, "name", None) == self.old:
            node.name = self.new
        if body_base is not None:
            self.active, saved = body_base, self.active
            inner = self._inner_active(node)
            self.active = saved
        else:
            inner = self._inner_active(node)
        body = node.body if isinstance(node.body, list) else [node.body]
        self._visit_with(body, inner)
        return node

    def visit_FunctionDef(self, node):
        return self._visit_function(node)

    def visit_AsyncFunctionDef(self, node):
        return self._visit_function(node)

    def visit_Lambda(self, node):
        return self._visit_function(node)

    def visit_ClassDef(self, node: ast.ClassDef):
        self._visit_with([*node.decorator_list, *node.bases, *node.keywords], self.active)
        if self.active and node.name == self.old:
            node.name = self.new
        class_active = self._inner_active(node)
        saved = self.active
        for stmt in node.body:
            self.active = class_active
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                # Decorators and defaults run in the class scope; the body skips it.
                self._visit_function(stmt, body_base=saved)
            elif isinstance(stmt, ast.ClassDef):
                self.visit_ClassDef(stmt)
            else:
                self.visit(stmt)
        self.active = saved
        return node

    def _visit_comprehension(self, node):
        first = node.generators[0]
        self._visit_with([first.iter], self.active)
        targets = {
            n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)
        }
        inner = self.active and self.old not in targets
        rest = [first.target, *first.ifs]
        for gen in node.generators[1:]:
            rest.extend([gen.target, gen.iter, *gen.ifs])
        elts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        self._visit_with([*rest, *elts], inner)
        return node

    visit_ListComp = _visit_comprehension
    visit_SetComp = _visit_comprehension
    visit_DictComp = _visit_comprehension
    visit_GeneratorExp = _visit_comprehension


class _Cleaner(ast.NodeTransformer):
    """Drops docstrings and annotations."""

    def _drop_docstring(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                body = body[1:]
        node.body = body or [ast.Pass()]

    def visit_Module(self, node):
        self.generic_visit(node)
        self._drop_docstring(node)
        return node

    def _visit_def(self, node):
        self.generic_visit(node)
        self._drop_docstring(node)
        if not isinstance(node, ast.ClassDef):
            node.returns = None
        return node

    visit_FunctionDef = _visit_def
    visit_AsyncFunctionDef = _visit_def
    visit_ClassDef = _visit_def

    def visit_arg(self, node: ast.arg):
        node.annotation = None
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign):
        self.generic_visit(node)
        if node.value is None:
            return ast.Pass()
        return ast.Assign(targets=[node.target], value=node.value)


def _identifiers(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def anonymize(code: str, entry_point: str) -> Anonymized:
    """Renames the entry function to test_func and its parameters to arg0..argN.

    References are renamed by scope (strings, attributes and shadowing bindings are
    left alone); helpers and imports are kept; docstrings and annotations are dropped.

    Args:
      code: a Python module defining `entry_point` at top level.
      entry_point: name of the function under study.

    Returns:
      The anonymised code and its header.

    Raises:
      AnonymizeError: unsupported code; the message is an exclusion reason.
    """
    try:
        tree = parse_quietly(code)
    except SyntaxError as e:
        raise AnonymizeError("syntax error") from e
    defs = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == entry_point
    ]
    if not defs:
        raise AnonymizeError("entry function not found")
    if len(defs) > 1:
        raise AnonymizeError("entry function defined twice")
    func = defs[0]
    if isinstance(func, ast.AsyncFunctionDef):
        raise AnonymizeError("async entry function")
    a = func.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.defaults:
        raise AnonymizeError("unsupported signature (defaults, *args, **kwargs or keyword-only)")
    params = [p.arg for p in [*a.posonlyargs, *a.args]]
    new_args = [f"{ARG_PREFIX}{i}" for i in range(len(params))]
    others = _identifiers(tree) - {entry_point} - set(params)
    if others & {ENTRY_NAME, INNER_NAME, "validate_input_args", *new_args}:
        raise AnonymizeError("name collision with test_func or argN")

    ScopedRenamer(entry_point, ENTRY_NAME, target_is_global=True).visit(tree)
    for old, new in zip(params, new_args):
        renamer = ScopedRenamer(old, new, target_is_global=False)
        renamer.active = _binding_kind(func, old) == "local"
        for stmt in func.body:
            renamer.visit(stmt)
        for p in [*a.posonlyargs, *a.args]:
            if p.arg == old:
                p.arg = new
    mapping = dict(zip(params, new_args))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == ENTRY_NAME:
                for kw in node.keywords:
                    kw.arg = mapping.get(kw.arg, kw.arg)
    tree = _Cleaner().visit(tree)
    ast.fix_missing_locations(tree)
    new_code = ast.unparse(tree) + "\n"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        compile(new_code, "<anonymized>", "exec")
    parts = list(new_args)
    if a.posonlyargs:
        parts.insert(len(a.posonlyargs), "/")
    signature = ", ".join(parts)
    return Anonymized(
        code=new_code,
        header=f"def {ENTRY_NAME}({signature}):",
        arg_names=tuple(new_args),
        original_arg_names=tuple(params),
    )
