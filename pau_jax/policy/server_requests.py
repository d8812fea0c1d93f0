"""Checks of the server's requests: a malformed one is refused alone, with a 4xx and one line.

`PolicyServer` reads each body (`parse_body`) and checks each chat request
(`chat_request`, which also renders and tokenizes its messages) in the client's own
handler thread, before anything is batched: a request that fails here gets its 4xx and
never joins a batch of good ones. Errors are the OpenAI API's shape
(`{"error": {"message", "type", "param", "code"}}`).

Limits (module constants): `MAX_STOP_STRINGS` stop strings of at most `MAX_STOP_CHARS`
characters each (the sampler compiles each new set of stop strings into an automaton,
which grows with their length), `temperature` in [0, 2] and `top_p` in (0, 1] (as the
OpenAI API), `seed` an integer in [0, 2**63 - 1] or null (null: the policy's own), and
the prompt's tokens plus `max_tokens` within the model's context.
"""

import dataclasses
import json
import math
from collections.abc import Callable, Sequence

from pau_jax.policy.config import SamplingConfig

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64
MAX_TEMPERATURE = 2.0
MAX_SEED = 2**63 - 1
ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(ValueError):
    """A request the server refuses: its HTTP status and the OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code=None):
        super().__init__(message)
        self.status = status
        self.payload = error(message, param=param, code=code)


def error(message: str, kind: str = "invalid_request_error", *, param=None, code=None) -> dict:
    """The OpenAI API's error body, its message on one line."""
    message = " ".join(message.split())
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def parse_body(raw: bytes) -> dict:
    """The JSON object of a request body (UTF-8).

    Raises:
      RequestError: 400 when the body is not UTF-8, not JSON or not a JSON object.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        message = f"request body is not valid UTF-8 ({e.reason} at byte {e.start})"
        raise RequestError(400, message) from None
    try:
        body = json.loads(text or "{}")
    except (ValueError, RecursionError):
        raise RequestError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    return body


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatRequest:
    """A checked chat request.

    Attributes:
      messages: its messages, role and content only.
      sampling: the policy's settings with the request's applied.
      stop: its stop strings.
      model: the served name to answer with.
    """

    messages: list[dict]
    sampling: SamplingConfig
    stop: tuple[str, ...]
    model: str


def chat_request(
    body: dict,
    *,
    base: SamplingConfig,
    served: Sequence[str],
    encode: Callable[[list[dict]], list[int]],
    max_tokens_limit: int,
    context: int | None,
) -> ChatRequest:
    """Checks a `/v1/chat/completions` body and tokenizes its prompt.

    Args:
      body: the request's JSON object.
      base: the policy's sampling settings (the defaults).
      served: the chat model's served names; an absent or null `model` means the first.
      encode: messages -> prompt token ids (the policy's chat template).
      max_tokens_limit: the largest `max_tokens` a request may ask for.
      context: the model's context in tokens (prompt + reply); None for no check.

    Raises:
      RequestError: 404 for a model not served, 400 for anything else malformed.
    """
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "model must be a string", param="model")
    if model is not None and model not in served:
        raise RequestError(
            404,
            f"The model `{model[:100]}` does not exist; this server serves {list(served)}",
            param="model",
            code="model_not_found",
        )
    messages = _messages(body.get("messages"))
    sampling = _sampling(body, base, max_tokens_limit)
    stop = _stop_strings(body.get("stop"))
    try:
        prompt = encode(messages)
    except Exception as e:  # noqa: BLE001 - any template or tokenizer error is the request's.
        raise RequestError(
            400, f"messages cannot be tokenized: {type(e).__name__}: {e}", param="messages"
        ) from None
    if context is not None:
        asked = _first_set(body, "max_completion_tokens", "max_tokens")
        if asked is None and len(prompt) < context:  # the default, cut to what the context leaves
            sampling = dataclasses.replace(
                sampling, max_new_tokens=min(sampling.max_new_tokens, context - len(prompt))
            )
        if len(prompt) + sampling.max_new_tokens > context:
            raise RequestError(
                400,
                f"This model's maximum context length is {context} tokens. However, you "
                f"requested {len(prompt) + sampling.max_new_tokens} tokens ({len(prompt)} in "
                f"the messages, {sampling.max_new_tokens} in the completion). Please reduce the "
                "length of the messages or completion.",
                param="messages",
            )
    return ChatRequest(
        messages=messages,
        sampling=sampling,
        stop=stop,
        model=model if model is not None else served[0],
    )


def _messages(value) -> list[dict]:
    """The messages as {role, content} dicts (other keys dropped, token ids included)."""
    if not isinstance(value, list) or not value:
        raise RequestError(400, "messages must be a non-empty list", param="messages")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(
                400, f"messages[{i}] must be an object with a role in {ROLES}", param="messages"
            )
        if not isinstance(m.get("content"), str):
            raise RequestError(400, f"messages[{i}].content must be a string", param="messages")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _first_set(body: dict, *names: str):
    """The first of these fields that is present and not null (None if none is)."""
    return next((body[n] for n in names if body.get(n) is not None), None)


def _finite(value) -> float | None:
    """A JSON number as a finite float; None for anything else (bools, NaN, inf, huge ints)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _sampling(body: dict, base: SamplingConfig, max_tokens_limit: int) -> SamplingConfig:
    """The policy's settings with the request's applied (absent or null fields: the policy's)."""
    max_tokens = _first_set(body, "max_completion_tokens", "max_tokens")
    if max_tokens is None:
        max_tokens = min(base.max_new_tokens, max_tokens_limit)
    elif (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int)
        or not 1 <= max_tokens <= max_tokens_limit
    ):
        raise RequestError(
            400, f"max_tokens must be an integer in [1, {max_tokens_limit}]", param="max_tokens"
        )
    numbers = {}
    for name, default, ok, allowed in (
        ("temperature", base.temperature, lambda x: 0 <= x <= MAX_TEMPERATURE, "in [0, 2]"),
        ("top_p", base.top_p, lambda x: 0 < x <= 1, "in (0, 1]"),
        ("repetition_penalty", base.repetition_penalty, lambda x: x > 0, "> 0 (1 for none)"),
    ):
        value = body.get(name)
        if value is None:  # absent or null (as the OpenAI API and vLLM): the policy's own
            numbers[name] = float(default)
            continue
        number = _finite(value)
        if number is None or not ok(number):
            raise RequestError(400, f"{name} must be a finite number {allowed}", param=name)
        numbers[name] = number
    seed = body.get("seed")
    if seed is None:
        seed = base.seed
    elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise RequestError(400, "seed must be an integer in [0, 2**63 - 1] or null", param="seed")
    if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
        raise RequestError(400, "only n = 1 is supported", param="n")
    if body.get("stream") not in (None, False):
        raise RequestError(400, "streaming is not supported", param="stream")
    return dataclasses.replace(base, max_new_tokens=max_tokens, seed=seed, **numbers)


def _stop_strings(value) -> tuple[str, ...]:
    """A request's `stop` (absent, null, a string or a list of strings) as a tuple."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, list)
        or len(value) > MAX_STOP_STRINGS
        or not all(isinstance(x, str) and 0 < len(x) <= MAX_STOP_CHARS for x in value)
    ):
        raise RequestError(
            400,
            f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS}, each of "
            f"1 to {MAX_STOP_CHARS} characters",
            param="stop",
        )
    for x in value:
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(400, "stop strings must be valid Unicode", param="stop") from None
    return tuple(value)
