"""Checkpoints named by a Hugging Face repo id: resolved from a prepared local hub cache, offline."""

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
