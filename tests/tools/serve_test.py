"""python -m pau_jax.tools.serve: a checkpoint folder served over the OpenAI chat API."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import types
import urllib.error
import urllib.request

import checkpoints
import pytest

from pau_jax.policy.server import API_KEY_ENV
from pau_jax.tools import serve

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONVERSATION = [{"role": "user", "content": "What does test_func(3) return?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random Qwen3 over the real vocabulary, with the offline tokenizer."""
    return checkpoints.save_tiny_chat_checkpoint(
        tmp_path_factory.mktemp("ckpt"), seed=3, max_position_embeddings=512
    )


def _post(url, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"{url}/chat/completions", json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as failure:
        return failure.code, json.loads(failure.read())


def _get_models(url, key=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"{url}/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as failure:
        return failure.code, json.loads(failure.read())


def test_served_checkpoint_answers_as_the_local_policy_and_stops_on_ctrl_c(checkpoint):
    from pau_jax.policy import backends
    from pau_jax.policy.config import SamplingConfig

    env = dict(os.environ, **{API_KEY_ENV: "s3cret", "JAX_PLATFORMS": "cpu"})
    argv = [sys.executable, "-m", "pau_jax.tools.serve", str(checkpoint), "--port", "0"]
    argv += ["--name", "tiny", "--name", "tiny-alias", "--prefix_cache_gib", "0"]
    process = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        first = process.stdout.readline()
        assert first.startswith("serving tiny, tiny-alias at http://127.0.0.1:"), first
        assert "(with an API key)" in first
        url = first.split(" at ", 1)[1].split(" ")[0]
        body = {"model": "tiny-alias", "messages": CONVERSATION, "max_tokens": 6}
        body["temperature"] = 0
        status, reply = _post(url, body, key="s3cret")
        assert status == 200, reply
        served = reply["choices"][0]["message"]["content"]
        assert _post(url, body)[0] == 401  # no key
        assert _post(url, dict(body, model="other"), key="s3cret")[0] == 404
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err[-2000:]
    assert out.strip().splitlines()[-1].startswith("stopped after 1 sampler batches")
    # The same reply as the checkpoint's own LocalPolicy, greedy, in this process.
    local = backends.build_policy(
        backends.LocalBackendConfig(
            checkpoint_dir=str(checkpoint),
            sampling=SamplingConfig(max_new_tokens=6),
            prefix_cache_gib=0,
        )
    )
    assert served == local.complete([CONVERSATION])[0].text


def test_bad_arguments_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        serve.parse_args([str(tmp_path)])
    assert stop.value.code == 2
    assert "has no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    args = serve.parse_args([str(tmp_path)])
    assert args.name == [tmp_path.name] and args.host == "127.0.0.1"
    with pytest.raises(SystemExit):
        serve.parse_args([str(tmp_path), "--max_batch", "0"])


def test_api_key_on_the_command_line_works_as_the_environment_variable(tmp_path, monkeypatch):
    """--api_key: 401 without the key, 200 with it; it wins over $PAU_SERVER_API_KEY.

    The policy is a stub (the key is checked before any request reaches the model).
    """
    (tmp_path / "config.json").write_text("{}")
    config = types.SimpleNamespace(max_position_embeddings=512)
    stub = types.SimpleNamespace(model=types.SimpleNamespace(config=config))
    monkeypatch.setattr(serve.backends, "build_policy", lambda backend: stub)
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    argv = [str(tmp_path), "--port", "0", "--name", "tiny", "--api_key", "s3cret"]
    with serve.build_server(serve.parse_args(argv)) as server:
        url = server.base_url
        assert url.startswith("http://127.0.0.1:")
        body = {"model": "tiny", "messages": CONVERSATION, "max_tokens": 6}
        assert _post(url, body)[0] == 401  # no key
        assert _get_models(url)[0] == 401
        assert _get_models(url, key="from-env")[0] == 401
        status, models = _get_models(url, key="s3cret")
        assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"], models
