"""`PolicyServer` against bad clients: every malformed request refused alone with a 4xx."""

import concurrent.futures
import http.client
import json
import logging
import socket
import threading
import time

import checkpoints
import pytest

from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.http import HTTPConfig, HTTPPolicy
from pau_jax.policy.local import LocalPolicy
from pau_jax.policy.server import API_KEY_ENV, PolicyServer

CONTEXT = 256  # the tiny model's max_position_embeddings
MAX_TOKENS = 4
GOOD = [
    [{"role": "user", "content": "What does test_func(3) return?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
    [{"role": "user", "content": "Write (1, 2)"}],
    [{"role": "user", "content": "Hi"}],
]


@pytest.fixture(scope="module")
def policy():
    from flax import nnx

    from pau_jax.models import qwen3
    from pau_jax.tokenizer import load_tokenizer

    config = checkpoints.tiny_qwen3_config(max_position_embeddings=CONTEXT)
    model = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    return LocalPolicy(
        model, load_tokenizer("qwen3-offline"), SamplingConfig(max_new_tokens=MAX_TOKENS)
    )


@pytest.fixture(scope="module")
def expected(policy):
    """Each good conversation's greedy reply, asked alone."""
    return [policy.complete([c])[0].text for c in GOOD]


@pytest.fixture
def server(policy):
    with PolicyServer(policy, model_name="tiny", read_timeout_s=1.0) as s:
        yield s


def _address(server) -> tuple[str, int]:
    return server._httpd.server_address[:2]


def _raw(server, data: bytes, timeout: float = 10) -> tuple[int, dict]:
    """(status, JSON body) of raw bytes sent on a fresh connection."""
    with socket.create_connection(_address(server), timeout=timeout) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


def _post(server, body, headers=None, path="/v1/chat/completions", timeout=60):
    """(status, JSON body) of one POST; `body` a dict (sent as JSON) or bytes."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection(*_address(server), timeout=timeout)
    try:
        connection.request(
            "POST", path, data, {"Content-Type": "application/json", **(headers or {})}
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _chat(messages, **fields) -> dict:
    return {"messages": messages, "max_tokens": MAX_TOKENS, **fields}


def _head(length: str | None = None, extra: str = "") -> bytes:
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: x", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def _one_line_error(payload: dict) -> str:
    error = payload["error"]
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
    return error["message"]


# Malformed bytes: each answered with one JSON error line, none left without an answer.
RAW = {
    "non_utf8": (_head("18") + b'{"messages": "\xff\xfe"}', 400, "UTF-8"),
    "content_length_not_a_number": (_head("abc") + b"{}", 400, "Content-Length"),
    "content_length_negative": (_head("-5") + b"{}", 400, "Content-Length"),
    "content_length_twice": (_head("2", "Content-Length: 3\r\n") + b"{}", 400, "Content-Length"),
    "content_length_missing": (_head(None), 411, "Content-Length"),
    "chunked": (_head(None, "Transfer-Encoding: chunked\r\n") + b"2\r\n{}\r\n0\r\n\r\n", 411, ""),
    "body_of_50_mb": (_head(str(50 * 2**20)), 413, "limit"),
    "json_nested_too_deep": (_head("200000") + b"[" * 200000, 400, "JSON"),
    "body_shorter_than_declared": (_head("100") + b"{}", 408, "within"),
}


@pytest.mark.parametrize("case", sorted(RAW))
def test_malformed_bytes_get_a_json_4xx(server, case):
    data, status, words = RAW[case]
    started = time.monotonic()
    code, payload = _raw(server, data)
    assert code == status and words in _one_line_error(payload), payload
    assert time.monotonic() - started < 8


def test_a_silent_connection_is_closed_after_the_read_timeout(server):
    with socket.create_connection(_address(server), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server, nothing sent
        assert time.monotonic() - started < 8


# Malformed fields: 400 (404 for a model not served), naming the field as OpenAI's `param`.
FIELDS = {
    "temperature_nan": (
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        "temperature",
    ),
    "top_p_infinite": (
        b'{"messages": [{"role": "user", "content": "x"}], "top_p": Infinity}',
        "top_p",
    ),
    "temperature_above_2": (_chat(GOOD[0], temperature=2.5), "temperature"),
    "top_p_0": (_chat(GOOD[0], top_p=0), "top_p"),
    "max_tokens_0": (_chat(GOOD[0], max_tokens=0), "max_tokens"),
    "max_tokens_bool": (_chat(GOOD[0], max_tokens=True), "max_tokens"),
    "max_tokens_float": (_chat(GOOD[0], max_tokens=2.5), "max_tokens"),
    "seed_string": (_chat(GOOD[0], seed="7"), "seed"),
    "seed_negative": (_chat(GOOD[0], seed=-1), "seed"),
    "seed_over_int64": (_chat(GOOD[0], seed=2**64), "seed"),
    "penalty_huge_int": (_chat(GOOD[0], repetition_penalty=10**400), "repetition_penalty"),
    "messages_empty": (_chat([]), "messages"),
    "message_without_content": (_chat([{"role": "user"}]), "messages"),
    "message_with_unknown_role": (_chat([{"role": "wizard", "content": "x"}]), "messages"),
    "message_not_utf8_encodable": (_chat([{"role": "user", "content": "a\ud800b"}]), "messages"),
    "stop_5_strings": (_chat(GOOD[0], stop=["a", "b", "c", "d", "e"]), "stop"),
    "stop_65_chars": (_chat(GOOD[0], stop="x" * 65), "stop"),
    "stop_10k_chars": (_chat(GOOD[0], stop=["y" * 10_000]), "stop"),
    "n_2": (_chat(GOOD[0], n=2), "n"),
    "stream": (_chat(GOOD[0], stream=True), "stream"),
    "model_not_a_string": (_chat(GOOD[0], model=["tiny"]), "model"),
    "over_context": (_chat(GOOD[0], max_tokens=CONTEXT), "messages"),
}


@pytest.mark.parametrize("case", sorted(FIELDS))
def test_malformed_fields_get_400_naming_the_field(server, case):
    body, param = FIELDS[case]
    started = time.monotonic()
    code, payload = _post(server, body)
    assert code == 400 and payload["error"]["param"] == param, payload
    assert param.split("_")[0] in _one_line_error(payload).lower() or param == "messages"
    assert time.monotonic() - started < 8  # refused before any batch or automaton


def test_seed_null_means_the_policys_own(server, expected):
    code, payload = _post(server, _chat(GOOD[0], seed=None))
    assert code == 200 and payload["choices"][0]["message"]["content"] == expected[0]


def test_an_over_context_request_names_the_limit(server, policy):
    prompt = len(policy.encode(GOOD[0]))
    code, payload = _post(server, _chat(GOOD[0], max_tokens=CONTEXT - prompt + 1))
    message = _one_line_error(payload)
    assert code == 400 and message.startswith(
        f"This model's maximum context length is {CONTEXT} tokens. However, you requested "
        f"{CONTEXT + 1} tokens ({prompt} in the messages, {CONTEXT - prompt + 1} in the completion)"
    )
    long = [{"role": "user", "content": "word " * CONTEXT}]  # over the context without max_tokens
    code, payload = _post(server, {"messages": long})
    assert (
        code == 400 and f"maximum context length is {CONTEXT} tokens" in payload["error"]["message"]
    )


def test_a_model_not_served_gets_404_and_aliases_are_served(policy, expected):
    with PolicyServer(policy, model_name=("tiny", "judge-alias")) as server:
        code, payload = _post(server, _chat(GOOD[0], model="gpt-4o"))
        assert code == 404 and payload["error"]["code"] == "model_not_found"
        assert payload["error"]["param"] == "model" and "gpt-4o" in payload["error"]["message"]
        for model, answered_as in (
            (None, "tiny"),
            ("tiny", "tiny"),
            ("judge-alias", "judge-alias"),
        ):
            body = _chat(GOOD[0]) if model is None else _chat(GOOD[0], model=model)
            code, payload = _post(server, body)
            assert code == 200 and payload["model"] == answered_as
            assert payload["choices"][0]["message"]["content"] == expected[0]
        connection = http.client.HTTPConnection(*_address(server), timeout=10)
        connection.request("GET", "/v1/models")
        models = json.loads(connection.getresponse().read())
        assert [m["id"] for m in models["data"]] == ["tiny", "judge-alias"]


def _ask_concurrently(bodies) -> list[tuple[int, dict]]:
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda args: _post(*args), bodies))


def test_a_bad_request_is_refused_alone_and_its_batch_answered(policy, expected):
    """A prompt the tokenizer cannot encode, sent with three good ones: only it fails."""
    bad = _chat([{"role": "user", "content": "\udcff"}])
    with PolicyServer(policy, model_name="tiny", max_batch=4, batch_wait_s=2.0) as server:
        bodies = [(server, _chat(c)) for c in GOOD[:3]] + [(server, bad)]
        answers = _ask_concurrently(bodies)
        assert server.batch_sizes == [3]  # the good ones, in one sampler call
    assert [a[1]["choices"][0]["message"]["content"] for a in answers[:3]] == expected[:3]
    assert answers[3][0] == 400 and answers[3][1]["error"]["param"] == "messages"


class _FailsOnBoom:
    """A policy whose sampler call fails whenever a conversation says 'boom'."""

    def __init__(self, policy):
        self.policy, self.model, self.sampling = policy, policy.model, policy.sampling

    def encode(self, messages):
        return self.policy.encode(messages)

    def complete(self, conversations, sampling, **kwargs):
        if any("boom" in m["content"] for c in conversations for m in c):
            raise RuntimeError("the sampler failed")
        return self.policy.complete(conversations, sampling, **kwargs)


def test_a_batch_that_fails_in_the_sampler_is_retried_row_by_row(policy, expected):
    boom = _chat([{"role": "user", "content": "boom"}])
    flaky = _FailsOnBoom(policy)
    with PolicyServer(flaky, model_name="tiny", max_batch=3, batch_wait_s=2.0) as server:
        answers = _ask_concurrently(
            [(server, _chat(GOOD[0])), (server, boom), (server, _chat(GOOD[1]))]
        )
        assert server.batch_sizes == [3, 1, 1, 1]
    assert [a[0] for a in answers] == [200, 500, 200]
    assert answers[1][1]["error"]["type"] == "server_error"
    assert [answers[i][1]["choices"][0]["message"]["content"] for i in (0, 2)] == expected[:2]


def test_an_api_key_is_required_when_set(policy, expected, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "s3cret")
    with PolicyServer(policy, model_name="tiny") as server:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            code, payload = _post(server, _chat(GOOD[0]), headers)
            assert code == 401 and payload["error"]["code"] == "invalid_api_key", headers
        connection = http.client.HTTPConnection(*_address(server), timeout=10)
        connection.request("GET", "/v1/models")
        assert connection.getresponse().status == 401
        keyed = HTTPPolicy(
            HTTPConfig(
                base_url=server.base_url, model="tiny", api_key="s3cret", max_tokens=MAX_TOKENS
            )
        )
        assert keyed(GOOD[:1]) == expected[:1]
    with PolicyServer(policy, model_name="tiny", api_key="") as server:  # '' turns it off
        assert _post(server, _chat(GOOD[0]))[0] == 200


def test_a_non_loopback_bind_without_a_key_is_logged(policy, caplog, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="pau_jax.policy.server"):
        with PolicyServer(policy, model_name="tiny", host="0.0.0.0"):
            assert "WITHOUT an API key" in caplog.text
        caplog.clear()
        with PolicyServer(policy, model_name="tiny", host="0.0.0.0", api_key="k"):
            pass
        with PolicyServer(policy, model_name="tiny") as loopback:  # the default bind
            assert loopback.base_url.startswith("http://127.0.0.1:")
        assert "API key" not in caplog.text


def test_the_listen_backlog_holds_64_waiting_connections(policy):
    """Nothing accepts (the server is not started): 64 connections still complete their handshake."""
    server = PolicyServer(policy, model_name="tiny")
    sockets = []
    for _ in range(64):
        sockets.append(socket.create_connection(_address(server), timeout=2))
    for sock in sockets:
        sock.close()
    server.stop()


def test_64_concurrent_clients_good_and_bad(policy, expected):
    """Good requests answered as when asked alone, bad ones refused, all within 120 s."""
    bad_bodies = [
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400),
        (_chat(GOOD[0], model="not-served"), 404),
        (_chat([{"role": "user", "content": "\ud800"}]), 400),
        (_chat(GOOD[1], max_tokens=CONTEXT), 400),
        (_chat(GOOD[2], stop=["z" * 1000]), 400),
        (_chat(GOOD[3], seed="1"), 400),
        (b"\xff" * 10, 400),
    ]
    raw_bad = [(_head("nope") + b"{}", 400), (_head(None), 411), (_head("10"), 408)]
    jobs = []
    for i in range(64):
        if i % 2 == 0:
            jobs.append(("good", i // 2 % len(GOOD)))
        elif i % 8 in (1, 5):
            jobs.append(("raw", i // 8 % len(raw_bad)))
        else:
            jobs.append(("bad", i // 2 % len(bad_bodies)))
    start = threading.Barrier(len(jobs))

    def client(server, job):
        kind, k = job
        start.wait()
        if kind == "raw":
            return _raw(server, raw_bad[k][0], timeout=60)
        body = _chat(GOOD[k], seed=None) if kind == "good" else bad_bodies[k][0]
        return _post(server, body, timeout=110)

    started = time.monotonic()
    with PolicyServer(policy, model_name="tiny", read_timeout_s=3.0) as server:
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            answers = list(pool.map(lambda job: client(server, job), jobs))
    assert time.monotonic() - started < 120
    for (kind, k), (code, payload) in zip(jobs, answers, strict=True):
        if kind == "good":
            assert code == 200 and payload["choices"][0]["message"]["content"] == expected[k]
        else:
            want = bad_bodies[k][1] if kind == "bad" else raw_bad[k][1]
            assert code == want and payload["error"]["message"], (kind, k, payload)
