"""Tests of the instruction-dataset candidates, read with datasets from local files."""

import ast
import json
import pathlib

import datasets
import pytest

from pau_jax.data import argtypes, benchmark, build, instruct_sources, pipeline

ROWS = [
    {
        "instruction": "Write a function that counts vowels.",
        "input": "",
        "output": "def count_vowels(text: str) -> int:\n    return sum(c in 'aeiou' for c in text.lower())",
    },
    {"instruction": "Print hello in Java.", "input": "", "output": 'System.out.println("hello");'},
    {"instruction": "Add numbers.", "input": "", "output": "def add(a, b):\n    return a + b"},
    {
        "instruction": "Scale a list.",
        "input": "factor 2",
        "output": "Here:\n```python\nfrom typing import List\n\ndef scale(xs: List[float], k: int) -> List[float]:\n    return [x * k for x in xs]\n```\nDone.",
    },
    {"instruction": "Script.", "input": "", "output": "x = 1\ndef f(a: int):\n    return a + x"},
]


@pytest.fixture
def alpaca_file(tmp_path):
    path = tmp_path / instruct_sources.CODE_ALPACA.local_filename
    path.write_text(json.dumps(ROWS))
    return path


def test_usable_rows_become_candidates(alpaca_file):
    tasks = instruct_sources.load_instruct_tasks(instruct_sources.CODE_ALPACA, str(alpaca_file))
    assert [t.task_id for t in tasks] == ["code_alpaca/0", "code_alpaca/3"]
    assert tasks[0].arg_types == ("str",) and tasks[0].test_code == ""
    assert tasks[1].arg_types == ("list[float]", "int")
    assert tasks[1].description == "Scale a list. factor 2"
    assert tasks[1].code.startswith("from typing import List")


@pytest.mark.parametrize(
    "annotation, text",
    [
        ("int", "int"),
        ("List[int]", "list[int]"),
        ("dict[str, list[int]]", "dict[str, list[int]]"),
        ("Optional[str]", "None | str"),
        ("int | float", "float | int"),
        ("Tuple[int, str]", "tuple[int, str]"),
        ("typing.Tuple[int, ...]", "tuple[int, ...]"),
        ("Any", None),
        ("Callable[[int], int]", None),
        ("List", None),
    ],
)
def test_annotation_types(annotation, text):
    spec = instruct_sources.annotation_type(ast.parse(annotation, mode="eval").body)
    assert (None if spec is None else str(spec)) == text
    if text is not None:
        assert argtypes.parse(text) == spec


def test_candidates_without_tests_build_records(alpaca_file):
    tasks = instruct_sources.load_instruct_tasks(instruct_sources.CODE_ALPACA, str(alpaca_file))
    config = pipeline.PipelineConfig(max_candidates=60)
    result = build.build_records(tasks, config, workers=1, progress=False)
    assert len(result.records) == 2, result.exclusions
    for record in result.records:
        assert record.description_origin == "code_alpaca_instruction"
        assert len(record.heldout) >= 4 and record.statement_coverage == 1.0


def test_hub_failure_is_one_line(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(instruct_sources.SourceError) as info:
        instruct_sources.load_instruct_tasks(instruct_sources.MAGICODER)
    message = str(info.value)
    assert "\n" not in message and instruct_sources.MAGICODER.local_filename in message


def test_train_split_takes_local_copies_from_the_manual_dir(alpaca_file, monkeypatch):
    dummy = pathlib.Path(__file__).resolve().parents[2] / "data_builders" / "pau" / "dummy_data"
    paths = {"mbpp": dummy / "mbpp.jsonl"}

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub must not be asked")

    monkeypatch.setattr(instruct_sources, "load_instruct_tasks", no_hub)
    without = benchmark.training_split_tasks(paths, benchmark.DEFAULT, manual_dir=None)
    assert {t.source for t in without} == {"mbpp"}
    monkeypatch.undo()
    with_local = benchmark.training_split_tasks(paths, benchmark.DEFAULT, alpaca_file.parent)
    assert [t.task_id for t in with_local if t.source == "code_alpaca"] == [
        "code_alpaca/0",
        "code_alpaca/3",
    ]
