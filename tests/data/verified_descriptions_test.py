"""Shipped, execution-verified descriptions: the file's form, and which records they fill."""

import dataclasses
import json

import pytest

from pau_jax.data import verified_descriptions as verified

CODE = "def f(x):\n    return x + 1\n"


def _entry(**changes):
    fields = dict(
        task_id="CRUXEval/sample_1",
        code_sha256=verified.code_sha256(CODE),
        description="Adds one to its argument.",
        annotator="qwen2.5-coder-1.5b-instruct",
        matched=3,
        held_out=4,
    )
    return verified.VerifiedDescription(**(fields | changes))


@dataclasses.dataclass(frozen=True)
class _Record:
    task_id: str
    original_code: str
    description: str = ""
    description_origin: str = "none"


def test_round_trip_and_provenance(tmp_path):
    path = tmp_path / "kept.jsonl"
    entries = [_entry(task_id="CRUXEval/sample_9"), _entry()]
    verified.write(path, entries)
    lines = path.read_text().splitlines()
    assert [json.loads(x)["task_id"] for x in lines] == ["CRUXEval/sample_1", "CRUXEval/sample_9"]
    back = verified.read(path)
    assert back == {e.task_id: e for e in entries}
    assert back["CRUXEval/sample_1"].origin == (
        "annotator:qwen2.5-coder-1.5b-instruct verified 3/4"
    )
    assert verified.read(tmp_path / "missing.jsonl") == {}


@pytest.mark.parametrize(
    "changes", [dict(matched=2, held_out=4), dict(matched=0, held_out=0), dict(description=" ")]
)
def test_only_verified_descriptions_can_be_kept(changes):
    with pytest.raises(ValueError):
        _entry(**changes)


def test_a_broken_or_repeated_line_names_its_place(tmp_path):
    path = tmp_path / "kept.jsonl"
    good = json.dumps(dataclasses.asdict(_entry()))
    path.write_text(good + "\n" + '{"task_id": "x"}\n')
    with pytest.raises(ValueError, match="line 2"):
        verified.read(path)
    path.write_text(good + "\n" + good + "\n")
    with pytest.raises(ValueError, match="line 2: CRUXEval/sample_1 is given twice"):
        verified.read(path)


def test_fill_matches_task_and_code_and_keeps_existing_descriptions(caplog):
    entries = {
        e.task_id: e
        for e in (
            _entry(),
            _entry(task_id="CRUXEval/sample_2", code_sha256=verified.code_sha256("other")),
            _entry(task_id="HumanEval/0"),
        )
    }
    records = (
        _Record("CRUXEval/sample_1", CODE),
        _Record("CRUXEval/sample_2", CODE),  # Its source changed since it was described.
        _Record("HumanEval/0", CODE, "the docstring", "humaneval_docstring"),
        _Record("CRUXEval/sample_3", CODE),
    )
    with caplog.at_level("WARNING"):
        filled = verified.fill(records, entries)
    assert filled[0].description == "Adds one to its argument."
    assert (
        filled[0].description_origin.startswith("annotator:")
        and "3/4" in filled[0].description_origin
    )
    assert filled[1:] == records[1:]
    assert "1 verified descriptions were written for other code" in caplog.text


def test_the_strict_reading_fills_only_descriptions_that_matched_every_example():
    entries = {
        e.task_id: e
        for e in (
            _entry(matched=3, held_out=4),
            _entry(task_id="CRUXEval/sample_2", matched=4, held_out=4),
        )
    }
    records = (_Record("CRUXEval/sample_1", CODE), _Record("CRUXEval/sample_2", CODE))
    majority = verified.fill(records, entries)
    strict = verified.fill(records, entries, min_fraction=1.0)
    assert [bool(r.description) for r in majority] == [True, True]
    assert strict[0] == records[0]
    assert strict[1].description_origin.endswith("verified 4/4")
    for bad in (0.4, 1.5):
        with pytest.raises(ValueError, match="min_fraction"):
            verified.fill(records, entries, min_fraction=bad)
