"""Builds the debug config from dummy_data without TensorFlow and reads it with tfds.data_source."""

import json
import pathlib
import shutil
import sys

import pytest
import tensorflow_datasets as tfds

from pau import pau_dataset_builder
from pau_jax.data import argtypes, build_tfds, export, records, sources, verified_descriptions
from pau_jax.sandbox import values

DUMMY = pathlib.Path(__file__).parent / "dummy_data"


def _ship_descriptions(path):
    """A shipped file describing every dummy CRUXEval item, one of them for other code."""
    rows = [json.loads(line) for line in (DUMMY / "cruxeval.jsonl").read_text().splitlines()]
    entries = [
        verified_descriptions.VerifiedDescription(
            task_id=f"CRUXEval/{row['id']}",
            code_sha256=verified_descriptions.code_sha256(row["code"] if n else "changed"),
            description=f"verified description {n}",
            annotator="a-model",
            matched=4,
            held_out=5,
        )
        for n, row in enumerate(rows)
    ]
    verified_descriptions.write(path, entries)
    return {e.task_id: e.description for e in entries[1:]}


def test_debug_config_builds_from_dummy_data_and_reads_back(tmp_path, monkeypatch):
    # The TFDS build command, as `python -m pau_jax.data.build_tfds` runs it.
    monkeypatch.chdir(pathlib.Path(__file__).parents[1])
    shipped = _ship_descriptions(tmp_path / "verified.jsonl")
    monkeypatch.setattr(verified_descriptions, "FILE", tmp_path / "verified.jsonl")
    build_tfds.main(["pau", "--config=debug", f"--manual_dir={DUMMY}", f"--data_dir={tmp_path}"])
    builder = pau_dataset_builder.Builder(config="debug", data_dir=str(tmp_path))
    assert builder.info.file_format.value == "array_record"
    assert "tensorflow" not in sys.modules
    source = tfds.data_source("pau/debug", data_dir=str(tmp_path))
    report = json.loads((pathlib.Path(builder.data_dir) / "metadata.json").read_text())
    for split in ("test", "train"):
        kept = sum(v["kept"] for v in report[f"{split}_report"]["per_source"].values())
        assert len(source[split]) == kept > 0
    assert report["test_report"]["per_source"]["cruxeval"]["candidates"] == 4
    loaded = [records.from_example(source["test"][i]) for i in range(len(source["test"]))]
    assert len({r.task_id for r in loaded}) == len(loaded)
    # The shipped descriptions reach the records, with their provenance; none for other code.
    crux = [r for r in loaded if r.source == "cruxeval"]
    assert crux
    for record in crux:
        if record.task_id in shipped:
            assert record.description == shipped[record.task_id]
            assert record.description_origin == "annotator:a-model verified 4/5"
        else:
            assert (record.description, record.description_origin) == ("", "none")
    for record in loaded:
        assert record.header.startswith("def test_func(")
        assert len(record.shown) == 2 and len(record.heldout) >= 4
        assert record.shown[0].output != record.shown[1].output
        specs = [argtypes.parse(t) for t in record.arg_types]
        for example in record.shown + record.heldout:
            args = values.decode(example.args)
            assert isinstance(args, tuple) and len(args) == len(specs)
            assert all(argtypes.matches(a, s) for a, s in zip(args, specs))
            values.decode(example.output)

    parquet = tmp_path / "test.parquet"
    rows = export.export_split(str(tmp_path), "debug", "test", str(parquet))
    assert rows == len(loaded) and parquet.stat().st_size > 0


def test_offline_without_manual_dir_is_one_line(tmp_path, monkeypatch):
    def unresolvable(*args, **kwargs):
        raise OSError("no name resolution")

    monkeypatch.setattr(pau_dataset_builder.socket, "getaddrinfo", unresolvable)
    builder = pau_dataset_builder.Builder(config="debug", data_dir=str(tmp_path))
    with pytest.raises(sources.SourceError) as info:
        builder.download_and_prepare()
    message = str(info.value)
    assert "\n" not in message and "--manual_dir" in message and "cruxeval.jsonl" in message


def test_incomplete_manual_dir_names_the_missing_file(tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    shutil.copy(DUMMY / "cruxeval.jsonl", manual)
    builder = pau_dataset_builder.Builder(config="debug", data_dir=str(tmp_path / "out"))
    with pytest.raises(sources.SourceError, match="missing source file HumanEval.jsonl.gz"):
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=str(manual))
        )
