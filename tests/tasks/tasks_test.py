"""Dataset records as evaluation tasks: the debug split built by the TFDS builder, read back."""

import pytest

from pau_jax.data import export
from pau_jax.env.episode import EpisodeConfig
from pau_jax.sandbox import Executor, equality, values
from pau_jax.tasks import DatasetConfig, load_tasks
from pau_jax.tasks import demo as demo_tasks
from pau_jax.tasks import pau_dataset as tasks


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tasks.ensure_built(tmp_path_factory.mktemp("tfds"))


def test_specs_and_references_follow_the_records(data_dir):
    records = tasks.load_split("debug", "test", data_dir)
    assert [r.task_id for r in records] == sorted(r.task_id for r in records)
    specs, references = tasks.from_records(records, EpisodeConfig())
    assert [s.task.task_id for s in specs] == [r.task_id for r in records]
    for record, spec in zip(records, specs):
        ref = references[record.task_id]
        assert spec.code == ref.code == record.code and spec.entry == "test_func"
        assert spec.task.header == ref.header == record.header
        assert spec.task.n_params == len(record.arg_types)
        # What the agent sees is the released benchmark's text of the same examples.
        for obs, example in zip(spec.task.examples, record.shown, strict=True):
            assert obs.call == f"test_func({export.call_text(example.args)})"
            assert obs.result == export.output_text(example.output)
        assert ref.examples == tuple(f"{o.call} -> {o.result}" for o in spec.task.examples)
        assert len(ref.held_out) == len(record.heldout) and ref.source == record.source
        for args, example in zip(ref.held_out, record.heldout):
            assert isinstance(args, tuple) and equality.typed_equal(
                args, values.decode(example.args)
            )
    assert len(tasks.load_split("debug", "test", data_dir, limit=3)) == 3


def test_held_out_inputs_reproduce_the_stored_outputs(data_dir):
    records = tasks.load_split("debug", "test", data_dir, limit=4)
    _, references = tasks.from_records(records, EpisodeConfig())
    compared = 0
    with Executor(workers=2) as ex:
        for record in records:
            got = ex.call_many(record.code, list(references[record.task_id].held_out), timeout_s=2)
            for result, example in zip(got, record.heldout, strict=True):
                # Every stored held-out output is a return value: each call must succeed.
                assert result.ok, (record.task_id, result.error_type, result.error_message)
                assert equality.typed_equal(result.value, values.decode(example.output))
                compared += 1
    assert compared >= 4


def test_str_display_mode_is_used_for_the_examples(data_dir):
    records = tasks.load_split("debug", "test", data_dir, limit=5)
    specs, references = tasks.from_records(records, EpisodeConfig(display_mode="str"))
    strings = [r for r in records if "str" in r.arg_types]
    assert strings
    record = strings[0]
    spec = next(s for s in specs if s.task.task_id == record.task_id)
    args = values.decode(record.shown[0].args)
    # Calls as Python literals (a string argument keeps its quotes), results with str().
    assert spec.task.examples[0].call == "test_func(" + ", ".join(repr(a) for a in args) + ")"
    assert spec.task.examples[0].result == str(values.decode(record.shown[0].output))
    assert references[record.task_id].examples[0].startswith(spec.task.examples[0].call + " -> ")


def test_ensure_built_does_not_rebuild(data_dir):
    info = next((data_dir / "pau" / "debug").glob("*/dataset_info.json"))
    before = info.stat().st_mtime_ns
    assert tasks.ensure_built(data_dir) == data_dir
    assert info.stat().st_mtime_ns == before


def test_missing_split_and_duplicates_are_clear_errors(tmp_path, data_dir):
    with pytest.raises(FileNotFoundError, match="not built under"):
        tasks.load_split("debug", "test", tmp_path)
    with pytest.raises(ValueError, match="needs manual_dir"):
        tasks.ensure_built(tmp_path, config="default")
    records = tasks.load_split("debug", "test", data_dir, limit=1)
    with pytest.raises(ValueError, match="duplicate task ids"):
        tasks.from_records(records * 2, EpisodeConfig())


def test_demo_tasks_have_examples_and_source():
    with Executor(workers=1) as ex:
        specs, references = demo_tasks.load(ex, EpisodeConfig())
    assert len(specs) == 4 and set(references) == {s.task.task_id for s in specs}
    affine = references["demo/affine"]
    assert affine.examples[0] == "test_func(2, 3) -> 7" and affine.source == "demo"


def test_a_dataset_can_be_restricted_to_sources(data_dir):
    from pau_jax.sandbox import Executor

    dataset = DatasetConfig(
        config="debug", data_dir=str(data_dir), sources=("humaneval", "mbpp"), limit=4
    )
    with Executor(workers=1) as ex:
        specs, references = load_tasks(dataset, ex, EpisodeConfig())
        assert len(specs) == 4
        assert {references[s.task.task_id].source for s in specs} <= {"humaneval", "mbpp"}
        with pytest.raises(ValueError, match=r"sources \['nope'\] are not in pau/debug"):
            load_tasks(
                DatasetConfig(config="debug", data_dir=str(data_dir), sources=("nope",)),
                ex,
                EpisodeConfig(),
            )


def test_per_source_takes_the_first_items_of_each_benchmark(data_dir):
    from pau_jax.sandbox import Executor

    records = tasks.load_split("debug", "test", data_dir)
    dataset = DatasetConfig(
        config="debug", data_dir=str(data_dir), sources=("humaneval", "mbpp"), per_source=2
    )
    with Executor(workers=1) as ex:
        specs, references = load_tasks(dataset, ex, EpisodeConfig())
    ids = [s.task.task_id for s in specs]
    expected = [r.task_id for r in records if r.source == "humaneval"][:2]
    expected += [r.task_id for r in records if r.source == "mbpp"][:2]
    assert sorted(ids) == sorted(expected) and len(ids) == 4
    with pytest.raises(ValueError, match="per_source must be >= 1"):
        DatasetConfig(per_source=0)
