"""Optional gold-description annotator: any OpenAI-compatible endpoint, answers cached by code hash."""

import dataclasses
import hashlib
import json
import os
import pathlib
import urllib.error
import urllib.request

PROMPT_VERSION = 1
PROMPT = (
    "Describe what the following Python function does, in one short paragraph written for "
    "someone who will not see the code: what its arguments are, what it returns, and the rule "
    "that maps one to the other, including special cases. Do not name the function and do not "
    "quote the code.\n\n```python\n{code}\n```"
)
ENV_BASE_URL = "PAU_ANNOTATOR_BASE_URL"
ENV_MODEL = "PAU_ANNOTATOR_MODEL"
ENV_API_KEY = "PAU_ANNOTATOR_API_KEY"
ENV_CACHE_DIR = "PAU_ANNOTATOR_CACHE_DIR"


class AnnotatorError(Exception):
    """The endpoint failed or answered something unusable."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnnotatorConfig:
    """Where and how to ask for descriptions.

    Attributes:
      base_url: endpoint root, e.g. "http://127.0.0.1:8000/v1" (POSTs to /chat/completions).
      model: model name sent in the request.
      api_key: bearer token ("" sends none).
      cache_dir: folder of cached answers, one JSON file per code hash.
      timeout_s: HTTP timeout per request.
      max_tokens: answer length limit.
    """

    base_url: str
    model: str
    api_key: str = ""
    cache_dir: str = "~/.cache/pau_jax/descriptions"
    timeout_s: float = 120.0
    max_tokens: int = 300

    @classmethod
    def from_env(cls) -> "AnnotatorConfig | None":
        """Reads PAU_ANNOTATOR_BASE_URL / _MODEL / _API_KEY / _CACHE_DIR; None when unset."""
        base_url = os.environ.get(ENV_BASE_URL, "")
        if not base_url:
            return None
        model = os.environ.get(ENV_MODEL, "")
        if not model:
            raise AnnotatorError(f"{ENV_BASE_URL} is set but {ENV_MODEL} is not: set both")
        kwargs = {"base_url": base_url, "model": model, "api_key": os.environ.get(ENV_API_KEY, "")}
        if os.environ.get(ENV_CACHE_DIR):
            kwargs["cache_dir"] = os.environ[ENV_CACHE_DIR]
        return cls(**kwargs)


class Annotator:
    """Writes a description of a function from its original code.

    Args:
      config: endpoint settings.
    """

    def __init__(self, config: AnnotatorConfig):
        self.config = config
        self.cache_dir = pathlib.Path(config.cache_dir).expanduser()
        self.requests_sent = 0

    def _cache_path(self, code: str) -> pathlib.Path:
        key = f"{PROMPT_VERSION}\0{self.config.model}\0{code}".encode()
        return self.cache_dir / f"{hashlib.sha256(key).hexdigest()}.json"

    def describe(self, code: str) -> str:
        """The description of `code`, from the cache or from the endpoint.

        Raises:
          AnnotatorError: on an HTTP error, a timeout or an empty answer.
        """
        path = self._cache_path(code)
        if path.is_file():
            return json.loads(path.read_text())["description"]
        body = {
            "model": self.config.model,
            "messages": [{"role": "user", "content": PROMPT.format(code=code)}],
            "temperature": 0.0,
            "max_tokens": self.config.max_tokens,
        }
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        url = self.config.base_url.rstrip("/") + "/chat/completions"
        request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
        self.requests_sent += 1
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                answer = json.loads(response.read().decode())
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as e:
            raise AnnotatorError(f"annotator request to {url} failed: {e}") from e
        try:
            text = answer["choices"][0]["message"]["content"].strip()
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise AnnotatorError(
                f"annotator at {url} answered without choices[0].message.content"
            ) from e
        if not text:
            raise AnnotatorError(f"annotator at {url} answered an empty description")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"model": self.config.model, "description": text}))
        tmp.replace(path)
        return text
