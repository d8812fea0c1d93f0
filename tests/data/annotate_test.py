"""Tests of the description annotator against a local OpenAI-compatible HTTP server."""

import http.server
import json
import threading

import pytest

from pau_jax.data import annotate


class _Handler(http.server.BaseHTTPRequestHandler):
    requests: list = []
    reply: dict = {}

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, self.headers.get("Authorization"), body))
        payload = json.dumps(type(self).reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.requests = []
    _Handler.reply = {"choices": [{"message": {"role": "assistant", "content": " Adds one. "}}]}
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_asks_once_then_answers_from_cache(server, tmp_path):
    config = annotate.AnnotatorConfig(
        base_url=server, model="m", api_key="k", cache_dir=str(tmp_path)
    )
    annotator = annotate.Annotator(config)
    assert annotator.describe("def f(x):\n    return x + 1\n") == "Adds one."
    assert annotator.describe("def f(x):\n    return x + 1\n") == "Adds one."
    assert len(_Handler.requests) == 1
    path, auth, body = _Handler.requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer k"
    assert body["model"] == "m" and "return x + 1" in body["messages"][0]["content"]
    # A new annotator reads the cache on disk.
    assert annotate.Annotator(config).describe("def f(x):\n    return x + 1\n") == "Adds one."
    assert len(_Handler.requests) == 1
    annotator.describe("def f(x):\n    return x + 2\n")
    assert len(_Handler.requests) == 2


def test_bad_answer_is_an_error(server, tmp_path):
    _Handler.reply = {"choices": []}
    annotator = annotate.Annotator(
        annotate.AnnotatorConfig(base_url=server, model="m", cache_dir=str(tmp_path))
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
