"""An OpenAI-compatible HTTP server over a local JAX policy and embedder, batching concurrent requests.

Endpoints: `GET /v1/models`, `POST /v1/chat/completions` (non-streaming, `n = 1`) and,
when the server has an embedder, `POST /v1/embeddings` (`input` a string or a list of
strings; float vectors of unit norm, last-token pooled as Qwen3-Embedding).
Requests arriving together are answered by one sampler call: a single batching
thread drains the queue (up to `max_batch` requests, waiting at most
`batch_wait_s` for more), groups them by sampling parameters, and runs each
group as one batch. Requests that differ only in `repetition_penalty` (an extra
parameter, as in vLLM and SGLang; Hugging Face semantics, > 0, 1 for none) or in
`stop` (a string or a list; the reply ends before the first, found by the sampler on
the device, as `LocalPolicy.complete`'s `stop`) share a batch, each row with its own.
Any client of the OpenAI chat API can then use a local model as judge, coder, teacher
or policy, and any client of the embeddings API (e.g. `policy.embeddings.HTTPEmbedder`)
a local embedding model.

    server = PolicyServer(local_policy, model_name="qwen3-local",
                          embedder=local_embedder, embedding_model_name="qwen3-embedding")
    server.start()            # binds 127.0.0.1 on a free port unless `port` is given
    print(server.base_url)    # http://127.0.0.1:PORT/v1
    ...
    server.stop()
"""

import dataclasses
import http.server
import json
import math
import queue
import threading
import time
import uuid

from pau_jax.policy.local import LocalPolicy

MAX_EMBEDDING_INPUTS = 2048
MAX_STOP_STRINGS = 16


@dataclasses.dataclass
class _Pending:
    messages: list
    sampling: object
    stop: tuple[str, ...] = ()
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: object = None
    error: str | None = None


class PolicyServer:
    """Serves a `LocalPolicy` and/or a `LocalEmbedder` over HTTP on a loopback address.

    Args:
      policy: the chat model; None serves embeddings only (chat requests get a 404).
      model_name: the chat model's name in `/v1/models` and responses.
      embedder: a `policy.embeddings.LocalEmbedder` (`encode`, `embed_ids`); None
        answers `/v1/embeddings` with a 404.
      embedding_model_name: the embedder's name (default: `model_name`).
      host, port: where to listen (port 0: a free one).
      max_batch, batch_wait_s: chat batching (see module docstring).
      max_tokens_limit: the largest `max_tokens` a chat request may ask for.
    """

    def __init__(
        self,
        policy: LocalPolicy | None,
        *,
        model_name: str,
        embedder=None,
        embedding_model_name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch: int = 16,
        batch_wait_s: float = 0.02,
        max_tokens_limit: int = 4096,
    ):
        if policy is None and embedder is None:
            raise ValueError("PolicyServer needs a policy, an embedder, or both")
        self.policy = policy
        self.model_name = model_name
        self.embedder = embedder
        self.embedding_model_name = embedding_model_name or model_name
        self._embed_lock = threading.Lock()
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.max_tokens_limit = max_tokens_limit
        self.batch_sizes: list[int] = []
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._httpd = http.server.ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "PolicyServer":
        for target in (self._httpd.serve_forever, self._batch_loop):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # Batching -------------------------------------------------------------------------

    def _batch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.max_batch:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    batch.append(self._queue.get(timeout=remaining))
                except queue.Empty:
                    break
            # The sampler takes one repetition penalty per row, so it does not split batches.
            groups: dict = {}
            for item in batch:
                key = dataclasses.replace(item.sampling, repetition_penalty=1.0)
                groups.setdefault(key, []).append(item)
            for sampling, items in groups.items():
                self.batch_sizes.append(len(items))
                try:
                    results = self.policy.complete(
                        [i.messages for i in items],
                        sampling,
                        repetition_penalties=[i.sampling.repetition_penalty for i in items],
                        stop=[i.stop for i in items],
                    )
                except Exception as e:  # noqa: BLE001 - reported to each waiting client as a 500.
                    for item in items:
                        item.error = f"{type(e).__name__}: {e}"
                        item.done.set()
                    continue
                for item, result in zip(items, results, strict=True):
                    item.result = result
                    item.done.set()

    # HTTP -----------------------------------------------------------------------------

    def _sampling_for(self, body: dict):
        base = self.policy.sampling
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", base.max_new_tokens))
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= self.max_tokens_limit:
            raise ValueError(f"max_tokens must be an integer in [1, {self.max_tokens_limit}]")
        temperature = body.get("temperature", base.temperature)
        top_p = body.get("top_p", base.top_p)
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError("temperature must be a number >= 0")
        if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise ValueError("top_p must be a number in (0, 1]")
        penalty = body.get("repetition_penalty")
        if penalty is None:  # absent or null (as vLLM): the policy's own
            penalty = base.repetition_penalty
        if (
            isinstance(penalty, bool)
            or not isinstance(penalty, (int, float))
            or not (math.isfinite(penalty) and penalty > 0)
        ):
            raise ValueError("repetition_penalty must be a finite number > 0 (1 for none)")
        if body.get("n", 1) != 1:
            raise ValueError("only n = 1 is supported")
        if body.get("stream"):
            raise ValueError("streaming is not supported")
        return dataclasses.replace(
            base,
            max_new_tokens=max_tokens,
            temperature=float(temperature),
            top_p=float(top_p),
            repetition_penalty=float(penalty),
            seed=int(body.get("seed", base.seed)),
        )

    def _embeddings(self, body: dict) -> tuple[int, dict]:
        if self.embedder is None:
            return 404, _error("this server has no embedding model")
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if (
            not isinstance(texts, list)
            or not texts
            or not all(isinstance(t, str) and t for t in texts)
        ):
            return 400, _error("input must be a non-empty string or a list of non-empty strings")
        if len(texts) > MAX_EMBEDDING_INPUTS:
            return 400, _error(f"at most {MAX_EMBEDDING_INPUTS} inputs per request")
        if body.get("encoding_format", "float") != "float":
            return 400, _error("only encoding_format 'float' is supported")
        if body.get("dimensions") is not None:
            return 400, _error("dimensions is not supported; the model's full vectors are returned")
        try:
            with self._embed_lock:
                ids = self.embedder.encode(texts)
                vectors = self.embedder.embed_ids(ids)
        except ValueError as e:
            return 400, _error(str(e))
        except Exception as e:  # noqa: BLE001 - reported to the client as a 500.
            return 500, _error(f"{type(e).__name__}: {e}", kind="server_error")
        tokens = sum(len(row) for row in ids)
        return 200, {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
                for i, v in enumerate(vectors)
            ],
            "model": self.embedding_model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _complete(self, body: dict) -> tuple[int, dict]:
        if self.policy is None:
            return 404, _error("this server has no chat model; it serves /v1/embeddings only")
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m
            for m in messages
        ):
            return 400, _error("messages must be a list of {role, content} objects")
        try:
            sampling = self._sampling_for(body)
            stop = _stop_strings(body.get("stop"))
        except ValueError as e:
            return 400, _error(str(e))
        pending = _Pending(messages=messages, sampling=sampling, stop=stop)
        self._queue.put(pending)
        pending.done.wait()
        if pending.error is not None:
            return 500, _error(pending.error, kind="server_error")
        r = pending.result
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": r.text},
                    "finish_reason": r.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "total_tokens": r.prompt_tokens + r.completion_tokens,
            },
        }

    def _handler_class(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # Keep the terminal quiet.
                del args

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - name fixed by http.server.
                if self.path.rstrip("/") == "/v1/models":
                    names = [server.model_name] if server.policy is not None else []
                    if server.embedder is not None:
                        names.append(server.embedding_model_name)
                    models = [
                        {"id": n, "object": "model", "owned_by": "pau_jax"}
                        for n in dict.fromkeys(names)
                    ]
                    self._send(200, {"object": "list", "data": models})
                else:
                    self._send(404, _error(f"no route {self.path}"))

            def do_POST(self):  # noqa: N802 - name fixed by http.server.
                routes = {
                    "/v1/chat/completions": server._complete,
                    "/v1/embeddings": server._embeddings,
                }
                route = routes.get(self.path.rstrip("/"))
                if route is None:
                    self._send(404, _error(f"no route {self.path}"))
                    return
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, _error("request body is not valid JSON"))
                    return
                if not isinstance(body, dict):
                    self._send(400, _error("request body must be a JSON object"))
                    return
                self._send(*route(body))

        return Handler


def _stop_strings(value) -> tuple[str, ...]:
    """A request's `stop` (absent, null, a string or a list of strings) as a tuple."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, list)
        or len(value) > MAX_STOP_STRINGS
        or not all(isinstance(x, str) and x for x in value)
    ):
        raise ValueError(f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS}")
    return tuple(value)


def _error(message: str, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind}}
