"""Text embedders: a local checkpoint on a JAX model (Qwen3-Embedding or a BERT sentence encoder), or an OpenAI-compatible `/v1/embeddings` endpoint.

All satisfy `Embedder`: `embed(texts) -> [N, D] float32` rows of unit L2 norm,
in the order of `texts`. The local one tokenizes with the checkpoint's own
tokenizer (its special tokens included, truncated to `max_length` tokens) and
runs `batch_size` texts per forward pass; the checkpoint's config.json
`model_type` picks the model and its pooling:

- "qwen3" (Qwen3-Embedding): the Qwen3 decoder, batches padded on the left, the
  last token pooled (`models.embedding.pooled`);
- "bert" (sentence-transformers models such as all-MiniLM-L6-v2): the BERT
  encoder, batches padded on the right, texts truncated to at most
  `max_position_embeddings` tokens ([CLS] and [SEP] included), the mean over
  real tokens pooled (`models.bert.mean_pooled`).

The endpoint client sends `batch_size` texts per request and retries like
`http.HTTPPolicy`; unlike a chat seat it raises when a request still fails,
since a missing vector cannot be replaced by anything meaningful.

    embedder = build_embedder(LocalEmbeddingConfig(checkpoint_dir="~/.cache/pau_jax/all-minilm-l6-v2"))
    vectors = embedder.embed(["adds two numbers", "sorts a list"])    # [2, D]
"""

import dataclasses
import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from pau_jax.policy.http import env, post_json, with_retries


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Returns [len(texts), D] float32 unit vectors."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalEmbeddingConfig:
    """A local embedding checkpoint: Qwen3-Embedding (Qwen3 decoder) or BERT (sentence-transformers).

    Attributes:
      checkpoint_dir: folder with config.json (its `model_type` picks the model),
        safetensors and the tokenizer.
      dtype: parameter dtype ('float32' on CPU, 'bfloat16' on accelerators).
      tokenizer: tokenizer folder or 'qwen3-offline'; default: the checkpoint's own.
      max_length: texts are truncated to this many tokens (Qwen3-Embedding: 1024; BERT
        checkpoints also to their `max_position_embeddings`).
      batch_size: texts per forward pass.
      pad_to_multiple: sequence lengths are padded to a multiple of this (few compiled shapes).
    """

    checkpoint_dir: str | None = None
    dtype: str = "float32"
    tokenizer: str | None = None
    max_length: int = 1024
    batch_size: int = 32
    pad_to_multiple: int = 64

    def __post_init__(self):
        for name in ("max_length", "batch_size", "pad_to_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"LocalEmbeddingConfig.{name} must be >= 1")

    def build(self) -> "LocalEmbedder":
        """The embedder of this checkpoint (loaded here; see `build_embedder`)."""
        return _local_embedder(self)

    def describe(self) -> str:
        return f"checkpoint {self.checkpoint_dir} (max {self.max_length} tokens)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class HTTPEmbeddingConfig:
    """An OpenAI-compatible embeddings endpoint (vLLM, SGLang, hosted APIs, `PolicyServer`).

    Attributes:
      base_url: e.g. http://127.0.0.1:8000/v1; default `PAU_OPENAI_EMBEDDING_BASE_URL`,
        then `PAU_OPENAI_BASE_URL` / `OPENAI_BASE_URL`.
      model: the model name sent with each request; default `PAU_OPENAI_EMBEDDING_MODEL`.
      api_key: bearer token; default `PAU_OPENAI_API_KEY` / `OPENAI_API_KEY`.
      batch_size: texts per request.
      timeout_s: per-request timeout.
      max_retries: retries after the first attempt.
      backoff_s: first backoff; doubles each retry (capped at 30 s).
    """

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    batch_size: int = 32
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 1.0

    def build(self) -> "HTTPEmbedder":
        """The client of this endpoint."""
        return HTTPEmbedder(self)

    def describe(self) -> str:
        return f"endpoint {self.base_url or '$PAU_OPENAI_EMBEDDING_BASE_URL'} model {self.model}"


def _normalize(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)).astype(np.float32)


class LocalEmbedder:
    """Embeds texts with a loaded model and its tokenizer (see module docstring).

    Args:
      model: the Qwen3 decoder (`models.embedding.load_hf`) or another model `pool` takes.
      tokenizer: its tokenizer (special tokens are added, texts truncated to `max_length`).
      max_length: tokens per text at most.
      batch_size: texts per forward pass.
      pad_to_multiple: sequence lengths are padded to a multiple of this (capped at
        `max_length`), so few shapes are compiled.
      pool: `pool(model, ids [B, T], mask [B, T]) -> [B, D]` unit vectors; default
        `models.embedding.pooled` (the last token).
      pad_left: pad on the left (last-token pooling) or on the right (`models.bert.mean_pooled`).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_length: int = 1024,
        batch_size: int = 32,
        pad_to_multiple: int = 64,
        pool: Callable | None = None,
        pad_left: bool = True,
    ):
        if pool is None:
            from pau_jax.models import embedding

            pool = embedding.pooled
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.pad_to_multiple = pad_to_multiple
        self.pool = pool
        self.pad_left = pad_left
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0

    @property
    def decoder(self):
        """The model (its name when only Qwen3 decoders embedded)."""
        return self.model

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text: the tokenizer's special tokens included, at most `max_length`."""
        ids = self.tokenizer(
            list(texts), truncation=True, max_length=self.max_length, add_special_tokens=True
        )["input_ids"]
        out = [[int(t) for t in row] for row in ids]
        empty = [i for i, row in enumerate(out) if not row]
        if empty:
            raise ValueError(
                f"text {empty[0]} has no tokens; embed a non-empty text (e.g. a placeholder)"
            )
        return out

    def embed_ids(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """[N, D] float32 unit vectors of token-id rows, `batch_size` rows per forward pass."""
        out = []
        for start in range(0, len(ids), self.batch_size):
            rows = [list(r) for r in ids[start : start + self.batch_size]]
            n = len(rows)
            size = min(self.batch_size, 1 << (n - 1).bit_length())  # few compiled batch sizes
            rows += [rows[0]] * (size - n)
            longest = max(len(r) for r in rows)
            rounded = -(-longest // self.pad_to_multiple) * self.pad_to_multiple
            t = max(longest, min(rounded, self.max_length))
            batch = np.full((len(rows), t), self.pad_id, np.int32)
            mask = np.zeros((len(rows), t), np.int32)
            for i, row in enumerate(rows):
                span = slice(t - len(row), t) if self.pad_left else slice(0, len(row))
                batch[i, span] = row
                mask[i, span] = 1
            out.append(np.asarray(self.pool(self.model, batch, mask))[:n])
        if not out:
            return np.zeros((0, 0), np.float32)
        return np.concatenate(out).astype(np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), D] float32 unit vectors."""
        return self.embed_ids(self.encode(texts))


class HTTPEmbedder:
    """`embed(texts)` over an OpenAI-compatible `/embeddings` endpoint (see module docstring)."""

    def __init__(self, config: HTTPEmbeddingConfig = HTTPEmbeddingConfig()):
        base_url = config.base_url or env(
            "PAU_OPENAI_EMBEDDING_BASE_URL", "PAU_OPENAI_BASE_URL", "OPENAI_BASE_URL"
        )
        model = config.model or env("PAU_OPENAI_EMBEDDING_MODEL")
        if not base_url:
            raise ValueError(
                "no embeddings endpoint: set HTTPEmbeddingConfig.base_url or "
                "PAU_OPENAI_EMBEDDING_BASE_URL (e.g. http://127.0.0.1:8000/v1)"
            )
        if not model:
            raise ValueError(
                "no embedding model name: set HTTPEmbeddingConfig.model or PAU_OPENAI_EMBEDDING_MODEL"
            )
        self.config = config
        self.url = base_url.rstrip("/") + "/embeddings"
        self.model = model
        self.api_key = config.api_key or env("PAU_OPENAI_API_KEY", "OPENAI_API_KEY") or ""
        self.retries = 0

    def _post(self, texts: list[str]) -> np.ndarray:
        payload = {"model": self.model, "input": texts, "encoding_format": "float"}
        body = post_json(self.url, payload, self.api_key, self.config.timeout_s)
        data = sorted(body["data"], key=lambda d: d["index"])
        if [d["index"] for d in data] != list(range(len(texts))):
            raise ValueError(f"expected {len(texts)} embeddings indexed 0..{len(texts) - 1}")
        return np.asarray([d["embedding"] for d in data], np.float64)

    def _batch(self, texts: list[str]) -> np.ndarray:
        ok, vectors, attempts, error = with_retries(
            lambda: self._post(texts),
            max_retries=self.config.max_retries,
            backoff_s=self.config.backoff_s,
            on_retry=self._count_retry,
        )
        if not ok:
            raise RuntimeError(
                f"embeddings request to {self.url} failed after {attempts} attempts ({error}); "
                "check the endpoint and HTTPEmbeddingConfig.model"
            )
        return vectors

    def _count_retry(self) -> None:
        self.retries += 1

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), D] float32 unit vectors (the endpoint's, renormalised)."""
        texts = list(texts)
        parts = [
            self._batch(texts[i : i + self.config.batch_size])
            for i in range(0, len(texts), self.config.batch_size)
        ]
        return _normalize(np.concatenate(parts)) if parts else np.zeros((0, 0), np.float32)


def _qwen3(path: pathlib.Path, config: LocalEmbeddingConfig) -> dict:
    from pau_jax.models import embedding

    decoder, _ = embedding.load_hf(path, dtype=config.dtype)
    return dict(model=decoder, max_length=config.max_length)


def _bert(path: pathlib.Path, config: LocalEmbeddingConfig) -> dict:
    from pau_jax.models import bert

    encoder, bert_config = bert.load_hf(path, dtype=config.dtype)
    return dict(
        model=encoder,
        max_length=min(config.max_length, bert_config.max_position_embeddings),
        pool=bert.mean_pooled,
        pad_left=False,
    )


# config.json `model_type` -> the `LocalEmbedder` arguments of a checkpoint of that type.
_LOCAL_MODELS = {"qwen3": _qwen3, "bert": _bert}


def _local_embedder(config: LocalEmbeddingConfig) -> LocalEmbedder:
    from pau_jax.tokenizer import load_tokenizer

    if not config.checkpoint_dir:
        raise ValueError(
            "LocalEmbeddingConfig.checkpoint_dir is not set: pass "
            "--gin.EMBEDDING_CHECKPOINT=\"'/path/to/checkpoint'\" or use HTTPEmbeddingConfig"
        )
    path = pathlib.Path(config.checkpoint_dir).expanduser()
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} not found; pass a Qwen3-Embedding or BERT checkpoint directory"
        )
    model_type = json.loads(config_path.read_text()).get("model_type")
    if model_type not in _LOCAL_MODELS:
        raise ValueError(
            f"{config_path} has model_type {model_type!r}; a local embedder supports "
            + ", ".join(repr(t) for t in _LOCAL_MODELS)
        )
    return LocalEmbedder(
        tokenizer=load_tokenizer(config.tokenizer or path),
        batch_size=config.batch_size,
        pad_to_multiple=config.pad_to_multiple,
        **_LOCAL_MODELS[model_type](path, config),
    )


def build_embedder(config: LocalEmbeddingConfig | HTTPEmbeddingConfig) -> Embedder:
    """The embedder of a config, ``config.build()`` (a local checkpoint is loaded here).

    Raises:
      ValueError: no checkpoint_dir, or its config.json has an unsupported `model_type`.
    """
    if not callable(getattr(config, "build", None)):
        raise TypeError(
            f"embedder must be a LocalEmbeddingConfig or an HTTPEmbeddingConfig, got {config!r}"
        )
    return config.build()


class LazyEmbedder:
    """An `Embedder` that builds its embedder (loading a checkpoint) on the first `embed` call."""

    def __init__(self, config: LocalEmbeddingConfig | HTTPEmbeddingConfig):
        self.config = config
        self._embedder = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self._embedder is None:
            self._embedder = build_embedder(self.config)
        return self._embedder.embed(texts)


def describe(config) -> str:
    """A one-line description of an embedder config (for metrics.json and caches)."""
    if callable(getattr(config, "describe", None)):
        return config.describe()
    return type(config).__name__
