"""Tests of the description annotator against a local OpenAI-compatible HTTP server."""

import chat_stub
import pytest

from pau_jax.data import annotate

_REPLY = {"choices": [{"message": {"role": "assistant", "content": " Adds one. "}}]}


@pytest.fixture
def server():
    """(base URL, the requests it got); `reply["body"]` is what it answers."""
    reply = {"body": _REPLY}
    with chat_stub.serve(lambda body: reply["body"]) as (url, seen):
        yield url, seen, reply


def test_asks_once_then_answers_from_cache(server, tmp_path):
    url, requests, _ = server
    config = annotate.AnnotatorConfig(base_url=url, model="m", api_key="k", cache_dir=str(tmp_path))
    annotator = annotate.Annotator(config)
    assert annotator.describe("def f(x):\n    return x + 1\n") == "Adds one."
    assert annotator.describe("def f(x):\n    return x + 1\n") == "Adds one."
    assert len(requests) == 1
    path, auth, body = requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer k"
    assert body["model"] == "m" and "return x + 1" in body["messages"][0]["content"]
    # A new annotator reads the cache on disk.
    assert annotate.Annotator(config).describe("def f(x):\n    return x + 1\n") == "Adds one."
    assert len(requests) == 1
    annotator.describe("def f(x):\n    return x + 2\n")
    assert len(requests) == 2


def test_bad_answer_is_an_error(server, tmp_path):
    url, _, reply = server
    reply["body"] = {"choices": []}
    annotator = annotate.Annotator(
        annotate.AnnotatorConfig(base_url=url, model="m", cache_dir=str(tmp_path))
    )
    with pytest.raises(annotate.AnnotatorError, match="choices"):
        annotator.describe("def f():\n    return 1\n")
    assert not list(tmp_path.iterdir())


def test_unreachable_endpoint_is_an_error(tmp_path):
    config = annotate.AnnotatorConfig(
        base_url="http://127.0.0.1:9/v1", model="m", cache_dir=str(tmp_path), timeout_s=2
    )
    with pytest.raises(annotate.AnnotatorError, match="failed"):
        annotate.Annotator(config).describe("def f():\n    return 1\n")


def test_config_from_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(annotate.ENV_BASE_URL, raising=False)
    assert annotate.AnnotatorConfig.from_env() is None
    monkeypatch.setenv(annotate.ENV_BASE_URL, "http://127.0.0.1:1/v1")
    monkeypatch.delenv(annotate.ENV_MODEL, raising=False)
    with pytest.raises(annotate.AnnotatorError, match=annotate.ENV_MODEL):
        annotate.AnnotatorConfig.from_env()
    monkeypatch.setenv(annotate.ENV_MODEL, "m")
    monkeypatch.setenv(annotate.ENV_CACHE_DIR, str(tmp_path))
    config = annotate.AnnotatorConfig.from_env()
    assert config.model == "m" and config.cache_dir == str(tmp_path)
