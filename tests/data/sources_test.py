"""Tests of the source loaders on the offline copies of the source benchmarks."""

import pathlib
import shutil

import pytest

from pau_jax.data import sources

SOURCES_DIR = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "sources"
ALL_KEYS = [f.key for f in sources.SOURCE_FILES]

needs_sources = pytest.mark.skipif(
    not (SOURCES_DIR / "cruxeval.jsonl").is_file(), reason=f"offline sources not in {SOURCES_DIR}"
)


@needs_sources
def test_locate_checks_digests_and_sizes():
    paths = sources.locate(SOURCES_DIR, ALL_KEYS)
    for spec in sources.SOURCE_FILES:
        assert paths[spec.key].stat().st_size == spec.size


def test_missing_file_is_one_line_naming_file_and_place(tmp_path):
    with pytest.raises(sources.SourceError) as info:
        sources.locate(tmp_path, [sources.CRUXEVAL])
    message = str(info.value)
    assert "\n" not in message
    assert "cruxeval.jsonl" in message and str(tmp_path) in message and "https://" in message


@needs_sources
def test_corrupt_file_is_reported(tmp_path):
    shutil.copy(SOURCES_DIR / "cruxeval.jsonl", tmp_path / "cruxeval.jsonl")
    with open(tmp_path / "cruxeval.jsonl", "a") as f:
        f.write("\n")
    with pytest.raises(sources.SourceError, match="sha256"):
        sources.locate(tmp_path, [sources.CRUXEVAL])


@needs_sources
def test_evaluation_candidates_are_the_papers_1221():
    tasks = sources.evaluation_tasks(sources.locate(SOURCES_DIR, ALL_KEYS))
    counts = {s: sum(t.source == s for t in tasks) for s in ("cruxeval", "mbpp", "humaneval")}
    assert counts == {"cruxeval": 800, "mbpp": 257, "humaneval": 164}
    assert len({t.task_id for t in tasks}) == 1221
    mbpp_ids = [int(t.task_id.split("/")[1]) for t in tasks if t.source == "mbpp"]
    assert min(mbpp_ids) >= 11 and max(mbpp_ids) <= 510


@needs_sources
def test_training_mbpp_ids_are_outside_the_test_part():
    tasks = sources.load_mbpp_full(SOURCES_DIR / "mbpp.jsonl", sources.mbpp_train_ids())
    ids = {int(t.task_id.split("/")[1]) for t in tasks}
    assert len(ids) == 474
    assert not ids & set(range(11, 511))


@needs_sources
def test_descriptions_and_seeds():
    paths = sources.locate(SOURCES_DIR, ALL_KEYS)
    humaneval = {t.task_id: t for t in sources.load_humaneval(paths[sources.HUMANEVAL])}
    first = humaneval["HumanEval/0"]
    assert first.description.startswith("Check if in given list of numbers")
    assert ">>>" not in first.description and "has_close_elements(" not in first.description
    assert first.test_inputs[0] == ([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3)
    crux = sources.load_cruxeval(paths[sources.CRUXEVAL])[0]
    assert crux.description == "" and crux.description_origin == "none"
    assert crux.test_inputs == (([1, 1, 3, 1, 3, 1],),)


def test_literal_calls_keep_order_and_skip_non_literals():
    test = "assert f([1, 2]) == 3\nassert f(x) == 1\nassert g(1)\nassert f(-5, 'a') and f([1, 2])\n"
    assert sources.literal_calls(test, "f") == (([1, 2],), (-5, "a"))


def test_humaneval_description_stops_at_examples():
    code = 'def g(a):\n    """Doubles a.\n    More text.\n    For example:\n    g(2) == 4\n    """\n    return 2 * a\n'
    assert sources.humaneval_description(code, "g") == "Doubles a. More text."
