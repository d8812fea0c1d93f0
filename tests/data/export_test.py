"""Tests of the Hugging Face parquet export."""

import json

import datasets

from pau_jax.data import export
from pau_jax.data.pipeline import Example, Record
from pau_jax.sandbox import parse_call_args, values

RELEASED_COLUMNS = (
    "test_func_validated",
    "description",
    "header",
    "train_examples",
    "test_examples",
    "all_examples",
    "train_inputs",
    "train_outputs",
    "test_inputs",
)


def _example(args: tuple, output) -> Example:
    return Example(args=values.encode(args), output=values.encode(output))


def _record(task_id: str) -> Record:
    shown = (_example(([1, 2], "a"), (3, "a")), _example(([], "b"), (0, "b")))
    heldout = tuple(_example(([i], "x" * i), (i, "x" * i)) for i in range(4))
    return Record(
        task_id=task_id,
        source="synthetic",
        entry_point="f",
        header="def test_func(arg0, arg1):",
        code="def test_func(arg0, arg1):\n    return (sum(arg0), arg1)\n",
        anonymized_code="def test_func(arg0, arg1):\n    return (sum(arg0), arg1)\n",
        original_code="def f(xs, s):\n    return sum(xs), s\n",
        description="Sum and label.",
        description_origin="none",
        arg_types=("list[int]", "str"),
        shown=shown,
        heldout=heldout,
        statement_coverage=1.0,
        branch_coverage=1.0,
        n_statements=2,
        n_branches=0,
        n_seeds=2,
        n_candidates=10,
    )


def test_parquet_has_released_columns_and_round_trips(tmp_path):
    path = tmp_path / "pau.parquet"
    export.to_hf_dataset([_record("X/1"), _record("X/2")]).to_parquet(str(path))
    loaded = datasets.Dataset.from_parquet(str(path))
    assert len(loaded) == 2
    assert set(RELEASED_COLUMNS) <= set(loaded.column_names)
    row = loaded[0]
    train = json.loads(row["train_examples"])
    assert train[0] == ["[1, 2], 'a'", "(3, 'a')"]
    assert json.loads(row["all_examples"])[1] == ["[], 'b'", "(0, 'b')", "None"]
    test = json.loads(row["test_examples"])
    assert len(test) == 4 and row["test_inputs"] == [i for i, _ in test]
    for text, encoded in zip(row["test_inputs"], row["test_inputs_encoded"]):
        assert parse_call_args(text, 2) == values.decode(encoded)
    namespace: dict = {}
    exec(row["test_func_validated"], namespace)
    assert repr(namespace["test_func"]([1, 2], "a")) == train[0][1]
