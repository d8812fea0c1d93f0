"""Model seats: one frozen config per backend kind, each building the `Policy` that fills a seat.

The agent, the judge, the coder and a distillation teacher are each a
`*BackendConfig` chosen in gin, e.g.

    pau_jax.experiment.evaluate.judge = @judge/pau_jax.policy.backends.LocalBackendConfig()

Every config has `build(backends) -> Policy`; `Backends` is what building needs
beyond the config: the episodes the oracle reads, and the local models loaded so
far, so that seats on one checkpoint share one copy of the weights. Importing
this module does not import JAX: the local backend imports the models, the
sampler and the tokenizer when it builds. The memory baseline's embedder seat is
configured alike (`embeddings.LocalEmbeddingConfig`, `embeddings.HTTPEmbeddingConfig`)
and built by `embeddings.build_embedder`.

`Seat` and `EmbedderSeat` hold a built policy or embedder under its seat's name,
so that an endpoint that still fails after its retries stops the run with an
`http.EndpointError` naming the seat, e.g. `judge seat: endpoint http://... failed ...`.
"""

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Protocol

from pau_jax.policy import Policy, embeddings, scripted
from pau_jax.policy.config import (
    DEFAULT_PREFIX_CACHE_GIB,
    SamplingConfig,
    check_decode_weights,
    check_prefix_cache_gib,
)
from pau_jax.policy.http import EndpointError, HTTPConfig, HTTPPolicy

# A seat given as this string: for a judge or coder, the agent's own backend; for the AAC
# critic or a distillation teacher, the actor's own base model.
SELF = "self"


class Backend(Protocol):
    def build(self, backends: "Backends") -> Policy:
        """The policy of this seat."""
        ...


class Backends:
    """Builds policies from backend configs; a local checkpoint is loaded once and shared.

    Args:
      specs: the episodes the policies will meet (`runner.EpisodeSpec`s; the oracle
        reads their sources).
    """

    def __init__(self, specs: Sequence = ()):
        self.specs = specs
        self._loaded = {}

    def build(self, backend: Backend) -> Policy:
        """The policy of one backend config."""
        if not callable(getattr(backend, "build", None)):
            raise TypeError(
                f"unknown backend {backend!r}; use one of the *BackendConfig classes of {__name__}"
            )
        return backend.build(self)

    def shared(self, key, load):
        """`load()`, called the first time `key` is asked for; later calls return that result."""
        if key not in self._loaded:
            self._loaded[key] = load()
        return self._loaded[key]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalBackendConfig:
    """A Hugging Face checkpoint directory (Qwen3 or Llama) run by the JAX sampler.

    Attributes:
      checkpoint_dir: folder with config.json and safetensors.
      sampling: how replies are sampled (greedy by default).
      adapter_dir: optional PEFT LoRA adapter folder added to the model.
      dtype: parameter dtype ('float32' on CPU, 'bfloat16' on accelerators).
      tokenizer: tokenizer path or 'qwen3-offline'; default: the checkpoint's own.
      prefix_cache_gib: memory for the keys and values of earlier prompts and replies, so
        that each phase of an episode prefills only what was appended to its conversation
        (`pau_jax.sampling.prefix_cache`; default `config.DEFAULT_PREFIX_CACHE_GIB`); 0
        prefills every prompt whole. Seats built by one `Backends` on the same model and
        budget share one cache (a judge and a coder on one checkpoint: one budget, not two).
      decode_weights: what the sampler's decode steps read: 'float32' (the weights as
        loaded) or 'q8' (an 8-bit copy made at load, `pau_jax.models.quantization`; on a
        CPU without the kernel, one log line and float32).
    """

    checkpoint_dir: str
    sampling: SamplingConfig = SamplingConfig()
    adapter_dir: str | None = None
    dtype: str = "float32"
    tokenizer: str | None = None
    prefix_cache_gib: float = DEFAULT_PREFIX_CACHE_GIB
    decode_weights: str = "float32"

    def __post_init__(self):
        check_prefix_cache_gib("LocalBackendConfig", self.prefix_cache_gib)
        check_decode_weights("LocalBackendConfig", self.decode_weights)

    def build(self, backends: Backends) -> Policy:
        """A `LocalPolicy` on the checkpoint (loaded here unless `backends` holds it already)."""
        from pau_jax.policy.local import LocalPolicy

        if not self.checkpoint_dir:
            raise ValueError(
                "LocalBackendConfig.checkpoint_dir is not set: pass --gin.CHECKPOINT=\"'/path'\" "
                "or choose another backend (e.g. HTTPBackendConfig)"
            )
        path = pathlib.Path(self.checkpoint_dir).expanduser()
        key = (str(path), self.adapter_dir, self.dtype, self.tokenizer, self.decode_weights)
        model, tokenizer = backends.shared(key, lambda: self._load(path))
        # A token sequence's keys and values do not depend on the seat: one cache per model.
        gib = self.prefix_cache_gib
        cache = backends.shared(("prefix_cache", key, gib), lambda: prefix_cache(gib))
        return LocalPolicy(model, tokenizer, self.sampling, prefix_cache=cache)

    def _load(self, path: pathlib.Path):
        from pau_jax import models
        from pau_jax.models import lora
        from pau_jax.tokenizer import load_tokenizer

        model, _ = models.load_hf(path, dtype=self.dtype)
        if self.adapter_dir:
            n = lora.load_peft(model, pathlib.Path(self.adapter_dir).expanduser())
            print(f"[eval] LoRA adapter on {n} modules from {self.adapter_dir}", flush=True)
        if self.decode_weights != "float32":
            from pau_jax.models import quantization

            n = quantization.quantize_for_decode(model, self.decode_weights)
            print(f"[eval] decode_weights={self.decode_weights}: {n} matrices", flush=True)
        return model, load_tokenizer(self.tokenizer or path)

    def describe(self) -> str:
        adapter = f" + adapter {self.adapter_dir}" if self.adapter_dir else ""
        quantized = f" (decode {self.decode_weights})" if self.decode_weights != "float32" else ""
        return f"checkpoint {self.checkpoint_dir}{adapter}{quantized}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class HTTPBackendConfig:
    """An OpenAI-compatible chat endpoint (vLLM, SGLang, a hosted API, `PolicyServer`)."""

    http: HTTPConfig = HTTPConfig()

    def build(self, backends: Backends) -> Policy:
        return HTTPPolicy(self.http)

    def describe(self) -> str:
        return f"endpoint {self.http.base_url or '$PAU_OPENAI_BASE_URL'} model {self.http.model}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class OracleBackendConfig:
    """`scripted.OraclePolicy`: reads each task's source (an upper bound; tests)."""

    n_probes: int = 3
    seed: int = 0

    def build(self, backends: Backends) -> Policy:
        return scripted.OraclePolicy(backends.specs, n_probes=self.n_probes, seed=self.seed)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandomProberBackendConfig:
    """`scripted.RandomProber`: seeded random inputs, a table as hypothesis (a baseline)."""

    seed: int = 0

    def build(self, backends: Backends) -> Policy:
        return scripted.RandomProber(seed=self.seed)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScriptedCoderBackendConfig:
    """`scripted.ScriptedCoder`: fenced code from the description, else a lookup table."""

    def build(self, backends: Backends) -> Policy:
        return scripted.ScriptedCoder()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScriptedJudgeBackendConfig:
    """`scripted.OverlapJudge`: word-overlap ratings, rule-based failure modes (tests only)."""

    def build(self, backends: Backends) -> Policy:
        return scripted.OverlapJudge()


def prefix_cache(gib: float = DEFAULT_PREFIX_CACHE_GIB):
    """A `sampling.prefix_cache.PrefixCache` of `gib` GiB for a `LocalPolicy`; None for 0 (no cache).

    Every local sampler that the seats and the training runs build sizes its cache here.
    """
    check_prefix_cache_gib("prefix_cache", gib)
    if gib == 0:
        return None
    from pau_jax.sampling.prefix_cache import PrefixCache

    return PrefixCache(max_bytes=int(gib * 2**30))


def build_policy(backend: Backend, specs: Sequence = ()) -> Policy:
    """The policy of one backend config, for episodes `specs` (the oracle reads their sources)."""
    return Backends(specs).build(backend)


def same_model(seat, policy) -> bool:
    """Whether a seat's backend runs the very model of the agent (same weights or endpoint).

    A local seat without an adapter on the agent's checkpoint counts, whatever the
    agent's adapter.
    """
    if isinstance(seat, LocalBackendConfig) and isinstance(policy, LocalBackendConfig):
        same_dir = (
            pathlib.Path(seat.checkpoint_dir or "").expanduser().resolve()
            == pathlib.Path(policy.checkpoint_dir or "").expanduser().resolve()
        )
        return same_dir and seat.adapter_dir in (None, policy.adapter_dir)
    if isinstance(seat, HTTPBackendConfig) and isinstance(policy, HTTPBackendConfig):
        return (seat.http.base_url, seat.http.model) == (policy.http.base_url, policy.http.model)
    return seat == policy


def structured_decoding(backend) -> str:
    """The backend's `SamplingConfig.structured` ('off' for backends without one), with
    its `resample_repeats` when set."""
    sampling = getattr(backend, "sampling", None)
    mode = getattr(sampling, "structured", "off")
    repeats = getattr(sampling, "resample_repeats", 0)
    if repeats:
        mode += (
            f"; repeated inputs redrawn up to {repeats} times at temperature "
            f"{sampling.resample_temperature:g}"
        )
    return mode


def describe(backend) -> str:
    """A one-line description of a backend for metrics.json and report.md."""
    if hasattr(backend, "describe"):
        return backend.describe()
    return type(backend).__name__


def resolve_seat(name: str, seat, policy) -> tuple[object, bool]:
    """(backend, self_graded) of the judge or coder seat; `'self'` means the agent's backend.

    Raises:
      ValueError: the seat is not set (None), or is a string other than 'self'.
    """
    if seat is None:
        macro = name.upper()
        raise ValueError(
            f"no {name} is set: give a checkpoint or an endpoint "
            f"(--gin.{macro}=@{name}/{__name__}.LocalBackendConfig() or "
            f"...HTTPBackendConfig(); Python: {name}=<*BackendConfig>), or {name}='{SELF}' to let "
            "the evaluated model grade itself (not the paper's setup; the run is marked self-graded)"
        )
    if isinstance(seat, str):
        if seat != SELF:
            raise ValueError(f"{name} must be a *BackendConfig or '{SELF}', got {seat!r}")
        return policy, True
    return seat, same_model(seat, policy)


class Seat:
    """A built policy in a named seat ('agent', 'judge', 'coder'): its endpoint errors name the seat.

    A `Policy` itself: `complete` and calls go to `policy`. An `EndpointError` raised
    by the policy is raised again with `seat` set, so a judge that is the agent's own
    endpoint fails as the judge.
    """

    def __init__(self, name: str, policy: Policy):
        self.name = name
        self.policy = policy

    def complete(
        self,
        conversations: Sequence[Sequence[dict]],
        *,
        answers: Sequence | None = None,
        stop: Sequence[Sequence[str]] | None = None,
    ) -> list:
        """The policy's replies (`Policy.complete`)."""
        try:
            return self.policy.complete(conversations, answers=answers, stop=stop)
        except EndpointError as e:
            raise e.for_seat(self.name) from None

    def __call__(self, conversations: Sequence[Sequence[dict]]) -> list[str]:
        """The policy's reply texts."""
        try:
            return self.policy(conversations)
        except EndpointError as e:
            raise e.for_seat(self.name) from None


class EmbedderSeat:
    """The memory baseline's embedder, built on the first `embed`; its endpoint errors name the seat.

    An endpoint embedder (`embeddings.HTTPEmbedder`) raises RuntimeError when a
    request still fails after its retries; that becomes an `EndpointError` of the
    'embedder' seat.
    """

    name = "embedder"

    def __init__(self, config):
        self.config = config
        self._embedder = embeddings.LazyEmbedder(config)

    def embed(self, texts):
        """[len(texts), D] float32 unit vectors."""
        try:
            return self._embedder.embed(texts)
        except EndpointError as e:
            raise e.for_seat(self.name) from None
        except RuntimeError as e:
            if not isinstance(self.config, embeddings.HTTPEmbeddingConfig):
                raise
            url = self.config.base_url or "$PAU_OPENAI_EMBEDDING_BASE_URL"
            raise EndpointError(
                url=url, model=self.config.model, error=str(e), seat=self.name
            ) from None
