"""The OpenAI-compatible client against the local server, and against injected faults."""

import http.server
import json
import threading
import time
import urllib.request

import checkpoints
import pytest

from pau_jax.policy.http import HTTPConfig, HTTPPolicy
from pau_jax.policy.local import LocalPolicy, SamplingConfig
from pau_jax.policy.server import PolicyServer

CONVERSATIONS = [
    [{"role": "user", "content": "What does test_func(3) return?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
    [{"role": "user", "content": "Write (1, 2)"}],
]


@pytest.fixture(scope="module")
def local_policy():
    from flax import nnx

    from pau_jax.models import qwen3
    from pau_jax.tokenizer import load_tokenizer

    config = checkpoints.tiny_qwen3_config(max_position_embeddings=2048)
    model = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    return LocalPolicy(model, load_tokenizer("qwen3-offline"), SamplingConfig(max_new_tokens=6))


@pytest.fixture(scope="module")
def server(local_policy):
    with PolicyServer(local_policy, model_name="tiny-qwen3", batch_wait_s=0.2) as s:
        yield s


def test_models_endpoint(server):
    with urllib.request.urlopen(server.base_url + "/models", timeout=10) as r:
        body = json.loads(r.read())
    assert [m["id"] for m in body["data"]] == ["tiny-qwen3"]


def test_http_client_gives_the_local_policy_text(server, local_policy):
    direct = local_policy(CONVERSATIONS)
    client = HTTPPolicy(HTTPConfig(base_url=server.base_url, model="tiny-qwen3", max_tokens=6))
    served = client(CONVERSATIONS)
    assert served == direct
    assert all(served) and not client.failures
    # The three concurrent requests were answered by one batched sampler call.
    assert max(server.batch_sizes) == 3


def test_server_rejects_bad_requests(server):
    def post(body):
        request = urllib.request.Request(
            server.base_url + "/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]["message"]
        return 200, ""

    assert post(b"{not json") == (400, "request body is not valid JSON")
    code, message = post(json.dumps({"messages": "hi"}).encode())
    assert code == 400 and "messages" in message
    code, message = post(json.dumps({"messages": CONVERSATIONS[0], "max_tokens": 0}).encode())
    assert code == 400 and "max_tokens" in message


class FaultyHandler(http.server.BaseHTTPRequestHandler):
    """Plays a script of faults, one per request, then answers normally."""

    script: list = []
    seen = 0

    def log_message(self, *args):
        del args

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        kind = FaultyHandler.script.pop(0) if FaultyHandler.script else "ok"
        FaultyHandler.seen += 1
        if kind == "sleep":
            time.sleep(0.6)
            kind = "ok"
        if kind == "ok":
            data = json.dumps({"choices": [{"message": {"role": "assistant", "content": "fine"}}]})
            status = 200
        elif kind == "bad_json":
            data, status = "{oops", 200
        else:
            data, status = json.dumps({"error": {"message": kind}}), int(kind)
        body = data.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def faulty():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FaultyHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    FaultyHandler.seen = 0
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _client(url, **kw):
    return HTTPPolicy(HTTPConfig(base_url=url, model="m", backoff_s=0.01, timeout_s=0.3, **kw))


def test_faults_are_retried(faulty):
    FaultyHandler.script = ["500", "bad_json", "sleep", "503"]
    client = _client(faulty, max_retries=4, max_concurrency=1)
    assert client(CONVERSATIONS[:1]) == ["fine"]
    assert client.retries == 4 and not client.failures


def test_rate_limit_is_retried_and_counted(faulty):
    FaultyHandler.script = ["429", "429"]
    client = _client(faulty, max_retries=2, max_concurrency=1)
    assert client(CONVERSATIONS[:1]) == ["fine"]
    assert client.retries == 2 and FaultyHandler.seen == 3 and not client.failures


def test_persistent_failure_is_recorded_not_raised(faulty):
    FaultyHandler.script = ["500"] * 3 + ["400"]
    client = _client(faulty, max_retries=2, max_concurrency=1)
    assert client(CONVERSATIONS[:2]) == ["", ""]
    assert [f.index for f in client.failures] == [0, 1]
    assert client.failures[0].attempts == 3 and "HTTP 500" in client.failures[0].error
    # A 400 is the caller's fault and is not retried.
    assert client.failures[1].attempts == 1 and "HTTP 400" in client.failures[1].error


def test_unreachable_endpoint_is_recorded():
    client = _client("http://127.0.0.1:9/v1", max_retries=1)
    assert client(CONVERSATIONS[:1]) == [""]
    assert client.failures and client.failures[0].attempts == 2


def test_missing_configuration_is_a_clear_error(monkeypatch):
    for name in ("PAU_OPENAI_BASE_URL", "OPENAI_BASE_URL", "PAU_OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="PAU_OPENAI_BASE_URL"):
        HTTPPolicy(HTTPConfig(model="m"))
    monkeypatch.setenv("PAU_OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="PAU_OPENAI_MODEL"):
        HTTPPolicy(HTTPConfig())
