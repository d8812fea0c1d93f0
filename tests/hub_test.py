"""Checkpoints named by a Hugging Face repo id: resolved from a prepared local hub cache, offline."""

import json
import pathlib

import pytest

from pau_jax import hub


def _cache_with(root: pathlib.Path, repo_id: str, files: dict[str, str]) -> pathlib.Path:
    """A hub cache holding one snapshot of ``repo_id`` (the layout huggingface_hub writes)."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_cached_repo_id_resolves_to_its_snapshot(offline_cache):
    snapshot = _cache_with(offline_cache, "acme/tiny-model", {"config.json": "{}"})
    assert hub.resolve("acme/tiny-model") == snapshot


def test_an_uncached_repo_id_offline_fails_with_one_line(offline_cache):
    with pytest.raises(hub.HubError) as info:
        hub.resolve("acme/not-there")
    message = str(info.value)
    assert "\n" not in message
    assert "acme/not-there" in message and "HF_HUB_OFFLINE=1" in message


def test_paths_are_not_repo_ids(offline_cache, tmp_path, monkeypatch):
    local = tmp_path / "owner" / "model"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not hub.is_repo_id("owner/model")  # exists as a relative directory
    assert hub.resolve("owner/model") == pathlib.Path("owner/model")
    for path in ("/abs/path", "./rel/x", "~/ckpt", "one-part", "a/b/c"):
        assert not hub.is_repo_id(path), path
    assert hub.resolve("~/ckpt") == pathlib.Path("~/ckpt").expanduser()
    assert hub.is_repo_id("Qwen/Qwen3-8B")


def test_a_repo_id_loads_as_a_checkpoint(offline_cache, tmp_path):
    from pau_jax import models
    from pau_jax.models import qwen3

    config = qwen3.Qwen3Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        max_position_embeddings=64,
    )
    written = models.random_checkpoint(config, tmp_path / "ckpt", tokenizer=False)
    snapshot = _cache_with(offline_cache, "acme/tiny-qwen3", {})
    for file in written.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    model, loaded = models.load_hf("acme/tiny-qwen3")
    assert loaded == config
    assert model.config == config


# What the launcher's --dry_run asks of every checkpoint: would it load?


def _weights(path: pathlib.Path) -> None:
    import numpy as np
    import safetensors.numpy

    safetensors.numpy.save_file({"w": np.ones((3, 5), np.float32)}, str(path))


def test_a_whole_checkpoint_has_no_problem_and_a_sharded_one_needs_every_shard(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    _weights(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert hub.checkpoint_problem(folder) is None
    index["weight_map"]["b"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert hub.checkpoint_problem(folder) == (
        f"checkpoint {folder} lacks model-00002-of-00002.safetensors, named by its index"
    )


def test_weights_cut_short_or_zeroed_are_not_whole(tmp_path):
    path = tmp_path / "model.safetensors"
    _weights(path)
    data = path.read_bytes()
    assert hub.whole_safetensors(path)
    garbage = b"\xff" * len(data)  # a header length of 2**64 - 1
    for broken in (data[:-1], bytes(len(data)), data[:5], data + b"x", garbage):
        path.write_bytes(broken)
        assert not hub.whole_safetensors(path)


def test_a_repo_id_is_checked_in_the_cache_only_offline(offline_cache, monkeypatch):
    problem = hub.checkpoint_problem("acme/not-there")
    assert "acme/not-there is not a directory and not in the Hugging Face cache" in problem
    _cache_with(offline_cache, "acme/cached", {"config.json": "{}"})
    assert "holds no *.safetensors weights" in hub.checkpoint_problem("acme/cached")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # Downloaded when the run starts.
    assert hub.checkpoint_problem("acme/not-there") is None
