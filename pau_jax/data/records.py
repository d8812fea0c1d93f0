"""Stored form of a benchmark record: TFDS features, and conversion to and from examples."""

import numpy as np

from pau_jax.data.pipeline import Example, Record

TEXT_FIELDS = (
    "task_id",
    "source",
    "entry_point",
    "header",
    "code",
    "anonymized_code",
    "original_code",
    "description",
    "description_origin",
)
INT_FIELDS = ("n_statements", "n_branches", "n_seeds", "n_candidates")
FLOAT_FIELDS = ("statement_coverage", "branch_coverage")
SEQUENCE_FIELDS = (
    "arg_types",
    "shown_inputs",
    "shown_outputs",
    "heldout_inputs",
    "heldout_outputs",
)


def features():
    """The TFDS FeaturesDict of a record (inputs and outputs in the sandbox's typed codec)."""
    import tensorflow_datasets as tfds

    spec = {name: tfds.features.Text() for name in TEXT_FIELDS}
    spec.update({name: tfds.features.Sequence(tfds.features.Text()) for name in SEQUENCE_FIELDS})
    spec.update({name: np.int32 for name in INT_FIELDS})
    spec.update({name: np.float64 for name in FLOAT_FIELDS})
    return tfds.features.FeaturesDict(spec)


def to_example(record: Record) -> dict:
    """A record as a TFDS example dictionary."""
    example = {name: getattr(record, name) for name in TEXT_FIELDS + INT_FIELDS + FLOAT_FIELDS}
    example["arg_types"] = list(record.arg_types)
    example["shown_inputs"] = [e.args for e in record.shown]
    example["shown_outputs"] = [e.output for e in record.shown]
    example["heldout_inputs"] = [e.args for e in record.heldout]
    example["heldout_outputs"] = [e.output for e in record.heldout]
    return example


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def from_example(example: dict) -> Record:
    """A record from an example read back with tfds.data_source (bytes become str)."""
    texts = {name: _text(example[name]) for name in TEXT_FIELDS}
    seqs = {name: [_text(v) for v in example[name]] for name in SEQUENCE_FIELDS}
    return Record(
        **texts,
        arg_types=tuple(seqs["arg_types"]),
        shown=tuple(
            Example(args=a, output=o) for a, o in zip(seqs["shown_inputs"], seqs["shown_outputs"])
        ),
        heldout=tuple(
            Example(args=a, output=o)
            for a, o in zip(seqs["heldout_inputs"], seqs["heldout_outputs"])
        ),
        **{name: int(example[name]) for name in INT_FIELDS},
        **{name: float(example[name]) for name in FLOAT_FIELDS},
    )
