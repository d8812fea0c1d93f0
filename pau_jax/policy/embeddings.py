"""Text embedders: a local Qwen3-Embedding checkpoint on the JAX decoder, or an OpenAI-compatible `/v1/embeddings` endpoint.

Both satisfy `Embedder`: `embed(texts) -> [N, D] float32` rows of unit L2 norm,
in the order of `texts`. The local one tokenizes with the checkpoint's own
tokenizer (its special tokens included, truncated to `max_length` tokens), pads
on the left and pools the last token (`models.embedding.pooled`), `batch_size`
texts per forward pass. The endpoint client sends `batch_size` texts per request
and retries like `http.HTTPPolicy`; unlike a chat seat it raises when a request
still fails, since a missing vector cannot be replaced by anything meaningful.

    embedder = build_embedder(LocalEmbeddingConfig(checkpoint_dir="/ckpt/Qwen3-Embedding-8B"))
    vectors = embedder.embed(["adds two numbers", "sorts a list"])    # [2, D]
"""

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from pau_jax.policy.http import env, post_json, with_retries


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Returns [len(texts), D] float32 unit vectors."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalEmbeddingConfig:
    """A Qwen3-Embedding checkpoint run by pau_jax's Qwen3 decoder.

    Attributes:
      checkpoint_dir: folder with config.json, safetensors and the tokenizer.
      dtype: parameter dtype ('float32' on CPU, 'bfloat16' on accelerators).
      tokenizer: tokenizer folder or 'qwen3-offline'; default: the checkpoint's own.
      max_length: texts are truncated to this many tokens (Qwen3-Embedding: 1024).
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


def _normalize(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)).astype(np.float32)


class LocalEmbedder:
    """Embeds texts with a loaded decoder and its tokenizer (see module docstring)."""

    def __init__(
        self,
        decoder,
        tokenizer,
        *,
        max_length: int = 1024,
        batch_size: int = 32,
        pad_to_multiple: int = 64,
    ):
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.pad_to_multiple = pad_to_multiple
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0

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
        from pau_jax.models import embedding

        out = []
        for start in range(0, len(ids), self.batch_size):
            rows = [list(r) for r in ids[start : start + self.batch_size]]
            n = len(rows)
            size = min(self.batch_size, 1 << (n - 1).bit_length())  # few compiled batch sizes
            rows += [rows[0]] * (size - n)
            longest = max(len(r) for r in rows)
            t = -(-longest // self.pad_to_multiple) * self.pad_to_multiple
            batch = np.full((len(rows), t), self.pad_id, np.int32)
            mask = np.zeros((len(rows), t), np.int32)
            for i, row in enumerate(rows):
                batch[i, t - len(row) :] = row
                mask[i, t - len(row) :] = 1
            out.append(np.asarray(embedding.pooled(self.decoder, batch, mask))[:n])
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


def build_embedder(config: LocalEmbeddingConfig | HTTPEmbeddingConfig) -> Embedder:
    """The embedder of a config (a local checkpoint is loaded here)."""
    if isinstance(config, HTTPEmbeddingConfig):
        return HTTPEmbedder(config)
    if isinstance(config, LocalEmbeddingConfig):
        from pau_jax.models import embedding
        from pau_jax.tokenizer import load_tokenizer

        if not config.checkpoint_dir:
            raise ValueError(
                "LocalEmbeddingConfig.checkpoint_dir is not set: pass "
                "--gin.EMBEDDING_CHECKPOINT=\"'/path/to/Qwen3-Embedding'\" or use HTTPEmbeddingConfig"
            )
        path = pathlib.Path(config.checkpoint_dir).expanduser()
        decoder, _ = embedding.load_hf(path, dtype=config.dtype)
        return LocalEmbedder(
            decoder,
            load_tokenizer(config.tokenizer or path),
            max_length=config.max_length,
            batch_size=config.batch_size,
            pad_to_multiple=config.pad_to_multiple,
        )
    raise TypeError(
        f"embedder must be a LocalEmbeddingConfig or an HTTPEmbeddingConfig, got {config!r}"
    )


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
    if isinstance(config, LocalEmbeddingConfig):
        return f"checkpoint {config.checkpoint_dir} (max {config.max_length} tokens)"
    if isinstance(config, HTTPEmbeddingConfig):
        return (
            f"endpoint {config.base_url or '$PAU_OPENAI_EMBEDDING_BASE_URL'} model {config.model}"
        )
    return type(config).__name__
