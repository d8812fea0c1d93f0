"""A policy that calls any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, hosted APIs).

Requests of one batch run concurrently (bounded by `max_concurrency`). Each is
retried with exponential backoff on connection errors, timeouts, HTTP 429 and
5xx answers and unparseable bodies. A request that still fails is recorded in
`failures` and raises `EndpointError` (one line: the endpoint, the attempts, the
error): a failed request is never answered with an empty reply, so nothing is
scored as if the model had answered. The batch's requests not yet sent are
dropped and those in flight stop before their next retry. Finished work of the
caller (episodes and scores written to their files) stays, and a rerun resumes.
One 400 is an answer rather than a failure: a prompt longer than the model's context
(vLLM's and this project's server's "maximum context length", OpenAI's
`context_length_exceeded`, SGLang's "longer than the model's context length") would be
refused again on every rerun, so its reply is an empty `TooLong` with `finish_reason
'prompt_length'`, as a local policy answers it, and the episode ends there.

Configuration comes from arguments or the environment:
`PAU_OPENAI_BASE_URL` (or `OPENAI_BASE_URL`), `PAU_OPENAI_MODEL`,
`PAU_OPENAI_API_KEY` (or `OPENAI_API_KEY`).
"""

import concurrent.futures
import dataclasses
import io
import json
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from pau_jax.policy import check_per_row

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


# A 400 body that says the prompt does not fit the model's context (vLLM, SGLang, OpenAI,
# policy.server): the same request would be refused on every retry and every rerun.
_OVER_CONTEXT = re.compile(
    r"context_length_exceeded|maximum context length|longer than the model's context length"
    r"|exceeds the model's context",
    re.IGNORECASE,
)


class TooLong(str):
    """The empty reply to a prompt the endpoint refused as longer than its context."""

    finish_reason = "prompt_length"


class EndpointError(RuntimeError):
    """A request to a model endpoint that still failed after its retries; the run stops.

    Its message is one line: the seat (agent, judge, coder, embedder) when known,
    the endpoint, the attempts made, the error and what to do.

    Attributes:
      url: the endpoint (the URL requested, or the configured base URL).
      error: the last error.
      attempts: attempts made (None when not known).
      model: the model name sent (None when not known).
      seat: the seat the endpoint fills ('' when not known; see `for_seat`).
    """

    def __init__(
        self,
        *,
        url: str,
        error: str,
        attempts: int | None = None,
        model: str | None = None,
        seat: str = "",
    ):
        self.url, self.error, self.attempts, self.model, self.seat = (
            url,
            error,
            attempts,
            model,
            seat,
        )
        where = f"endpoint {url}" + (f" (model {model})" if model else "")
        tries = ""
        if attempts is not None:
            tries = f" after {attempts} attempt" + ("s" if attempts != 1 else "")
        super().__init__(
            (f"{seat} seat: " if seat else "")
            + f"{where} failed{tries}: {' '.join(error.split())}; "
            + "work finished so far is saved: fix the endpoint and rerun to resume"
        )

    def for_seat(self, seat: str) -> "EndpointError":
        """The same error, naming the seat whose endpoint failed."""
        return EndpointError(
            url=self.url, error=self.error, attempts=self.attempts, model=self.model, seat=seat
        )


class _Stopped(Exception):
    """Ends a request before it is sent or retried: another request of its batch failed."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Failure:
    """A request that failed after all retries (and raised `EndpointError`)."""

    index: int
    attempts: int
    error: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class HTTPConfig:
    """Where and how to call the endpoint.

    Attributes:
      base_url: e.g. http://127.0.0.1:8000/v1; default from the environment.
      model: the model name sent with each request; default from the environment.
      api_key: bearer token; default from the environment; may be empty for local servers.
      max_tokens, temperature, top_p, seed: sampling parameters sent with each request.
      repetition_penalty: None to send none; else sent as "repetition_penalty" (Hugging
        Face semantics; an extra sampling parameter that vLLM, SGLang and pau_jax's
        `PolicyServer` accept, not part of the OpenAI API).
      stop: strings that end a reply, sent as "stop" when not empty (the OpenAI API's: the
        reply ends before the first one and leaves it out; `PolicyServer` honours it).
      max_concurrency: requests in flight at once.
      timeout_s: per-request timeout.
      max_retries: retries after the first attempt.
      backoff_s: first backoff; doubles each retry (capped at 30 s).
    """

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0
    repetition_penalty: float | None = None
    stop: tuple[str, ...] = ()
    max_concurrency: int = 8
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 1.0

    def __post_init__(self):
        penalty = self.repetition_penalty
        if penalty is not None and not (math.isfinite(penalty) and penalty > 0):
            raise ValueError(f"repetition_penalty must be None or finite and > 0, got {penalty}")
        if isinstance(self.stop, str) or not all(isinstance(x, str) and x for x in self.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")


def env(*names: str) -> str | None:
    """The value of the first of these environment variables that is set and not empty."""
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    return None


def post_json(url: str, payload: dict, api_key: str, timeout_s: float) -> dict:
    """POSTs `payload` as JSON (with a bearer token when `api_key` is set); the JSON answer."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def with_retries(call, *, max_retries: int, backoff_s: float, on_retry=None):
    """Runs `call()` until it succeeds, retrying transient failures with exponential backoff.

    Retried: connection errors, timeouts, HTTP statuses in RETRY_STATUS and unusable
    bodies (`call` raising ValueError, KeyError, IndexError or TypeError). Other HTTP
    statuses end the attempts at once.

    Args:
      call: the request; returns the parsed result.
      max_retries: retries after the first attempt.
      backoff_s: first backoff; doubles each retry (capped at 30 s).
      on_retry: called before each retry.

    Returns:
      (ok, result or None, attempts made, the last error message or '').
    """
    error = ""
    for attempt in range(max_retries + 1):
        if attempt:
            if on_retry is not None:
                on_retry()
            time.sleep(min(30.0, backoff_s * 2 ** (attempt - 1)))
        try:
            return True, call(), attempt + 1, ""
        except urllib.error.HTTPError as e:
            error = f"HTTP {e.code}: {e.read()[:200].decode(errors='replace')}"
            if e.code not in RETRY_STATUS:
                break
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            error = f"{type(e).__name__}: {e}"
        except (ValueError, KeyError, IndexError, TypeError) as e:
            error = f"bad response: {type(e).__name__}: {e}"
    return False, None, attempt + 1, error


class HTTPPolicy:
    """A `Policy` over an OpenAI-compatible endpoint (see module docstring); replies are texts.

    `complete`'s `answers` are ignored (an endpoint's tokens cannot be masked here); its
    `stop` strings are sent with the request, after `HTTPConfig.stop`.
    """

    def __init__(self, config: HTTPConfig = HTTPConfig()):
        base_url = config.base_url or env("PAU_OPENAI_BASE_URL", "OPENAI_BASE_URL")
        model = config.model or env("PAU_OPENAI_MODEL")
        if not base_url:
            raise ValueError(
                "no endpoint: set HTTPConfig.base_url or PAU_OPENAI_BASE_URL (e.g. http://127.0.0.1:8000/v1)"
            )
        if not model:
            raise ValueError("no model name: set HTTPConfig.model or PAU_OPENAI_MODEL")
        self.config = config
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = config.api_key or env("PAU_OPENAI_API_KEY", "OPENAI_API_KEY") or ""
        self.failures: list[Failure] = []
        self.retries = 0
        self._lock = threading.Lock()

    def _post(self, payload: dict) -> dict:
        return post_json(self.url, payload, self.api_key, self.config.timeout_s)

    def _one(
        self, index: int, messages: Sequence[dict], stop: Sequence[str], cancel: threading.Event
    ) -> str:
        c = self.config
        payload = {
            "model": self.model,
            # Role and content only: keys a local policy reads (e.g. token ids) stay here.
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "max_tokens": c.max_tokens,
            "temperature": c.temperature,
            "top_p": c.top_p,
        }
        if c.seed is not None:
            payload["seed"] = c.seed
        if c.repetition_penalty is not None:
            payload["repetition_penalty"] = c.repetition_penalty
        strings = list(dict.fromkeys([*c.stop, *stop]))
        if strings:
            payload["stop"] = strings
        if cancel.is_set():
            raise _Stopped

        def request() -> str:
            try:
                body = self._post(payload)
            except urllib.error.HTTPError as e:
                if e.code != 400:
                    raise
                detail = e.read()
                if _OVER_CONTEXT.search(detail[:2000].decode(errors="replace")):
                    return TooLong()
                raise urllib.error.HTTPError(
                    e.url, e.code, e.msg, e.hdrs, io.BytesIO(detail)
                ) from e
            content = body["choices"][0]["message"]["content"]
            if not isinstance(content, str):
                raise TypeError("message content is not a string")
            return content

        ok, content, attempts, error = with_retries(
            request,
            max_retries=c.max_retries,
            backoff_s=c.backoff_s,
            on_retry=lambda: self._before_retry(cancel),
        )
        if ok:
            return content
        with self._lock:
            self.failures.append(Failure(index=index, attempts=attempts, error=error))
        cancel.set()
        raise EndpointError(url=self.url, model=self.model, attempts=attempts, error=error)

    def _before_retry(self, cancel: threading.Event) -> None:
        if cancel.is_set():
            raise _Stopped
        with self._lock:
            self.retries += 1

    def complete(
        self,
        conversations: Sequence[Sequence[dict]],
        *,
        answers: Sequence | None = None,
        stop: Sequence[Sequence[str]] | None = None,
    ) -> list[str]:
        """One reply text per conversation, in order (a `TooLong` where the endpoint refused
        the prompt as longer than the model's context).

        Args:
          conversations: chat conversations (lists of {"role", "content"} messages).
          answers: ignored: an endpoint samples its tokens unmasked (see `pau_jax.policy.Policy`).
          stop: per conversation, strings sent as the request's "stop" besides
            `HTTPConfig.stop` (the endpoint ends the reply before the first of them).

        Raises:
          EndpointError: a request still failed after its retries (the first such
            request of the batch; the others are dropped).
        """
        check_per_row(conversations, answers=answers, stop=stop)
        if not conversations:
            return []
        stops = stop if stop is not None else [()] * len(conversations)
        workers = min(self.config.max_concurrency, len(conversations))
        cancel = threading.Event()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        try:
            futures = [
                pool.submit(self._one, i, c, stops[i], cancel) for i, c in enumerate(conversations)
            ]
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            if any(f.done() and f.exception() is not None for f in futures):
                cancel.set()  # the rest end at once (queued) or before their next retry
                concurrent.futures.wait(futures)
                errors = [f.exception() for f in futures]
                raise next(e for e in errors if e is not None and not isinstance(e, _Stopped))
            replies = [f.result() for f in futures]
        except BaseException:
            # Ctrl-C (or any error) while requests are in flight: the queued ones never
            # start, the running ones stop before their next retry, nothing waits for them.
            cancel.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return replies

    def __call__(self, conversations: Sequence[Sequence[dict]]) -> list[str]:
        """The reply texts of `complete(conversations)`."""
        return self.complete(conversations)
