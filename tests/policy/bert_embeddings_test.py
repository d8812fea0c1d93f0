"""The local embedder on a BERT checkpoint: transformers' mean pooling, in order, across batches."""

import json

import numpy as np
import pytest
from models.bert_testlib import TINY_BERT, make_tiny_bert, torch_mean_pooled

from pau_jax.policy import embeddings
from pau_jax.policy.embeddings import LocalEmbeddingConfig

TEXTS = [
    "adds two numbers.",
    "sorts a list of strings by length",
    "the sum",
    "returns the sum of a list of integers, sorted by length, the sum of two numbers, sorted.",
    "sorter",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("bert"), seed=7)


def test_build_embedder_on_bert_mean_pools_like_transformers(checkpoint):
    path, torch_model = checkpoint
    embedder = embeddings.build_embedder(
        LocalEmbeddingConfig(checkpoint_dir=str(path), batch_size=2, pad_to_multiple=8)
    )
    limit = TINY_BERT["max_position_embeddings"]
    assert embedder.max_length == limit and not embedder.pad_left
    tokens = embedder.tokenizer(TEXTS, truncation=True, max_length=limit, padding=True)
    ids, mask = np.asarray(tokens["input_ids"]), np.asarray(tokens["attention_mask"])
    assert mask[3].all() and ids.shape[1] == limit  # the long text is truncated
    assert ids[0, 0] == embedder.tokenizer.cls_token_id
    assert ids[3, -1] == embedder.tokenizer.sep_token_id
    _, expected = torch_mean_pooled(torch_model, ids, mask)
    vectors = embedder.embed(TEXTS)  # three forward passes (batch_size 2)
    assert vectors.shape == (len(TEXTS), TINY_BERT["hidden_size"]) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(embedder.embed(TEXTS[::-1]), expected[::-1], atol=1e-5)


def test_an_unsupported_model_type_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2'; a local embedder supports") as error:
        embeddings.build_embedder(LocalEmbeddingConfig(checkpoint_dir=str(tmp_path)))
    assert "'bert'" in str(error.value) and "'qwen3'" in str(error.value)
    assert "\n" not in str(error.value)
