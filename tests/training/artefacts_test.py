"""Run-directory artefacts: renamed into place whole, leftovers cleared, half-written bases rebuilt."""

import json
import pathlib
import shutil

import checkpoints
import pytest

from pau_jax import models
from pau_jax.training import artefacts


def test_replace_text_and_dir_swap_whole_artefacts_in(tmp_path):
    path = artefacts.replace_text(tmp_path / "summary.json", '{"steps": 1}\n')
    assert json.loads(path.read_text()) == {"steps": 1}
    artefacts.replace_text(path, '{"steps": 2}\n')
    assert json.loads(path.read_text()) == {"steps": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]

    def fill(text):
        return lambda tmp: (tmp / "a.txt").write_text(text)

    adapter = tmp_path / "adapter"
    artefacts.replace_dir(adapter, fill("one"))
    # Leftovers of a process killed while replacing the folder are cleared by the next call.
    (tmp_path / ".adapter.tmp").mkdir()
    (tmp_path / ".adapter.tmp" / "half").write_text("")
    (tmp_path / ".adapter.old").mkdir()
    artefacts.replace_dir(adapter, fill("two"))
    assert [p.name for p in adapter.iterdir()] == ["a.txt"] and (
        adapter / "a.txt"
    ).read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "summary.json"]

    def fail(tmp):
        (tmp / "a.txt").write_text("three")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        artefacts.replace_dir(adapter, fail)
    assert (
        adapter / "a.txt"
    ).read_text() == "two"  # The old folder stays until the new one is whole.


@pytest.fixture(scope="module")
def whole_base(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "base_model"
    models.random_checkpoint(checkpoints.tiny_qwen3_config(), path, seed=3)
    return path


def _cut(path: pathlib.Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# How a kill of the in-place writer of older versions left the folder (weights, config, tokenizer).
HALF_WRITTEN = {
    "no *.safetensors weights": lambda p: (p / "model.safetensors").unlink(),
    "model.safetensors is cut short": lambda p: _cut(p / "model.safetensors", 100_000),
    "no config.json": lambda p: (p / "config.json").unlink(),
    "no tokenizer_config.json": lambda p: (p / "tokenizer_config.json").unlink(),
    "no tokenizer.json": lambda p: (p / "tokenizer.json").unlink(),
    "tokenizer.json is cut short": lambda p: _cut(p / "tokenizer.json", 4096),
}


def test_half_written_base_models_are_told_apart_from_whole_ones(whole_base, tmp_path):
    assert artefacts.base_model_problem(whole_base) is None
    for problem, damage in HALF_WRITTEN.items():
        path = tmp_path / problem.replace(" ", "_")
        shutil.copytree(whole_base, path)
        damage(path)
        assert artefacts.base_model_problem(path) == problem


def test_a_half_written_base_model_is_rebuilt_in_one_line(whole_base, tmp_path, capsys):
    path = tmp_path / "base_model"
    shutil.copytree(whole_base, path)
    (path / "tokenizer.json").unlink()  # Killed after config.json, before the tokenizer.
    config = checkpoints.tiny_qwen3_config()
    assert artefacts.random_base_model(path, config, seed=3, tag="train") == path
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"[train] {path} is half-written (no tokenizer.json; a process was killed while "
        "writing it): rebuilding it"
    ]
    assert artefacts.base_model_problem(path) is None
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (path / name).read_bytes() == (whole_base / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base_model"]
    # A whole one is used as it is.
    before = (path / "model.safetensors").stat().st_mtime_ns
    artefacts.random_base_model(path, config, seed=3)
    assert (path / "model.safetensors").stat().st_mtime_ns == before
    assert capsys.readouterr().out == ""
