"""Qwen3-Embedding checkpoints: loading with and without the `model.` prefix, pooling vs transformers."""

import json

import numpy as np
import pytest
import torch
from checkpoints import TINY_QWEN3, make_tiny_qwen3
from models.qwen3_testlib import left_padded
from transformers import Qwen3Config, Qwen3Model

from pau_jax.models import embedding


def _embedding_checkpoint(path, seed=0):
    """A random transformers `Qwen3Model` (what Qwen3-Embedding ships: no lm_head, no prefix)."""
    torch.manual_seed(seed)
    model = Qwen3Model(Qwen3Config(**TINY_QWEN3)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    return model


def _theirs(model, ids, mask):
    """transformers' last-token pooling of Qwen3-Embedding, L2-normalised."""
    with torch.no_grad():
        hidden = model(
            input_ids=torch.from_numpy(ids.astype(np.int64)),
            attention_mask=torch.from_numpy(mask.astype(np.int64)),
        ).last_hidden_state[:, -1]
    return torch.nn.functional.normalize(hidden, p=2, dim=1).numpy()


def test_pooled_embeddings_match_transformers_on_a_left_padded_batch(tmp_path):
    torch_model = _embedding_checkpoint(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3Model"]
    decoder, config = embedding.load_hf(tmp_path)
    assert config.hidden_size == TINY_QWEN3["hidden_size"]
    ids, mask = left_padded(TINY_QWEN3["vocab_size"], (9, 4, 1, 6), seed=5)
    ours = np.asarray(embedding.pooled(decoder, ids, mask))
    assert ours.shape == (4, TINY_QWEN3["hidden_size"])
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(ours, _theirs(torch_model, ids, mask), atol=1e-5)
    # A row's embedding does not depend on the padding around it.
    alone = np.asarray(embedding.pooled(decoder, ids[1:2, -4:], mask[1:2, -4:]))
    np.testing.assert_allclose(alone[0], ours[1], atol=1e-5)


def test_a_causal_lm_checkpoint_embeds_with_its_decoder(tmp_path):
    path, torch_model = make_tiny_qwen3(tmp_path, seed=1)  # `model.*` names and an lm_head
    decoder, _ = embedding.load_hf(path)
    ids, mask = left_padded(TINY_QWEN3["vocab_size"], (5, 3), seed=1)
    ours = np.asarray(embedding.pooled(decoder, ids, mask))
    np.testing.assert_allclose(ours, _theirs(torch_model.model, ids, mask), atol=1e-5)


def test_bad_inputs_and_checkpoints_are_refused(tmp_path):
    _embedding_checkpoint(tmp_path / "ok")
    decoder, _ = embedding.load_hf(tmp_path / "ok")
    ids, mask = left_padded(TINY_QWEN3["vocab_size"], (3, 2), seed=0)
    with pytest.raises(ValueError, match="pad on the left"):
        embedding.pooled(decoder, ids[:, ::-1], mask[:, ::-1])
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(
        json.dumps(dict(config, architectures=["Qwen3ForSequenceClassification"]))
    )
    with pytest.raises(ValueError, match="an embedding model must be one of"):
        embedding.load_hf(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="Qwen3-Embedding"):
        embedding.load_hf(tmp_path / "missing")
