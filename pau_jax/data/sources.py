"""Source benchmarks: where their files live, and reading them into uniform source tasks."""

import ast
import dataclasses
import gzip
import hashlib
import json
import pathlib
import re
import warnings
from collections.abc import Sequence

from absl import logging

HUMANEVAL = "humaneval"
MBPP = "mbpp"
CRUXEVAL = "cruxeval"
MBPP_SANITIZED = "mbpp_sanitized"

# MBPP's own convention: ids 11-510 are its test part.
MBPP_TEST_IDS = range(11, 511)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceFile:
    """One downloadable source file.

    Attributes:
      key: short name used in code and in the download dictionary.
      filename: file name on disk (also inside a manual directory).
      url: canonical download location.
      sha256: expected hex digest of the file.
      size: expected size in bytes.
    """

    key: str
    filename: str
    url: str
    sha256: str
    size: int


SOURCE_FILES = (
    SourceFile(
        key=HUMANEVAL,
        filename="HumanEval.jsonl.gz",
        url="https://github.com/openai/human-eval/raw/master/data/HumanEval.jsonl.gz",
        sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        size=44877,
    ),
    SourceFile(
        key=MBPP,
        filename="mbpp.jsonl",
        url="https://raw.githubusercontent.com/google-research/google-research/master/mbpp/mbpp.jsonl",
        sha256="ccf64ceae9c5403bf50a044cb6d505bfd2a2963ee58338ba268fd65beab92a9f",
        size=563743,
    ),
    SourceFile(
        key=MBPP_SANITIZED,
        filename="sanitized-mbpp.json",
        url="https://raw.githubusercontent.com/google-research/google-research/master/mbpp/sanitized-mbpp.json",
        sha256="7fec016546acaee11dbe14f9f0bb670e59f41919f7b522a59fba34871da78551",
        size=300253,
    ),
    SourceFile(
        key=CRUXEVAL,
        filename="cruxeval.jsonl",
        url="https://raw.githubusercontent.com/facebookresearch/cruxeval/main/data/cruxeval.jsonl",
        sha256="8368b81047dc5014e4caf5a2f97604eff7644e0ecd7415e3ceeb184bbc2e0c96",
        size=186873,
    ),
)
SOURCE_FILES_BY_KEY = {f.key: f for f in SOURCE_FILES}


class SourceError(Exception):
    """A source file is missing, corrupt or malformed."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceTask:
    """One candidate function, as its source benchmark gives it.

    Attributes:
      task_id: globally unique id, e.g. "HumanEval/0", "MBPP/11", "CRUXEval/sample_0".
      source: "humaneval", "mbpp" or "cruxeval" (or a training source name).
      entry_point: name of the function under study in `code`.
      code: original code: imports, helpers and the entry function.
      description: gold description ("" when the source has none).
      description_origin: where the description comes from ("humaneval_docstring",
        "mbpp_text", "none", ...).
      test_code: the source's own test, a module that defines
        `def __pau_source_test(candidate)` which raises on failure.
      test_inputs: literal argument tuples found in the source's tests, in order.
      arg_types: declared argument types (argtypes text form) for sources without tests,
        from which seed inputs are drawn; empty when the tests provide the seeds.
    """

    task_id: str
    source: str
    entry_point: str
    code: str
    description: str
    description_origin: str
    test_code: str
    test_inputs: tuple[tuple, ...]
    arg_types: tuple[str, ...] = ()


def parse_quietly(code: str) -> ast.Module:
    """ast.parse without the SyntaxWarnings of old code (invalid escapes in strings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(code)


def sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def locate(
    directory: str | pathlib.Path, keys: Sequence[str], *, strict: bool = True
) -> dict[str, pathlib.Path]:
    """Finds source files in a directory and checks their digests.

    Args:
      directory: folder expected to hold the files (e.g. a TFDS manual_dir).
      keys: which SOURCE_FILES to look for.
      strict: a digest mismatch is an error (else a logged warning: another revision).

    Returns:
      key -> path.

    Raises:
      SourceError: one line naming the missing or corrupt file and where to put it.
    """
    directory = pathlib.Path(directory)
    paths = {}
    for key in keys:
        spec = SOURCE_FILES_BY_KEY[key]
        path = directory / spec.filename
        if not path.is_file():
            raise SourceError(
                f"missing source file {spec.filename}: download it from {spec.url} "
                f"and put it in {directory}"
            )
        digest = sha256_of(path)
        if digest != spec.sha256 and not strict:
            logging.warning("%s has sha256 %s, not the recorded %s", path, digest, spec.sha256)
        elif digest != spec.sha256:
            raise SourceError(
                f"source file {path} has sha256 {digest}, expected {spec.sha256}: "
                f"replace it with the file from {spec.url}"
            )
        paths[key] = path
    return paths


def _literal_args(call: ast.Call) -> tuple | None:
    """Returns the call's positional arguments if all are literals, else None."""
    if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    values = []
    for arg in call.args:
        try:
            values.append(ast.literal_eval(arg))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    return tuple(values)


def literal_calls(test_source: str, function_name: str) -> tuple[tuple, ...]:
    """Argument tuples of every call `function_name(<literals>)` in a test, in source order.

    Args:
      test_source: Python source of the test.
      function_name: the called name to look for.

    Returns:
      Distinct argument tuples (by repr), in order of first appearance.
    """
    tree = parse_quietly(test_source)
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == function_name
    ]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    found, seen = [], set()
    for call in calls:
        args = _literal_args(call)
        if args is None:
            continue
        key = repr(args)
        if key not in seen:
            seen.add(key)
            found.append(args)
    return tuple(found)


def _indent(lines: Sequence[str]) -> str:
    body = [line for chunk in lines for line in chunk.splitlines()]
    return "\n".join("    " + line for line in body) if body else "    pass"


def _read_jsonl(path: pathlib.Path) -> list[dict]:
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _first_docstring(code: str, entry_point: str) -> str:
    tree = parse_quietly(code)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == entry_point:
            return ast.get_docstring(node) or ""
    return ""


_EXAMPLE_START = re.compile(
    r"^\s*(>>>|for examples?\b|examples?\b|e\.g\.|example:|note:\s*$)", re.I
)


def humaneval_description(code: str, entry_point: str) -> str:
    """The prose of the entry function's docstring, with examples removed."""
    lines = []
    for line in _first_docstring(code, entry_point).splitlines():
        if _EXAMPLE_START.match(line) or re.match(rf"^\s*{re.escape(entry_point)}\s*\(", line):
            break
        lines.append(line.rstrip())
    return " ".join(" ".join(lines).split())


def load_humaneval(path: pathlib.Path) -> list[SourceTask]:
    """Reads HumanEval.jsonl(.gz) into source tasks."""
    tasks = []
    for row in _read_jsonl(path):
        code = row["prompt"] + row["canonical_solution"]
        entry = row["entry_point"]
        test_code = row["test"] + "\n\ndef __pau_source_test(candidate):\n    check(candidate)\n"
        tasks.append(
            SourceTask(
                task_id=row["task_id"],
                source=HUMANEVAL,
                entry_point=entry,
                code=code,
                description=humaneval_description(code, entry),
                description_origin="humaneval_docstring",
                test_code=test_code,
                test_inputs=literal_calls(row["test"], "candidate"),
            )
        )
    return tasks


def _mbpp_entry_point(code: str, tests: Sequence[str]) -> str:
    defined = {
        node.name
        for node in parse_quietly(code).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    for test in tests:
        for node in ast.walk(parse_quietly(test)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in defined:
                    return node.func.id
    raise SourceError(f"no tested function found in MBPP code {code[:60]!r}")


def _mbpp_task(row: dict, text_field: str, setup: str) -> SourceTask:
    code = row["code"].replace("\r\n", "\n")
    tests = list(row["test_list"])
    entry = _mbpp_entry_point(code, tests)
    rename = f"{entry} = candidate"
    test_code = "def __pau_source_test(candidate):\n" + _indent([setup, rename, *tests]) + "\n"
    return SourceTask(
        task_id=f"MBPP/{row['task_id']}",
        source=MBPP,
        entry_point=entry,
        code=code,
        description=" ".join(row[text_field].split()),
        description_origin="mbpp_text",
        test_code=test_code,
        test_inputs=literal_calls("\n".join(tests), entry),
    )


def load_mbpp_sanitized(path: pathlib.Path, ids: Sequence[int] = MBPP_TEST_IDS) -> list[SourceTask]:
    """Reads sanitized-mbpp.json, keeping the given task ids."""
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    wanted = set(ids)
    return [
        _mbpp_task(row, "prompt", "\n".join(row["test_imports"]))
        for row in sorted(rows, key=lambda r: r["task_id"])
        if row["task_id"] in wanted
    ]


def load_mbpp_full(path: pathlib.Path, ids: Sequence[int]) -> list[SourceTask]:
    """Reads mbpp.jsonl (all 974 tasks), keeping the given task ids."""
    wanted = set(ids)
    return [
        _mbpp_task(row, "text", row["test_setup_code"])
        for row in sorted(_read_jsonl(path), key=lambda r: r["task_id"])
        if row["task_id"] in wanted
    ]


def load_cruxeval(path: pathlib.Path) -> list[SourceTask]:
    """Reads cruxeval.jsonl: each row is a function `f`, one input and its output."""
    tasks = []
    for row in _read_jsonl(path):
        call = f"f({row['input']})"
        check = f"assert f({row['input']}) == {row['output']}"
        test_code = "def __pau_source_test(candidate):\n" + _indent(["f = candidate", check]) + "\n"
        tasks.append(
            SourceTask(
                task_id=f"CRUXEval/{row['id']}",
                source=CRUXEVAL,
                entry_point="f",
                code=row["code"],
                description="",
                description_origin="none",
                test_code=test_code,
                test_inputs=literal_calls(call, "f"),
            )
        )
    return tasks


def evaluation_tasks(paths: dict[str, pathlib.Path]) -> list[SourceTask]:
    """The 1221 candidates of the test split: CRUXEval, sanitized MBPP 11-510, HumanEval."""
    return [
        *load_cruxeval(paths[CRUXEVAL]),
        *load_mbpp_sanitized(paths[MBPP_SANITIZED]),
        *load_humaneval(paths[HUMANEVAL]),
    ]


def mbpp_train_ids() -> list[int]:
    """MBPP ids outside its test part: 1-10 and 511-974."""
    return [*range(1, 11), *range(511, 975)]
