"""The import graph: no cycle between packages, and every BUILD `deps` list equals the imports.

Every ``import`` of every file is read with ``ast`` (including imports inside
functions, which a lazy import would otherwise hide). A node is a subpackage of
``pau_jax`` (``//pau_jax/rl``) or a top-level module (``//pau_jax:parallel``),
which is also the Bazel label of its library. The layering in
``docs/architecture.md`` is what this test keeps true.
"""

import ast
import pathlib

import pytest
from buildfiles import ROOT, _build_files, _evaluate

PACKAGE = "pau_jax"
# Subpackages that are a bag of separate programs: each module is its own node and library.
PER_MODULE = ("tools",)
# experiment.py imports the modules named in these tables by string (importlib), for gin.
STRING_TABLES = ("CONFIG_MODULES", "FUNCTIONS", "ENTRIES")


def label_of(module: str, root: pathlib.Path = ROOT) -> str | None:
    """The Bazel label of the library that holds ``module`` (None outside the package)."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) == 1:
        return f"//{PACKAGE}"
    if parts[1] in PER_MODULE and len(parts) > 2:
        return f"//{PACKAGE}/{parts[1]}:{parts[2]}"
    if (root / PACKAGE / parts[1]).is_dir():
        return f"//{PACKAGE}/{parts[1]}"
    if (root / PACKAGE / f"{parts[1]}.py").is_file():
        return f"//{PACKAGE}:{parts[1]}"
    return f"//{PACKAGE}"  # An attribute of the package's __init__ (e.g. __version__).


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: pathlib.Path, root: pathlib.Path = ROOT) -> set[str]:
    """Every module a file imports, anywhere in it; ``from a import b`` counts as ``a.b``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in tree.body:  # Module names given as strings in the tables importlib reads.
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in STRING_TABLES for t in node.targets
        ):
            found.update(
                c.value
                for c in ast.walk(node.value)
                if isinstance(c, ast.Constant)
                and isinstance(c.value, str)
                and c.value.startswith(f"{PACKAGE}.")
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from a import b`: b is a module of a or an attribute of it (then a.b maps to a).
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _labels(modules, root: pathlib.Path = ROOT) -> set[str]:
    return {label for label in map(lambda m: label_of(m, root), modules) if label is not None}


def package_graph(root: pathlib.Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """label -> {imported label: [files that import it]}, between different labels."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        source = label_of(_module_name(path, root), root)
        edges = graph.setdefault(source, {})
        for target in _labels(imported_modules(path, root), root):
            if target != source:
                edges.setdefault(target, []).append(str(path.relative_to(root)))
    return graph


def cycles(graph: dict[str, dict]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def _package_label(build: pathlib.Path) -> str:
    relative = build.parent.relative_to(ROOT)
    return "//" + ("" if relative == pathlib.Path(".") else str(relative))


def normalise(dep: str, package: str) -> str | None:
    """The graph node a BUILD dep names (None outside pau_jax): subpackages are one node."""
    if dep.startswith(":"):
        return None  # A rule of the same package: not an edge between nodes.
    if dep.startswith(f"//{PACKAGE}/") and dep.split("/")[3].split(":")[0] in PER_MODULE:
        return dep
    if dep.startswith(f"//{PACKAGE}/"):
        return dep.split(":")[0]
    if dep == f"//{PACKAGE}:{PACKAGE}" or dep == f"//{PACKAGE}":
        return f"//{PACKAGE}"
    if dep.startswith(f"//{PACKAGE}:"):
        return dep
    return None


def rule_deps(build: pathlib.Path, kwargs: dict, root: pathlib.Path = ROOT):
    """(nodes the rule's sources import, nodes its deps name), each without the rule itself."""
    package = _package_label(build)
    own = {package if package != f"//{PACKAGE}" else f"//{PACKAGE}:{kwargs['name']}"}
    if package == f"//{PACKAGE}" and kwargs["name"] == PACKAGE:
        own = {f"//{PACKAGE}"}
    if package.split("/")[-1] in PER_MODULE:
        own |= {f"{package}:{kwargs['name']}"}
    needed = set()
    for src in kwargs.get("srcs", []):
        path = build.parent / src
        if path.suffix == ".py" and path.exists():
            needed |= _labels(imported_modules(path, root), root)
    declared = {normalise(d, package) for d in kwargs.get("deps", [])} - {None}
    return needed - own, declared - own


def deps_mismatches(root: pathlib.Path = ROOT) -> list[str]:
    """One line per rule whose `pau_jax` deps differ from what its sources import."""
    problems = []
    for build in _build_files():
        for kind, kwargs in _evaluate(build):
            if kind not in ("py_library", "py_binary", "py_test"):
                continue
            needed, declared = rule_deps(build, kwargs, root)
            if needed != declared:
                missing, extra = sorted(needed - declared), sorted(declared - needed)
                problems.append(
                    f"{build.relative_to(ROOT)}:{kwargs['name']}: missing {missing} extra {extra}"
                )
    return problems


def test_every_dep_names_a_rule():
    rules = set()
    for build in _build_files():
        package = _package_label(build)
        for _, kwargs in _evaluate(build):
            rules.add(f"{package}:{kwargs['name']}")
    unknown = []
    for build in _build_files():
        package = _package_label(build)
        for _, kwargs in _evaluate(build):
            for dep in kwargs.get("deps", []):
                full = package + dep if dep.startswith(":") else dep
                if ":" not in full[2:]:
                    full = f"{full}:{full.rsplit('/', 1)[-1]}"
                if full not in rules:
                    unknown.append(f"{build.relative_to(ROOT)}:{kwargs['name']} -> {dep}")
    assert not unknown, "deps that name no rule:\n" + "\n".join(unknown)


def test_no_cycle_between_packages():
    graph = package_graph()
    found = cycles(graph)
    detail = []
    for component in found:
        for a in component:
            for b in component:
                if b in graph.get(a, {}):
                    detail.append(f"{a} -> {b} ({', '.join(sorted(set(graph[a][b]))[:3])})")
    assert not found, "import cycles between packages:\n" + "\n".join(detail)


def test_build_deps_match_the_imports():
    problems = deps_mismatches()
    assert not problems, "BUILD deps that differ from the imports:\n" + "\n".join(problems)


def test_layers_lower_packages_import_no_upper_one():
    """The layers of docs/architecture.md: nothing below training imports rl, sft or evaluation."""
    graph = package_graph()
    upper = {f"//{PACKAGE}/rl", f"//{PACKAGE}/sft", f"//{PACKAGE}/evaluation"}
    lower = [
        f"//{PACKAGE}/{name}"
        for name in ("sandbox", "data", "models", "sampling", "env", "tasks", "policy", "training")
    ]
    for node in lower:
        assert not upper & set(graph.get(node, {})), f"{node} imports {upper & set(graph[node])}"
    # rl and sft are two algorithms side by side: neither imports the other.
    assert f"//{PACKAGE}/sft" not in graph[f"//{PACKAGE}/rl"]
    assert f"//{PACKAGE}/rl" not in graph[f"//{PACKAGE}/sft"]


def test_the_checks_can_fail(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "b" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def f():\n    from pau_jax.b import y\n")
    (pkg / "b" / "y.py").write_text("from pau_jax.a import x\n")
    (pkg / "tool.py").write_text("from . import a\nimport pau_jax.b.y\n")
    graph = package_graph(tmp_path)
    assert cycles(graph) == [["//pau_jax/a", "//pau_jax/b"]]
    assert set(graph["//pau_jax:tool"]) == {"//pau_jax/a", "//pau_jax/b"}
    (pkg / "b" / "y.py").write_text("")
    assert cycles(package_graph(tmp_path)) == []
    (pkg / "run.py").write_text('ENTRIES = {"x": ("pau_jax.a.x", "f")}\n')
    assert set(package_graph(tmp_path)["//pau_jax:run"]) == {"//pau_jax/a"}


@pytest.mark.parametrize(
    "module, label",
    [
        ("pau_jax.rl.loop", "//pau_jax/rl"),
        ("pau_jax.parallel", "//pau_jax:parallel"),
        ("pau_jax.tools.memory_estimate", "//pau_jax/tools:memory_estimate"),
        ("pau_jax", "//pau_jax"),
        ("numpy", None),
    ],
)
def test_labels(module, label):
    assert label_of(module) == label
