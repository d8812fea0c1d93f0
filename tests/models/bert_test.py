"""The BERT encoder against transformers: hidden states, mean pooling, prefixes, refused configs."""

import json

import numpy as np
import pytest
from models.bert_testlib import TINY_BERT, VOCAB, make_tiny_bert, right_padded, torch_mean_pooled

from pau_jax.models import bert


@pytest.mark.parametrize("prefixed", [False, True], ids=["BertModel", "bert.-prefixed"])
def test_hidden_states_and_mean_pooling_match_transformers(tmp_path, prefixed):
    path, torch_model = make_tiny_bert(tmp_path, seed=3, prefixed=prefixed)
    model, config = bert.load_hf(path)
    assert config.hidden_size == TINY_BERT["hidden_size"]
    ids, mask = right_padded(len(VOCAB), (9, 4, 1, 6), seed=5)
    hidden, pooled = torch_mean_pooled(torch_model, ids, mask)
    ours = np.asarray(model(ids, mask))
    np.testing.assert_allclose(ours, hidden, atol=1e-5)  # padded positions too
    vectors = np.asarray(bert.mean_pooled(model, ids, mask))
    assert vectors.shape == (4, TINY_BERT["hidden_size"]) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, pooled, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # A row's embedding does not depend on the padding after it.
    alone = np.asarray(bert.mean_pooled(model, ids[1:2, :4], mask[1:2, :4]))
    np.testing.assert_allclose(alone[0], vectors[1], atol=1e-5)


def _config(path, **changes):
    config_path = path / "config.json"
    config_path.write_text(json.dumps(dict(json.loads(config_path.read_text()), **changes)))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"hidden_act": "gelu_new"}, "hidden_act='gelu_new'; this BERT needs 'gelu'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type="),
        ({"is_decoder": True}, "is_decoder=True"),
        ({"model_type": "roberta"}, "model_type 'roberta', not 'bert'"),
        ({"num_attention_heads": 5}, "not a multiple of num_attention_heads 5"),
    ],
)
def test_unsupported_configs_are_refused_in_one_line(tmp_path, changes, message):
    path, _ = make_tiny_bert(tmp_path)
    _config(path, **changes)
    with pytest.raises(ValueError, match=message) as error:
        bert.load_hf(path)
    assert "\n" not in str(error.value)


def test_bad_inputs_and_checkpoints_are_refused(tmp_path):
    path, _ = make_tiny_bert(tmp_path / "ok")
    model, _ = bert.load_hf(path)
    ids, mask = right_padded(len(VOCAB), (3, 5), seed=1)
    with pytest.raises(ValueError, match="pad on the right"):
        bert.mean_pooled(model, ids[:, ::-1], mask[:, ::-1])
    long = np.ones((1, TINY_BERT["max_position_embeddings"] + 1), np.int32)
    with pytest.raises(ValueError, match="exceed max_position_embeddings"):
        bert.mean_pooled(model, long, long)
    _config(path, num_hidden_layers=3)
    with pytest.raises(ValueError, match="lacks .* tensor"):
        bert.load_hf(path)
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        bert.load_hf(tmp_path / "missing")
