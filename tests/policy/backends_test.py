"""The model seats: each backend config builds its policy, local seats share a checkpoint, 'self'."""

import dataclasses
import importlib
import inspect
import pkgutil
import socket
import subprocess
import sys

import checkpoints
import pytest

import pau_jax.policy
from pau_jax.policy import backends, scripted
from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.embeddings import HTTPEmbeddingConfig
from pau_jax.policy.http import EndpointError, HTTPConfig, HTTPPolicy


def _imports_jax(*modules: str) -> bool:
    """Whether importing `modules` in a fresh interpreter loads JAX."""
    code = f"import sys\nimport {', '.join(modules)}\nprint('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def test_the_seat_configs_import_without_jax():
    assert not _imports_jax("pau_jax.policy.backends", "pau_jax.policy.config")
    assert _imports_jax("pau_jax.policy.local")  # the check sees JAX where it is imported


@pytest.mark.parametrize(
    "backend, policy_type",
    [
        (backends.OracleBackendConfig(n_probes=2), scripted.OraclePolicy),
        (backends.RandomProberBackendConfig(seed=1), scripted.RandomProber),
        (backends.ScriptedCoderBackendConfig(), scripted.ScriptedCoder),
        (backends.ScriptedJudgeBackendConfig(), scripted.OverlapJudge),
        (
            backends.HTTPBackendConfig(
                http=HTTPConfig(base_url="http://127.0.0.1:1/v1", model="m")
            ),
            HTTPPolicy,
        ),
    ],
)
def test_each_backend_builds_its_policy(backend, policy_type):
    assert isinstance(backends.build_policy(backend), policy_type)


def test_local_seats_on_one_checkpoint_share_one_model(tmp_path):
    from flax import nnx

    from pau_jax.models import qwen3
    from pau_jax.policy.local import LocalPolicy
    from pau_jax.tokenizer import save_offline_tokenizer

    config = checkpoints.tiny_qwen3_config(max_position_embeddings=2048)
    qwen3.save_hf(qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), config, tmp_path)
    save_offline_tokenizer(tmp_path)
    agent = backends.LocalBackendConfig(
        checkpoint_dir=str(tmp_path), sampling=SamplingConfig(max_new_tokens=4)
    )
    judge = dataclasses.replace(
        agent, sampling=SamplingConfig(max_new_tokens=8), prefix_cache_gib=0
    )
    seats = backends.Backends()
    first, second = seats.build(agent), seats.build(judge)
    assert isinstance(first, LocalPolicy) and isinstance(second, LocalPolicy)
    assert first.model is second.model  # one copy of the weights for both seats
    assert second.sampling.max_new_tokens == 8 and second.prefix_cache is None
    assert backends.build_policy(agent).model is not first.model  # the cache is per `Backends`
    # Seats on one model and budget share one prefix cache; another budget has its own.
    coder = dataclasses.replace(agent, sampling=SamplingConfig(max_new_tokens=16))
    third = seats.build(coder)
    assert first.prefix_cache is not None and third.prefix_cache is first.prefix_cache
    assert third.prefix_cache.max_bytes == int(backends.DEFAULT_PREFIX_CACHE_GIB * 2**30)
    fourth = seats.build(dataclasses.replace(agent, prefix_cache_gib=0.5))
    assert fourth.prefix_cache is not first.prefix_cache
    assert fourth.prefix_cache.max_bytes == 2**29


def test_resolve_seat():
    agent = backends.LocalBackendConfig(checkpoint_dir="/ckpt/a", adapter_dir="/runs/x/adapter")
    assert backends.resolve_seat("judge", "self", agent) == (agent, True)
    # A seat on the agent's own checkpoint (its base, without the adapter) is self-graded too.
    base = backends.LocalBackendConfig(checkpoint_dir="/ckpt/a")
    assert backends.resolve_seat("judge", base, agent) == (base, True)
    other = backends.LocalBackendConfig(checkpoint_dir="/ckpt/judge")
    assert backends.resolve_seat("judge", other, agent) == (other, False)
    endpoint = backends.HTTPBackendConfig(http=HTTPConfig(base_url="http://h/v1", model="m"))
    same = backends.HTTPBackendConfig(
        http=HTTPConfig(base_url="http://h/v1", model="m", timeout_s=9)
    )
    assert backends.resolve_seat("coder", same, endpoint) == (same, True)
    assert backends.describe(endpoint) == "endpoint http://h/v1 model m"
    assert backends.describe(agent) == "checkpoint /ckpt/a + adapter /runs/x/adapter"


def _closed_port_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class _Completing:
    def __call__(self, conversations):
        return ["text"] * len(conversations)

    def complete(self, conversations, *, answers=None, stop=None):
        return [f"completion of {len(c)}, {answers}, {stop}" for c in conversations]


def test_a_seat_names_its_failing_endpoint():
    url = _closed_port_url()
    http = HTTPConfig(base_url=url, model="m", max_retries=1, backoff_s=0.01, timeout_s=2)
    judge = backends.Seat("judge", backends.build_policy(backends.HTTPBackendConfig(http=http)))
    with pytest.raises(EndpointError) as raised:
        judge([[{"role": "user", "content": "Rate this."}]])
    message = str(raised.value)
    assert raised.value.seat == "judge" and "\n" not in message
    assert message.startswith(
        f"judge seat: endpoint {url}/chat/completions (model m) failed after 2 attempts: URLError"
    )
    with pytest.raises(EndpointError, match="^judge seat: "):  # what the runner calls
        judge.complete([[{"role": "user", "content": "Rate this."}]], answers=[None])
    # Other policies answer through their seat unchanged, `complete`'s arguments included.
    agent = backends.Seat("agent", _Completing())
    assert agent([[{}]]) == ["text"]
    assert agent.complete([[{}, {}]]) == ["completion of 2, None, None"]
    assert agent.complete([[{}]], answers=["a"], stop=[["s"]]) == [
        "completion of 1, ['a'], [['s']]"
    ]


def _policy_classes() -> dict[str, type]:
    """Every class of `pau_jax.policy`'s modules that answers `conversations` (`__call__`)."""
    found = {}
    for info in pkgutil.iter_modules(pau_jax.policy.__path__):
        module = importlib.import_module(f"pau_jax.policy.{info.name}")
        for name, cls in vars(module).items():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__ or name[0] == "_":
                continue
            call = inspect.getattr_static(cls, "__call__", None)
            if inspect.isfunction(call) and list(inspect.signature(call).parameters)[1:2] == [
                "conversations"
            ]:
                found[f"{info.name}.{name}"] = cls
    return found


def test_every_policy_has_complete_with_answers_and_stop():
    classes = _policy_classes()
    expected = {"local.LocalPolicy", "http.HTTPPolicy", "backends.Seat", "scripted.OraclePolicy"}
    assert expected <= set(classes), sorted(classes)
    assert {"scripted.RandomProber", "scripted.ScriptedCoder", "scripted.OverlapJudge"} <= set(
        classes
    )
    for name, cls in classes.items():
        assert inspect.isfunction(getattr(cls, "complete", None)), f"{name} has no complete"
        params = inspect.signature(cls.complete).parameters
        assert list(params)[:2] == ["self", "conversations"], name
        for keyword in ("answers", "stop"):
            assert params[keyword].kind is inspect.Parameter.KEYWORD_ONLY, (name, keyword)
            assert params[keyword].default is None, (name, keyword)
        # Anything else a policy takes is optional: `complete(conversations)` always works.
        rest = [p for k, p in params.items() if k not in ("self", "conversations")]
        assert all(p.default is not inspect.Parameter.empty for p in rest), name


def test_the_embedder_seat_names_its_failing_endpoint():
    url = _closed_port_url()
    config = HTTPEmbeddingConfig(base_url=url, model="e", max_retries=1, backoff_s=0)
    with pytest.raises(EndpointError) as raised:
        backends.EmbedderSeat(config).embed(["adds two numbers"])
    message = str(raised.value)
    assert message.startswith(f"embedder seat: endpoint {url} (model e) failed: ")
    assert f"{url}/embeddings failed after 2 attempts" in message and "\n" not in message
