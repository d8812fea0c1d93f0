"""Training candidates from instruction datasets (CodeAlpaca-20k, Magicoder-OSS-Instruct-75K).

These datasets have no tests: a candidate is kept only when every parameter of its function
has a type annotation that `annotation_type` understands, and its seed inputs are drawn from
those types. They are read with `datasets.load_dataset`, from the Hugging Face hub or from
local files in the hub's format.
"""

import ast
import dataclasses
import re

from pau_jax.data import argtypes
from pau_jax.data.sources import SourceError, SourceTask, parse_quietly


@dataclasses.dataclass(frozen=True, kw_only=True)
class InstructSource:
    """An instruction dataset and the fields holding the task text and the code.

    Attributes:
      key: short name, also the source name of its tasks.
      hub_id: Hugging Face dataset id.
      local_filename: file name looked for in a manual directory.
      text_fields: fields joined into the description.
      code_field: field holding the answer (code, possibly inside a Markdown block).
    """

    key: str
    hub_id: str
    local_filename: str
    text_fields: tuple[str, ...]
    code_field: str


CODE_ALPACA = InstructSource(
    key="code_alpaca",
    hub_id="sahil2801/CodeAlpaca-20k",
    local_filename="code_alpaca_20k.json",
    text_fields=("instruction", "input"),
    code_field="output",
)
MAGICODER = InstructSource(
    key="magicoder",
    hub_id="ise-uiuc/Magicoder-OSS-Instruct-75K",
    local_filename="magicoder_oss_instruct_75k.jsonl",
    text_fields=("problem",),
    code_field="solution",
)
INSTRUCT_SOURCES = {s.key: s for s in (CODE_ALPACA, MAGICODER)}

_BLOCK = re.compile(r"```(?:python|py|Python)?[^\S\n]*\n(.*?)```", re.S)
_SIMPLE = {"int": "int", "float": "float", "str": "str", "bool": "bool", "bytes": "bytes"}
_GENERIC = {
    "list": "list",
    "List": "list",
    "set": "set",
    "Set": "set",
    "dict": "dict",
    "Dict": "dict",
}


def extract_code(text: str) -> str:
    """The first Python Markdown block of an answer, or the whole answer when it has none."""
    match = _BLOCK.search(text)
    return match.group(1) if match else text


def annotation_type(node: ast.expr | None) -> argtypes.TypeSpec | None:
    """The TypeSpec of a parameter annotation, or None when it is missing or unsupported."""
    if node is None:
        return None
    if isinstance(node, ast.Name) and node.id in _SIMPLE:
        return argtypes.TypeSpec(_SIMPLE[node.id])
    if isinstance(node, ast.Constant) and node.value is None:
        return argtypes.TypeSpec("None")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = [annotation_type(node.left), annotation_type(node.right)]
        return None if None in parts else argtypes.join_all(parts)
    if not isinstance(node, ast.Subscript):
        return None
    base = (
        node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
    )
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if base == "Optional" and len(items) == 1:
        inner = annotation_type(items[0])
        return None if inner is None else argtypes.join(inner, argtypes.TypeSpec("None"))
    if base in ("tuple", "Tuple"):
        if len(items) == 2 and isinstance(items[1], ast.Constant) and items[1].value is Ellipsis:
            inner = annotation_type(items[0])
            return None if inner is None else argtypes.TypeSpec("tuple...", (inner,))
        specs = [annotation_type(i) for i in items]
        return None if None in specs else argtypes.TypeSpec("tuple", tuple(specs))
    if base not in _GENERIC:
        return None
    specs = [annotation_type(i) for i in items]
    kind = _GENERIC[base]
    if None in specs or len(specs) != (2 if kind == "dict" else 1):
        return None
    return argtypes.TypeSpec(kind, tuple(specs))


def _entry_function(tree: ast.Module) -> ast.FunctionDef | None:
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != "main"]
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef)
    if not functions or not all(isinstance(n, allowed) for n in tree.body):
        return None
    return functions[-1]


def task_from_answer(source: InstructSource, index: int, row: dict) -> SourceTask | None:
    """A candidate from one dataset row, or None when the row holds no usable function.

    Usable: the answer parses as Python made only of imports and functions, and every
    parameter of its last function has a supported type annotation.
    """
    code = extract_code(str(row.get(source.code_field, "")))
    try:
        tree = parse_quietly(code)
    except (SyntaxError, ValueError):
        return None
    entry = _entry_function(tree)
    if entry is None:
        return None
    params = [*entry.args.posonlyargs, *entry.args.args]
    specs = [annotation_type(p.annotation) for p in params]
    if not params or None in specs:
        return None
    description = " ".join(str(row.get(f, "") or "") for f in source.text_fields)
    return SourceTask(
        task_id=f"{source.key}/{index}",
        source=source.key,
        entry_point=entry.name,
        code=code,
        description=" ".join(description.split()),
        description_origin=f"{source.key}_instruction",
        test_code="",
        test_inputs=(),
        arg_types=tuple(str(s) for s in specs),
    )


def load_instruct_tasks(source: InstructSource, data_files: str | None = None) -> list[SourceTask]:
    """Reads an instruction dataset (hub id, or local JSON/JSONL files) into candidates.

    Args:
      source: which dataset.
      data_files: local file(s) in the hub's format; None reads from the hub.

    Returns:
      The usable candidates, in dataset order.
    """
    import datasets

    if data_files is None:
        try:
            dataset = datasets.load_dataset(source.hub_id, split="train")
        except Exception as e:  # Offline, unknown id, hub errors: one remedy for all.
            raise SourceError(
                f"could not read {source.hub_id} from the Hugging Face hub ({type(e).__name__}); "
                f"save its train split as {source.local_filename} in the manual directory"
            ) from e
    else:
        dataset = datasets.load_dataset("json", data_files=data_files, split="train")
    tasks = (task_from_answer(source, i, row) for i, row in enumerate(dataset))
    return [t for t in tasks if t is not None]
