"""Embedders: the local one (batching, padding, truncation) and `/v1/embeddings` of the server."""

import json
import urllib.error
import urllib.request

import checkpoints
import numpy as np
import pytest

from pau_jax.policy import embeddings
from pau_jax.policy.embeddings import HTTPEmbedder, HTTPEmbeddingConfig, LocalEmbeddingConfig
from pau_jax.policy.server import PolicyServer

TEXTS = ["adds two numbers", "sorts a list of strings by their length, longest first", "x"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    from flax import nnx

    from pau_jax.models import qwen3

    path = tmp_path_factory.mktemp("embedding")
    config = checkpoints.tiny_qwen3_config(max_position_embeddings=2048)
    qwen3.save_hf(qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), config, path)
    return embeddings.build_embedder(
        LocalEmbeddingConfig(
            checkpoint_dir=str(path), tokenizer="qwen3-offline", batch_size=2, pad_to_multiple=8
        )
    )


def test_local_embedder_batches_pads_and_truncates(embedder):
    together = embedder.embed(TEXTS)  # two forward passes (batch_size 2), padded to 8s
    alone = np.stack([embedder.embed([t])[0] for t in TEXTS])
    assert together.shape == (3, 32) and together.dtype == np.float32
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(together[0], together[1])
    assert embedder.encode(TEXTS[:1]) == [embedder.tokenizer(TEXTS[0])["input_ids"]]
    short = embeddings.LocalEmbedder(embedder.decoder, embedder.tokenizer, max_length=3)
    first = embedder.tokenizer(TEXTS[1])["input_ids"][:3]
    np.testing.assert_allclose(short.embed(TEXTS[1:2]), embedder.embed_ids([first]), atol=1e-5)
    with pytest.raises(ValueError, match="has no tokens"):
        embedder.embed(["fine", ""])


def _post(url, body):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_server_answers_embeddings_as_the_local_embedder(embedder):
    with PolicyServer(
        None, model_name="unused", embedder=embedder, embedding_model_name="tiny-embed"
    ) as server:
        client = HTTPEmbedder(
            HTTPEmbeddingConfig(base_url=server.base_url, model="tiny-embed", batch_size=2)
        )
        np.testing.assert_allclose(client.embed(TEXTS), embedder.embed(TEXTS), atol=1e-5)
        status, body = _post(
            server.base_url + "/embeddings", {"input": TEXTS[0], "model": "tiny-embed"}
        )
        assert status == 200 and body["model"] == "tiny-embed" and len(body["data"]) == 1
        assert body["usage"]["prompt_tokens"] == len(embedder.encode(TEXTS[:1])[0])
        assert _post(server.base_url + "/embeddings", {"input": TEXTS[0]})[0] == 200
        # Another model's name is not answered with this model's vectors.
        status, body = _post(server.base_url + "/embeddings", {"input": TEXTS[0], "model": "m"})
        assert status == 404 and body["error"]["code"] == "model_not_found"
        with urllib.request.urlopen(server.base_url + "/models", timeout=10) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == ["tiny-embed"]
        for bad in (
            {"input": []},
            {"input": [1, 2]},
            {"input": [""]},
            {"input": "a", "dimensions": 8},
        ):
            status, body = _post(server.base_url + "/embeddings", bad)
            assert status == 400 and body["error"]["message"], bad
        status, body = _post(server.base_url + "/chat/completions", {"messages": []})
        assert status == 404 and "no chat model" in body["error"]["message"]
    with pytest.raises(ValueError, match="needs a policy, an embedder, or both"):
        PolicyServer(None, model_name="nothing")


def test_a_failing_endpoint_raises_one_clear_error(monkeypatch):
    monkeypatch.delenv("PAU_OPENAI_EMBEDDING_MODEL", raising=False)
    with pytest.raises(ValueError, match="no embedding model name"):
        HTTPEmbedder(HTTPEmbeddingConfig(base_url="http://127.0.0.1:9/v1"))
    client = HTTPEmbedder(
        HTTPEmbeddingConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=1, backoff_s=0)
    )
    with pytest.raises(RuntimeError, match="failed after 2 attempts"):
        client.embed(["a"])
    assert client.retries == 1
