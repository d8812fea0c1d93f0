"""The OpenAI-compatible client against the local server, and against injected faults."""

import concurrent.futures
import dataclasses
import http.server
import json
import socket
import threading
import time
import urllib.request

import checkpoints
import pytest

from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.http import EndpointError, HTTPConfig, HTTPPolicy, TooLong
from pau_jax.policy.local import LocalPolicy
from pau_jax.policy.server import PolicyServer
from pau_jax.sampling.prefix_cache import PrefixCache

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
    tokenizer = load_tokenizer("qwen3-offline")
    cache = PrefixCache(max_bytes=1 << 28)
    return LocalPolicy(model, tokenizer, SamplingConfig(max_new_tokens=6), prefix_cache=cache)


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


def _post(server, body: bytes) -> tuple[int, str]:
    """(status, error message or '') of one chat-completions request to the local server."""
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


def test_server_rejects_bad_requests(server):
    def post(body):
        return _post(server, body)

    assert post(b"{not json") == (400, "request body is not valid JSON")
    code, message = post(json.dumps({"messages": "hi"}).encode())
    assert code == 400 and "messages" in message
    code, message = post(json.dumps({"messages": CONVERSATIONS[0], "max_tokens": 0}).encode())
    assert code == 400 and "max_tokens" in message
    for penalty in (0, -1.5, "1.2", True, [1.2]):
        body = {"messages": CONVERSATIONS[0], "repetition_penalty": penalty}
        code, message = post(json.dumps(body).encode())
        assert code == 400 and "repetition_penalty" in message, penalty


# Penalty 2 changes the tiny model's greedy replies (checked below, so the tests can fail).
PENALTY = 2.0


def test_repetition_penalty_is_sent_and_applied_by_the_server(server, local_policy):
    penalised = dataclasses.replace(local_policy.sampling, repetition_penalty=PENALTY)
    direct = [c.text for c in local_policy.complete(CONVERSATIONS, penalised)]
    assert direct != local_policy(CONVERSATIONS)
    client = HTTPPolicy(
        HTTPConfig(
            base_url=server.base_url, model="tiny-qwen3", max_tokens=6, repetition_penalty=PENALTY
        )
    )
    assert client(CONVERSATIONS) == direct and not client.failures


def test_server_batches_requests_with_different_penalties_row_by_row(local_policy):
    penalties = [None, PENALTY, PENALTY]  # null: the policy's own (1.0)
    expected = [
        local_policy.complete(
            [c], dataclasses.replace(local_policy.sampling, repetition_penalty=p)
        )[0].text
        for c, p in zip(CONVERSATIONS, [1.0, PENALTY, PENALTY])
    ]

    def ask(args):
        messages, penalty = args
        payload = {"model": "tiny-qwen3", "messages": messages, "max_tokens": 6}
        payload["repetition_penalty"] = penalty
        request = urllib.request.Request(
            server.base_url + "/chat/completions",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            return json.loads(r.read())["choices"][0]["message"]["content"]

    # A batch closes as soon as it holds max_batch = 3 requests, so the long wait costs nothing.
    with PolicyServer(
        local_policy, model_name="tiny-qwen3", max_batch=3, batch_wait_s=10
    ) as server:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            served = list(pool.map(ask, zip(CONVERSATIONS, penalties)))
        # One sampler call for all three requests, despite their different penalties.
        assert server.batch_sizes == [3]
    assert served == expected
    assert (
        expected[0]
        != local_policy.complete(
            [CONVERSATIONS[0]],
            dataclasses.replace(local_policy.sampling, repetition_penalty=PENALTY),
        )[0].text
    )


class FaultyHandler(http.server.BaseHTTPRequestHandler):
    """Plays a script of faults, one per request, then answers normally."""

    script: list = []
    seen = 0
    bodies: list = []

    def log_message(self, *args):
        del args

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        FaultyHandler.bodies.append(json.loads(body))
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
        elif kind == "too_long":  # vLLM's words for a prompt over the context
            message = (
                "This model's maximum context length is 32 tokens. However, you requested "
                "40 tokens (24 in the messages, 16 in the completion)."
            )
            data, status = json.dumps({"error": {"message": message, "code": 400}}), 400
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
    FaultyHandler.bodies = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _client(url, **kw):
    return HTTPPolicy(HTTPConfig(base_url=url, model="m", backoff_s=0.01, timeout_s=0.3, **kw))


def test_request_body_carries_repetition_penalty_only_when_set(faulty):
    assert _client(faulty, repetition_penalty=1.2)(CONVERSATIONS[:1]) == ["fine"]
    assert _client(faulty)(CONVERSATIONS[:1]) == ["fine"]
    with_penalty, without = FaultyHandler.bodies
    assert with_penalty["repetition_penalty"] == 1.2
    assert "repetition_penalty" not in without
    assert with_penalty["messages"] == CONVERSATIONS[0]
    with pytest.raises(ValueError, match="repetition_penalty"):
        HTTPConfig(repetition_penalty=0.0)


def test_only_role_and_content_are_sent(faulty):
    """Keys a local policy reads (token ids of a multi-turn reply) never leave the process."""
    conversation = [
        {"role": "user", "content": "Plan?"},
        {"role": "assistant", "content": "A plan.", "tokens": {"prompt_ids": (1, 2)}},
        {"role": "user", "content": "Now the call."},
    ]
    assert _client(faulty)([conversation]) == ["fine"]
    (body,) = FaultyHandler.bodies
    assert body["messages"] == [{"role": m["role"], "content": m["content"]} for m in conversation]


def test_complete_sends_each_rows_stop_strings_and_ignores_answers(faulty):
    client = _client(faulty, stop=("END",), max_concurrency=1)
    conversations = CONVERSATIONS[:2]
    replies = client.complete(conversations, answers=["shape", None], stop=[["\n\n", "END"], []])
    assert replies == ["fine", "fine"]
    first, second = FaultyHandler.bodies
    assert first["stop"] == ["END", "\n\n"] and second["stop"] == ["END"]
    assert set(first) == set(second)  # answer shapes are not sent
    assert _client(faulty).complete(conversations[:1]) == ["fine"]
    assert "stop" not in FaultyHandler.bodies[-1]
    with pytest.raises(ValueError, match="stop has 1 entries for 2 conversations"):
        client.complete(conversations, stop=[["x"]])


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


def _closed_port_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_persistent_failure_raises_one_line_endpoint_error(faulty):
    FaultyHandler.script = ["500"] * 3
    client = _client(faulty, max_retries=2, max_concurrency=1)
    with pytest.raises(EndpointError) as raised:
        client(CONVERSATIONS[:1])
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"endpoint {faulty}/chat/completions (model m) failed after 3 attempts"
    )
    assert "HTTP 500" in message and "rerun to resume" in message
    assert raised.value.attempts == 3 and FaultyHandler.seen == 3
    # Recorded as well as raised; never answered with an empty reply.
    assert [f.index for f in client.failures] == [0] and client.failures[0].attempts == 3


def test_client_error_is_not_retried_and_drops_the_rest_of_the_batch(faulty):
    FaultyHandler.script = ["400"]
    client = _client(faulty, max_retries=2, max_concurrency=1)
    with pytest.raises(EndpointError, match="failed after 1 attempt: HTTP 400"):
        client(CONVERSATIONS)
    # The other two requests of the batch were never sent.
    assert FaultyHandler.seen == 1 and client.retries == 0


def test_a_prompt_over_the_context_is_answered_too_long_not_failed(faulty):
    """A repeatable 400 (prompt over the context) ends that episode instead of every run."""
    FaultyHandler.script = ["too_long"]
    client = _client(faulty, max_retries=2, max_concurrency=1)
    replies = client(CONVERSATIONS[:2])
    assert isinstance(replies[0], TooLong) and replies[0] == ""
    assert replies[0].finish_reason == "prompt_length"
    assert replies[1] == "fine" and getattr(replies[1], "finish_reason", None) is None
    assert FaultyHandler.seen == 2 and not client.failures and client.retries == 0
    # Any other 400 still stops the run, its message intact.
    FaultyHandler.script = ["400"]
    with pytest.raises(EndpointError, match="HTTP 400: .*400"):
        client(CONVERSATIONS[:1])


def test_the_server_s_own_over_context_400_reads_as_too_long(local_policy):
    with PolicyServer(local_policy, model_name="tiny", max_context_tokens=64) as server:
        client = HTTPPolicy(HTTPConfig(base_url=server.base_url, model="tiny", max_tokens=6))
        long = [{"role": "user", "content": "word " * 200}]
        replies = client([long, CONVERSATIONS[0]])
    assert replies[0].finish_reason == "prompt_length" and replies[1]


def test_requests_in_flight_stop_retrying_when_one_fails(faulty):
    FaultyHandler.script = ["400"] + ["500"] * 10
    client = _client(faulty, max_retries=6, max_concurrency=2)
    client.config = dataclasses.replace(client.config, backoff_s=0.2)
    t0 = time.perf_counter()
    with pytest.raises(EndpointError, match="HTTP 400"):
        client(CONVERSATIONS[:2])
    # The request answered 500 gave up at its first retry, not after six (12.6 s of backoff).
    assert time.perf_counter() - t0 < 2.0 and FaultyHandler.seen <= 3


def test_refused_endpoint_raises():
    url = _closed_port_url()
    client = _client(url, max_retries=1)
    with pytest.raises(EndpointError) as raised:
        client(CONVERSATIONS[:1])
    assert raised.value.url == f"{url}/chat/completions" and raised.value.attempts == 2
    assert "URLError" in str(raised.value) and "\n" not in str(raised.value)
    assert client.failures[0].attempts == 2 and client.retries == 1


def test_endpoint_error_names_its_seat_on_one_line():
    error = EndpointError(url="http://h/v1", error="HTTP 502:\n<html>\n bad gateway", attempts=1)
    named = error.for_seat("judge")
    assert str(named).startswith("judge seat: endpoint http://h/v1 failed after 1 attempt: ")
    assert "HTTP 502: <html> bad gateway;" in str(named) and "\n" not in str(named)
    assert (named.url, named.error, named.attempts, named.seat) == (
        "http://h/v1",
        error.error,
        1,
        "judge",
    )


def test_missing_configuration_is_a_clear_error(monkeypatch):
    for name in ("PAU_OPENAI_BASE_URL", "OPENAI_BASE_URL", "PAU_OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="PAU_OPENAI_BASE_URL"):
        HTTPPolicy(HTTPConfig(model="m"))
    monkeypatch.setenv("PAU_OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="PAU_OPENAI_MODEL"):
        HTTPPolicy(HTTPConfig())


def test_a_request_extending_an_earlier_one_reuses_its_prefix(local_policy):
    """The served policy's prefix cache: the second turn prefills only what it appended,
    and answers as a policy without a cache does."""
    long_task = "Function header:\ndef test_func(a, b):\n" + "test_func(1, 2) -> 3\n" * 20
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": long_task}]
    with PolicyServer(local_policy, model_name="tiny-qwen3", batch_wait_s=0.0) as s:
        client = HTTPPolicy(HTTPConfig(base_url=s.base_url, model="tiny-qwen3", max_tokens=6))
        (reply,) = client([first])
        second = first + [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And test_func(2, 2)?"},
        ]
        (again,) = client([second])
        reused = local_policy.last_stats["reused_tokens"]
    fresh = LocalPolicy(
        local_policy.model, local_policy.tokenizer, local_policy.sampling, prefix_cache=None
    )
    assert reused >= 100  # the system prompt and the task, at least
    assert local_policy.last_stats["prefill_tokens"] < len(fresh.encode(second)) - reused + 1
    assert again == fresh([second])[0]


def test_stop_strings_are_sent_and_end_the_reply_on_the_server(local_policy):
    """A stop string the greedy reply contains: the served reply is the text before it."""
    longer = dataclasses.replace(local_policy.sampling, max_new_tokens=24)
    full = local_policy.complete(CONVERSATIONS[:1], longer)[0]
    text = full.text
    assert len(text) > 12
    stop = text[6:9]
    expected = text[: text.find(stop)]
    cut = local_policy.complete(CONVERSATIONS[:1], longer, stop=[[stop]])[0]
    assert cut.text == expected and cut.finish_reason == "stop"
    # The sampler ended the row early: its tokens are a prefix of the full reply's.
    assert len(cut.token_ids) < len(full.token_ids)
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    with PolicyServer(local_policy, model_name="tiny-qwen3", batch_wait_s=0.0) as s:
        client = HTTPPolicy(
            HTTPConfig(base_url=s.base_url, model="tiny-qwen3", max_tokens=24, stop=(stop, "\x00"))
        )
        assert client(CONVERSATIONS[:1]) == [expected]
        plain = HTTPPolicy(HTTPConfig(base_url=s.base_url, model="tiny-qwen3", max_tokens=24))
        assert plain(CONVERSATIONS[:1]) == [text]
        for bad in (3, [""], ["x"] * 17):
            body = {"messages": CONVERSATIONS[0], "stop": bad}
            code, message = _post(s, json.dumps(body).encode())
            assert code == 400 and "stop" in message, bad
    with pytest.raises(ValueError, match="stop"):
        HTTPConfig(stop="abc")
