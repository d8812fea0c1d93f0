"""Qwen3 checkpoints: loading (single, sharded, onto a mesh), saving for transformers, clear errors."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import checkpoints
import jax
import numpy as np
import pytest
import qwen3_testlib as lib
import safetensors.numpy
import transformers
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec

from pau_jax.models import qwen3, sharding, weights

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return checkpoints.make_tiny_qwen3(tmp_path_factory.mktemp("untied"), seed=2)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return checkpoints.make_tiny_qwen3(
        tmp_path_factory.mktemp("tied"), seed=3, tie_word_embeddings=True
    )


@pytest.fixture(scope="module")
def batch():
    return lib.batch(checkpoints.TINY_QWEN3["vocab_size"])


def _rewrite(src: pathlib.Path, dst: pathlib.Path, *, config=None, edit=None) -> pathlib.Path:
    """Copies a single-file checkpoint, editing its tensors dict and/or config dict."""
    dst.mkdir()
    tensors = safetensors.numpy.load_file(src / weights.SINGLE_FILE)
    if edit is not None:
        edit(tensors)
    safetensors.numpy.save_file(tensors, dst / weights.SINGLE_FILE, metadata={"format": "pt"})
    hf_config = json.loads((src / "config.json").read_text())
    hf_config.update(config or {})
    (dst / "config.json").write_text(json.dumps(hf_config))
    return dst


def _one_line_error(error_type, path, match):
    with pytest.raises(error_type, match=match) as info:
        qwen3.load_hf(path)
    assert "\n" not in str(info.value)


def test_missing_tensor_is_named(untied, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    path = _rewrite(untied[0], tmp_path / "c", edit=lambda t: t.pop(name))
    _one_line_error(ValueError, path, f"lacks 1 tensor.*{name}")


def test_untied_checkpoint_without_lm_head_is_incomplete(tied, tmp_path):
    path = _rewrite(tied[0], tmp_path / "c", config={"tie_word_embeddings": False})
    _one_line_error(ValueError, path, "lacks 1 tensor.*'lm_head.weight'")


def test_unexpected_tensor_is_named(untied, tmp_path):
    def add_bias(tensors):
        tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)

    path = _rewrite(untied[0], tmp_path / "c", edit=add_bias)
    _one_line_error(ValueError, path, "does not use.*model.layers.0.self_attn.q_proj.bias")


def test_wrong_shape_is_named(untied, tmp_path):
    name = "model.layers.0.mlp.down_proj.weight"

    def transpose(tensors):
        tensors[name] = np.ascontiguousarray(tensors[name].T)

    path = _rewrite(untied[0], tmp_path / "c", edit=transpose)
    _one_line_error(ValueError, path, rf"{name}.*shape \(96, 64\).*needs \(64, 96\)")


def test_config_that_is_not_qwen3_is_rejected(untied, tmp_path):
    path = _rewrite(untied[0], tmp_path / "c", config={"model_type": "llama"})
    _one_line_error(ValueError, path, "model_type 'llama'.*Qwen3")


def test_directory_without_weights_is_rejected(untied, tmp_path):
    (tmp_path / "c").mkdir()
    shutil.copy(untied[0] / "config.json", tmp_path / "c")
    _one_line_error(FileNotFoundError, tmp_path / "c", "neither model.safetensors")


def test_tied_checkpoint_ignores_a_stored_lm_head(tied, tmp_path, batch):
    ids, mask = batch
    model, config = qwen3.load_hf(tied[0])
    assert config.tie_word_embeddings and model.lm_head is None

    def add_head(tensors):
        tensors["lm_head.weight"] = np.ones_like(tensors["model.embed_tokens.weight"])

    with_head, _ = qwen3.load_hf(_rewrite(tied[0], tmp_path / "c", edit=add_head))
    expected = lib.theirs(tied[1], ids, mask)
    assert lib.max_real_diff(lib.ours(model, ids, mask), expected, mask) < lib.TOL
    assert lib.max_real_diff(lib.ours(with_head, ids, mask), expected, mask) < lib.TOL


def test_sharded_transformers_checkpoint_loads(untied, tmp_path, batch):
    ids, mask = batch
    untied[1].save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / weights.INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (tmp_path / weights.SINGLE_FILE).exists()
    model, _ = qwen3.load_hf(tmp_path)
    expected = lib.theirs(untied[1], ids, mask)
    assert lib.max_real_diff(lib.ours(model, ids, mask), expected, mask) < lib.TOL


def _perturbed(model, seed):
    """Adds host-side noise to every parameter, so saved weights are our own."""
    rng = np.random.default_rng(seed)
    state = nnx.state(model, nnx.Param)
    noisy = jax.tree.map(lambda x: np.asarray(x) + 0.05 * rng.standard_normal(x.shape), state)
    nnx.update(model, jax.tree.map(lambda x: jax.numpy.asarray(x, np.float32), noisy))
    return model


@pytest.mark.parametrize("fixture, shard_bytes", [("untied", 30_000), ("tied", None)])
def test_saved_checkpoint_loads_in_transformers_with_the_same_logits(
    fixture, shard_bytes, request, tmp_path, batch
):
    ids, mask = batch
    model, config = qwen3.load_hf(request.getfixturevalue(fixture)[0])
    model = _perturbed(model, seed=7)
    qwen3.save_hf(model, config, tmp_path, max_shard_bytes=shard_bytes)
    assert (tmp_path / weights.INDEX_FILE).exists() == (shard_bytes is not None)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(torch_model) is transformers.Qwen3ForCausalLM
    assert torch_model.config.tie_word_embeddings == config.tie_word_embeddings
    ours = lib.ours(model, ids, mask)
    assert lib.max_real_diff(ours, lib.theirs(torch_model, ids, mask), mask) < lib.TOL
    reloaded, reloaded_config = qwen3.load_hf(tmp_path)
    assert reloaded_config == config
    for (_, a), (_, b) in zip(
        nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(reloaded)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]))
    with pytest.raises(FileExistsError, match="already holds a checkpoint"):
        qwen3.save_hf(model, config, tmp_path)


def test_bfloat16_load_keeps_float32_logits(untied, batch):
    ids, mask = batch
    model, _ = qwen3.load_hf(untied[0], dtype="bfloat16")
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model))}
    assert dtypes == {np.dtype(jax.numpy.bfloat16)}
    logits = lib.ours(model, ids, mask)
    assert logits.dtype == np.float32
    assert lib.max_real_diff(logits, lib.theirs(untied[1], ids, mask), mask) < 0.05


def test_partition_spec_follows_the_rules_table():
    mesh = AbstractMesh((2, 4), ("fsdp", "tp"))
    assert sharding.partition_spec(("embed", "heads"), (64, 64), mesh) == PartitionSpec(
        "fsdp", "tp"
    )
    assert sharding.partition_spec(("vocab", "embed"), (128, 64), mesh) == PartitionSpec(
        "tp", "fsdp"
    )
    assert sharding.partition_spec(("head_dim",), (16,), mesh) == PartitionSpec(None)
    only_tp = AbstractMesh((4,), ("tp",))
    assert sharding.partition_spec(("embed", "mlp"), (64, 96), only_tp) == PartitionSpec(None, "tp")
    with pytest.raises(ValueError, match="not divisible"):
        sharding.partition_spec(("mlp", "embed"), (98, 64), mesh)


_MESH_SCRIPT = textwrap.dedent(
    """
    import pathlib
    import sys

    import jax
    import numpy as np
    import safetensors.numpy
    from flax import nnx
    from jax.sharding import PartitionSpec

    from pau_jax.models import qwen3

    path, work = map(pathlib.Path, sys.argv[1:])
    auto = (jax.sharding.AxisType.Auto,) * 2
    mesh = jax.make_mesh((2, 4), ("fsdp", "tp"), axis_types=auto)
    model, _ = qwen3.load_hf(path, mesh=mesh)
    q = model.model.layers[0].self_attn.q_proj.kernel[...]
    assert q.sharding.spec == PartitionSpec("fsdp", "tp"), q.sharding
    assert q.addressable_shards[0].data.shape == (32, 16)
    embed = model.model.embed_tokens.embedding[...]
    assert embed.sharding.spec == PartitionSpec("tp", "fsdp"), embed.sharding
    stored = safetensors.numpy.load_file(path / "model.safetensors")
    np.testing.assert_array_equal(np.asarray(q), stored["model.layers.0.self_attn.q_proj.weight"].T)
    logits = nnx.jit(lambda m, i: m(i))(model, np.load(work / "ids.npy"))
    error = np.abs(np.asarray(logits) - np.load(work / "expected.npy")).max()
    assert error < 1e-4, error
    print("mesh load ok")
    """
)


def test_load_onto_an_eight_device_mesh(untied, tmp_path):
    ids = np.arange(12, dtype=np.int32).reshape(2, 6)
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "expected.npy", lib.theirs(untied[1], ids, np.ones_like(ids)))
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    result = subprocess.run(
        [sys.executable, "-c", _MESH_SCRIPT, str(untied[0]), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mesh load ok" in result.stdout
