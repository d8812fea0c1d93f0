"""Export of a built split as a Hugging Face dataset (parquet) with the released benchmark's columns.

The released PAU benchmark has the columns test_func_validated, description, header,
train_examples, test_examples and all_examples (JSON text of [input, output] pairs, inputs as
call-argument text and outputs as repr text), and the evaluation code reads train_inputs,
train_outputs and test_inputs. Its prompt columns (direct_prompt, interactive_starting_prompt)
are not exported: prompts are built by the environment. The remaining columns are pau_jax's
own (typed encodings, coverage, provenance)::

    python -m pau_jax.data.export --data_dir=~/tensorflow_datasets --config=default \
        --split=test --output=/tmp/pau_test.parquet
"""

import argparse
import json
from collections.abc import Sequence

from pau_jax.data import records as records_lib
from pau_jax.data.pipeline import Example, Record
from pau_jax.sandbox import values


def call_text(encoded_args: str) -> str:
    """Argument text of a call, e.g. "[1, 2], 'a'" (what `parse_call_args` reads back)."""
    return ", ".join(values.display(a) for a in values.decode(encoded_args))


def output_text(encoded_output: str) -> str:
    """repr-style text of an output, as the released benchmark stores it."""
    return values.display(values.decode(encoded_output))


def _pairs(examples: Sequence[Example]) -> list[list[str]]:
    return [[call_text(e.args), output_text(e.output)] for e in examples]


def to_row(record: Record) -> dict:
    """One record as a row with the released columns plus pau_jax's own."""
    shown, heldout = _pairs(record.shown), _pairs(record.heldout)
    return {
        "test_func_validated": record.code,
        "description": record.description,
        "header": record.header,
        "train_examples": json.dumps(shown, ensure_ascii=False),
        "test_examples": json.dumps(heldout, ensure_ascii=False),
        "all_examples": json.dumps([[i, o, "None"] for i, o in shown], ensure_ascii=False),
        "train_inputs": [i for i, _ in shown],
        "train_outputs": [o for _, o in shown],
        "test_inputs": [i for i, _ in heldout],
        "test_outputs": [o for _, o in heldout],
        "task_id": record.task_id,
        "source": record.source,
        "entry_point": record.entry_point,
        "anonymized_code": record.anonymized_code,
        "original_code": record.original_code,
        "description_origin": record.description_origin,
        "arg_types": list(record.arg_types),
        "train_inputs_encoded": [e.args for e in record.shown],
        "train_outputs_encoded": [e.output for e in record.shown],
        "test_inputs_encoded": [e.args for e in record.heldout],
        "test_outputs_encoded": [e.output for e in record.heldout],
        "statement_coverage": record.statement_coverage,
        "branch_coverage": record.branch_coverage,
    }


def to_hf_dataset(records: Sequence[Record]):
    """A `datasets.Dataset` with one row per record."""
    import datasets

    rows = [to_row(r) for r in records]
    columns = list(rows[0]) if rows else []
    return datasets.Dataset.from_dict({c: [row[c] for row in rows] for c in columns})


def read_split(data_dir: str, config: str, split: str) -> list[Record]:
    """Records of a built split, read with tfds.data_source (no TensorFlow)."""
    import tensorflow_datasets as tfds

    source = tfds.data_source(f"pau/{config}", data_dir=data_dir, split=split)
    found = [records_lib.from_example(source[i]) for i in range(len(source))]
    return sorted(found, key=lambda r: r.task_id)


def export_split(data_dir: str, config: str, split: str, output: str) -> int:
    """Writes a built split as parquet; returns the number of rows."""
    dataset = to_hf_dataset(read_split(data_dir, config, split))
    dataset.to_parquet(output)
    return len(dataset)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pau_jax.data.export", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data_dir", required=True, help="TFDS data_dir the split was built into")
    parser.add_argument("--config", default="default", help="builder config (default, debug)")
    parser.add_argument("--split", default="test", help="split name (test, train)")
    parser.add_argument("--output", required=True, help="parquet file to write")
    args = parser.parse_args(argv)
    rows = export_split(args.data_dir, args.config, args.split, args.output)
    print(f"wrote {rows} rows to {args.output}")


if __name__ == "__main__":
    main()
