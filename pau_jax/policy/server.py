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

Bad clients are refused one by one, each with a 4xx and a one-line error of the OpenAI
API's shape: every chat request is checked and its prompt tokenized in its own handler
thread before it may join a batch (`server_requests`), so a malformed request never fails
the good ones beside it (and should a batch still fail in the sampler, its requests are
retried one by one). Bodies need a `Content-Length` (411) of at most `max_body_bytes`
(413) and must be UTF-8 JSON (400); a client that stops sending for `read_timeout_s` is
answered 408 (mid-body) or disconnected; a `model` the server does not serve gets 404
(`model_not_found`; on `/v1/embeddings`, a name other than the embedder's), an absent one
is the first served name. With an API key
(`api_key`, or the environment variable `PAU_SERVER_API_KEY`), every request without
`Authorization: Bearer <key>` gets 401 (the key check, the body limits and the dispatch
are `server_http`'s). The server binds 127.0.0.1 by default; another address without a key is
logged as a warning.

    server = PolicyServer(local_policy, model_name="qwen3-local",
                          embedder=local_embedder, embedding_model_name="qwen3-embedding")
    server.start()            # binds 127.0.0.1 on a free port unless `port` is given
    print(server.base_url)    # http://127.0.0.1:PORT/v1
    ...
    server.stop()
"""

import dataclasses
import ipaddress
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Sequence

from pau_jax.policy import server_http
from pau_jax.policy.local import LocalPolicy
from pau_jax.policy.server_requests import ChatRequest, RequestError, chat_request, error

_log = logging.getLogger(__name__)

API_KEY_ENV = "PAU_SERVER_API_KEY"
MAX_EMBEDDING_INPUTS = 2048
MAX_BODY_BYTES = 8 * 2**20


@dataclasses.dataclass
class _Pending:
    request: ChatRequest
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: object = None
    error: str | None = None


class PolicyServer:
    """Serves a `LocalPolicy` and/or a `LocalEmbedder` over HTTP (see module docstring).

    Args:
      policy: the chat model; None serves embeddings only (chat requests get a 404).
      model_name: the chat model's served name, or several (aliases, as vLLM's
        `--served-model-name`): listed in `/v1/models`; a chat request naming another
        model gets a 404; one naming none is answered as the first.
      embedder: a `policy.embeddings.LocalEmbedder` (`encode`, `embed_ids`); None
        answers `/v1/embeddings` with a 404.
      embedding_model_name: the embedder's name (default: the first `model_name`).
      host, port: where to listen (port 0: a free one); loopback by default.
      max_batch, batch_wait_s: chat batching (see module docstring).
      max_tokens_limit: the largest `max_tokens` a chat request may ask for.
      max_context_tokens: a chat request's prompt plus `max_tokens` may not exceed it
        (default: the model's `max_position_embeddings`).
      api_key: the bearer token every request must carry; None reads `PAU_SERVER_API_KEY`;
        '' (or neither set) serves without one.
      max_body_bytes: the largest request body (a larger one gets a 413).
      read_timeout_s: how long a connection may stay silent while the server reads it (and
        an idle kept-alive connection stays open).
    """

    def __init__(
        self,
        policy: LocalPolicy | None,
        *,
        model_name: str | Sequence[str],
        embedder=None,
        embedding_model_name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch: int = 16,
        batch_wait_s: float = 0.02,
        max_tokens_limit: int = 4096,
        max_context_tokens: int | None = None,
        api_key: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        read_timeout_s: float = 30.0,
    ):
        if policy is None and embedder is None:
            raise ValueError("PolicyServer needs a policy, an embedder, or both")
        names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"model_name must be a name or a list of names, got {model_name!r}")
        self.policy = policy
        self.model_names = names
        self.model_name = names[0]
        self.embedder = embedder
        self.embedding_model_name = embedding_model_name or self.model_name
        self._embed_lock = threading.Lock()
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.max_tokens_limit = max_tokens_limit
        if max_context_tokens is None and policy is not None:
            max_context_tokens = getattr(policy.model.config, "max_position_embeddings", None)
        self.max_context_tokens = max_context_tokens
        self.api_key = os.environ.get(API_KEY_ENV, "") if api_key is None else api_key
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s
        self.batch_sizes: list[int] = []
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._httpd = server_http.HTTPServer((host, port), self._handler_class())
        self._threads: list[threading.Thread] = []
        address = self._httpd.server_address[0]
        if not self.api_key and not ipaddress.ip_address(address).is_loopback:
            _log.warning(
                "PolicyServer listens on %s, beyond this machine, WITHOUT an API key: anyone who "
                "can reach it can use the model; set api_key (or %s) or bind 127.0.0.1",
                address,
                API_KEY_ENV,
            )

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
        if self._threads:  # shutdown() waits for serve_forever, which never ran otherwise
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
                key = dataclasses.replace(item.request.sampling, repetition_penalty=1.0)
                groups.setdefault(key, []).append(item)
            for sampling, items in groups.items():
                self._run(sampling, items)

    def _run(self, sampling, items: list[_Pending]) -> None:
        """One sampler call for `items`; if it fails, each is run alone (only failing ones get 500)."""
        self.batch_sizes.append(len(items))
        try:
            results = self.policy.complete(
                [i.request.messages for i in items],
                sampling,
                repetition_penalties=[i.request.sampling.repetition_penalty for i in items],
                stop=[i.request.stop for i in items],
            )
            answered = list(zip(items, results, strict=True))
        except Exception as e:  # noqa: BLE001 - reported to the waiting client as a 500.
            if len(items) > 1:
                for item in items:
                    self._run(sampling, [item])
                return
            items[0].error = f"{type(e).__name__}: {e}"
            items[0].done.set()
            return
        for item, result in answered:
            item.result = result
            item.done.set()

    # Routes ---------------------------------------------------------------------------

    def _embeddings(self, body: dict) -> tuple[int, dict]:
        if self.embedder is None:
            return 404, error("this server has no embedding model")
        model = body.get("model")
        if model is not None and model != self.embedding_model_name:
            served = self.embedding_model_name
            return 404, error(
                f"The model `{str(model)[:100]}` does not exist; this server embeds with "
                f"['{served}']",
                param="model",
                code="model_not_found",
            )
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if (
            not isinstance(texts, list)
            or not texts
            or not all(isinstance(t, str) and t for t in texts)
        ):
            return 400, error("input must be a non-empty string or a list of non-empty strings")
        if len(texts) > MAX_EMBEDDING_INPUTS:
            return 400, error(f"at most {MAX_EMBEDDING_INPUTS} inputs per request")
        if body.get("encoding_format", "float") != "float":
            return 400, error("only encoding_format 'float' is supported")
        if body.get("dimensions") is not None:
            return 400, error("dimensions is not supported; the model's full vectors are returned")
        try:
            with self._embed_lock:
                ids = self.embedder.encode(texts)
                vectors = self.embedder.embed_ids(ids)
        except ValueError as e:
            return 400, error(str(e))
        except Exception as e:  # noqa: BLE001 - reported to the client as a 500.
            return 500, error(f"{type(e).__name__}: {e}", kind="server_error")
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
            return 404, error("this server has no chat model; it serves /v1/embeddings only")
        try:  # In this client's thread: a bad request never reaches a batch.
            request = chat_request(
                body,
                base=self.policy.sampling,
                served=self.model_names,
                encode=self.policy.encode,
                max_tokens_limit=self.max_tokens_limit,
                context=self.max_context_tokens,
            )
        except RequestError as e:
            return e.status, e.payload
        pending = _Pending(request)
        self._queue.put(pending)
        pending.done.wait()
        if pending.error is not None:
            return 500, error(pending.error, kind="server_error")
        r = pending.result
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
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

    def _models(self) -> dict:
        names = list(self.model_names) if self.policy is not None else []
        if self.embedder is not None:
            names.append(self.embedding_model_name)
        models = [{"id": n, "object": "model", "owned_by": "pau_jax"} for n in dict.fromkeys(names)]
        return {"object": "list", "data": models}

    # HTTP -----------------------------------------------------------------------------

    def _handler_class(self):
        routes = {"/v1/chat/completions": self._complete, "/v1/embeddings": self._embeddings}
        return server_http.handler_class(self, get={"/v1/models": self._models}, post=routes)
