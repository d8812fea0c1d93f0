"""Qwen3-MoE on the shared decoder against transformers' Qwen3MoeForCausalLM, peft and generate()."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import qwen3_testlib as lib
import safetensors.torch
import torch
import transformers
from flax import nnx

from pau_jax.models import layers, lora, qwen3, qwen3_moe
from pau_jax.sampling import generate

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIN_DIR = ROOT / "gin" / "models"

TINY_MOE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=256,
    # Wider than the default 0.02 so routing and attention are far from uniform.
    initializer_range=0.1,
)

# Together: top-k renormalised or not, a dense layer chosen by mlp_only_layers or by
# decoder_sparse_step, k = 2 and 3 of 8 experts, tied and untied heads.
VARIANTS = {
    "norm_topk_mlp_only": dict(norm_topk_prob=True, mlp_only_layers=[1]),
    "raw_topk_sparse_step_2": dict(norm_topk_prob=False, decoder_sparse_step=2),
    "norm_top3_tied": dict(
        norm_topk_prob=True, num_experts_per_tok=3, mlp_only_layers=[0], tie_word_embeddings=True
    ),
}

BATCH = lib.batch(TINY_MOE["vocab_size"])


def make_tiny_moe(directory, *, seed: int = 0, **overrides):
    """Saves a random transformers ``Qwen3MoeForCausalLM`` with ``save_pretrained``; returns (path, model)."""
    config = transformers.Qwen3MoeConfig(**dict(TINY_MOE, **overrides))
    torch.manual_seed(seed)
    return lib.perturb_and_save(transformers.Qwen3MoeForCausalLM(config).eval(), directory)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Builds each variant's transformers checkpoint once: name -> (path, torch model)."""
    return lib.built_once(tmp_path_factory, make_tiny_moe, VARIANTS, seed=5)


def _sparse_layers(torch_model) -> list[int]:
    return [
        i
        for i, layer in enumerate(torch_model.model.layers)
        if isinstance(
            layer.mlp, transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock
        )
    ]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers_on_a_left_padded_batch(tiny, name):
    path, torch_model = tiny(name)
    model, config = qwen3_moe.load_hf(path)
    sparse = _sparse_layers(torch_model)
    assert 0 < len(sparse) < config.num_hidden_layers  # sparse and dense layers mixed
    assert [i for i in range(config.num_hidden_layers) if config.is_sparse(i)] == sparse
    for i, layer in enumerate(model.model.layers):
        assert isinstance(layer.mlp, qwen3_moe.SparseMoeBlock if i in sparse else layers.MLP)
    assert config.norm_topk_prob == torch_model.config.norm_topk_prob
    assert config.num_experts == 8 and config.num_experts_per_tok == VARIANTS[name].get(
        "num_experts_per_tok", 2
    )
    ids, mask = BATCH
    ours, theirs = lib.ours(model, ids, mask), lib.theirs(torch_model, ids, mask)
    assert ours.dtype == np.float32 and ours.shape == (4, 9, config.vocab_size)
    assert lib.max_real_diff(ours, theirs, mask) < lib.TOL
    assert np.abs(theirs - theirs[:, :1]).max() > 100 * lib.TOL


def test_norm_topk_prob_changes_the_logits_like_transformers(tiny, tmp_path):
    path, torch_model = tiny("norm_topk_mlp_only")
    hf = json.loads((path / "config.json").read_text())
    hf["norm_topk_prob"] = False
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "model.safetensors").symlink_to(path / "model.safetensors")
    raw, raw_config = qwen3_moe.load_hf(tmp_path)
    assert not raw_config.norm_topk_prob
    torch_raw = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = BATCH
    ours_raw = lib.ours(raw, ids, mask)
    assert lib.max_real_diff(ours_raw, lib.theirs(torch_raw, ids, mask), mask) < lib.TOL
    assert lib.max_real_diff(ours_raw, lib.theirs(torch_model, ids, mask), mask) > 100 * lib.TOL


def test_gathered_and_dense_expert_paths_agree(tiny):
    model, config = qwen3_moe.load_hf(tiny("norm_top3_tied")[0])
    block = model.model.layers[1].mlp
    x = jax.random.normal(jax.random.key(0), (1, 6, config.hidden_size))
    # One token (1 * k < E) gathers its experts; six tokens (6 * k >= E) run all experts.
    dense = block(x)
    gathered = jnp.concatenate([block(x[:, i : i + 1]) for i in range(6)], axis=1)
    np.testing.assert_allclose(np.asarray(gathered), np.asarray(dense), atol=1e-5)
    assert np.abs(np.asarray(dense)).max() > 0.1


def test_decode_with_cache_matches_the_full_forward(tiny):
    from pau_jax.models import kv_cache

    model, config = qwen3_moe.load_hf(tiny("raw_topk_sparse_step_2")[0])
    ids = np.array([[3, 77, 12, 9, 101, 45, 6]], np.int32)
    full = lib.ours(model, ids, np.ones_like(ids))
    cache = kv_cache.init_cache(config, 1, 16)
    logits, cache = model.decode(
        jnp.asarray(ids[:, :4]), positions=jnp.arange(4)[None], cache=cache, cache_index=0
    )
    steps = [np.asarray(logits)]
    for t in range(4, 7):  # one token at a time: the gathered path
        logits, cache = model.decode(
            jnp.asarray(ids[:, t : t + 1]),
            positions=jnp.full((1, 1), t),
            cache=cache,
            cache_index=t,
        )
        steps.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=lib.TOL)


@pytest.mark.parametrize("name", ["norm_topk_mlp_only", "norm_top3_tied"])
def test_save_hf_round_trips_through_transformers(tiny, name, tmp_path):
    model, config = qwen3_moe.load_hf(tiny(name)[0])
    qwen3_moe.save_hf(model, config, tmp_path / "out", max_shard_bytes=60_000)
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    names = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    sparse = next(i for i in range(config.num_hidden_layers) if config.is_sparse(i))
    assert f"model.layers.{sparse}.mlp.experts.7.down_proj.weight" in names["weight_map"]
    assert f"model.layers.{sparse}.mlp.gate.weight" in names["weight_map"]
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(torch_model) is transformers.Qwen3MoeForCausalLM
    assert qwen3_moe.Qwen3MoeConfig.from_hf_dict(torch_model.config.to_dict()) == config
    ids, mask = BATCH
    ours = lib.ours(model, ids, mask)
    assert lib.max_real_diff(ours, lib.theirs(torch_model, ids, mask), mask) < lib.TOL
    reloaded, reloaded_config = qwen3_moe.load_hf(tmp_path / "out")
    assert reloaded_config == config
    np.testing.assert_array_equal(lib.ours(reloaded, ids, mask), ours)
    with pytest.raises(ValueError, match="expected a Qwen3MoeConfig"):
        qwen3_moe.save_hf(model, qwen3.PRESETS["0.6B"], tmp_path / "dense")


def test_fused_expert_checkpoint_loads_like_the_per_expert_one(tiny, tmp_path):
    path, torch_model = tiny("norm_topk_mlp_only")
    # transformers 5 holds experts fused in memory: gate_up_proj [E, 2F, D], down_proj [E, D, F].
    state = {k: v.contiguous() for k, v in torch_model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    safetensors.torch.save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    fused, _ = qwen3_moe.load_hf(tmp_path)
    per_expert, _ = qwen3_moe.load_hf(path)
    ids, mask = BATCH
    np.testing.assert_array_equal(lib.ours(fused, ids, mask), lib.ours(per_expert, ids, mask))


# Runs with 8 CPU devices (XLA_FLAGS must be set before JAX starts): argv = checkpoint, work dir.
_MESH_SCRIPT = textwrap.dedent(
    """
    import pathlib
    import sys

    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import PartitionSpec

    from pau_jax.models import qwen3_moe

    path, work = map(pathlib.Path, sys.argv[1:])
    auto = (jax.sharding.AxisType.Auto,) * 2
    mesh = jax.make_mesh((2, 4), ("fsdp", "tp"), axis_types=auto)
    model, _ = qwen3_moe.load_hf(path, mesh=mesh)
    up = model.model.layers[0].mlp.experts.up_proj.kernel[...]
    assert up.sharding.spec == PartitionSpec(None, "fsdp", "tp"), up.sharding
    assert up.addressable_shards[0].data.shape == (8, 32, 8)
    router = model.model.layers[0].mlp.gate.kernel[...]
    assert router.sharding.spec == PartitionSpec("fsdp", None), router.sharding
    np.testing.assert_array_equal(np.asarray(up), np.load(work / "up.npy"))
    logits = nnx.jit(lambda m, i: m(i))(model, np.load(work / "ids.npy"))
    error = np.abs(np.asarray(logits) - np.load(work / "expected.npy")).max()
    assert error < 1e-4, error
    print("mesh load ok")
    """
)


@pytest.mark.parametrize("layout", ["per_expert", "fused"])
def test_load_onto_an_eight_device_mesh(tiny, tmp_path, layout):
    path, torch_model = tiny("norm_topk_mlp_only")
    if layout == "fused":
        state = {k: v.contiguous() for k, v in torch_model.state_dict().items()}
        safetensors.torch.save_file(state, str(tmp_path / "model.safetensors"))
        (tmp_path / "config.json").write_text((path / "config.json").read_text())
        path = tmp_path
    ids = np.arange(12, dtype=np.int32).reshape(2, 6)
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "expected.npy", lib.theirs(torch_model, ids, np.ones_like(ids)))
    fused_up = torch_model.model.layers[0].mlp.experts.gate_up_proj.detach().numpy()[:, 32:]
    np.save(tmp_path / "up.npy", fused_up.transpose(0, 2, 1))  # [E, D, F]
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    result = subprocess.run(
        [sys.executable, "-c", _MESH_SCRIPT, str(path), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mesh load ok" in result.stdout


def test_checkpoint_missing_an_expert_fails_in_one_line(tiny, tmp_path):
    path, _ = tiny("norm_topk_mlp_only")
    tensors = safetensors.torch.load_file(str(path / "model.safetensors"))
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match="experts.5.up_proj.weight") as info:
        qwen3_moe.load_hf(tmp_path)
    assert "\n" not in str(info.value)


def test_greedy_generate_matches_transformers(tiny):
    path, torch_model = tiny("norm_topk_mlp_only")
    model, _ = qwen3_moe.load_hf(path)
    # Three rows: decode steps gather experts (3 * k < E), the prefill runs all of them.
    prompts = [[5, 17, 99, 3, 42, 8, 60], [11, 2, 77], [64]]
    new = 6
    out = generate(model, prompts, max_new_tokens=new)
    assert out.tokens == lib.theirs_greedy(torch_model, prompts, new)
    assert len(set(map(tuple, out.tokens))) > 1


def test_lora_adapts_attention_and_dense_mlps_and_merges_into_a_checkpoint(tiny, tmp_path):
    path, _ = tiny("raw_topk_sparse_step_2")
    model, config = qwen3_moe.load_hf(path)
    ids, mask = BATCH
    base = lib.ours(model, ids, mask)
    dense = sum(not config.is_sparse(i) for i in range(config.num_hidden_layers))
    # Experts and routers are not adapted: 4 attention projections per layer, 3 per dense MLP.
    assert lora.apply_lora(model, rank=4, alpha=8) == 4 * config.num_hidden_layers + 3 * dense
    assert not any(".experts." in name or name.endswith(".gate") for name in lora.adapters(model))
    lib.randomise_lora_b(model)
    adapted = lib.ours(model, ids, mask)
    assert lib.max_real_diff(adapted, base, mask) > 100 * lib.TOL
    lora.merge(model)
    qwen3_moe.save_hf(model, config, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert lib.max_real_diff(lib.theirs(merged, ids, mask), adapted, mask) < lib.TOL


def test_attention_lora_matches_peft(tiny, tmp_path):
    path, _ = tiny("norm_topk_mlp_only")
    model, _ = qwen3_moe.load_hf(path)
    ids, mask = BATCH
    base = lib.ours(model, ids, mask)
    lora.apply_lora(model, rank=4, alpha=8, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    lib.randomise_lora_b(model)
    adapted = lib.ours(model, ids, mask)
    lora.export_peft(model, tmp_path / "adapter")
    torch_base = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    torch_peft = peft.PeftModel.from_pretrained(torch_base, tmp_path / "adapter").eval()
    assert lib.max_real_diff(adapted, lib.theirs(torch_peft, ids, mask), mask) < lib.TOL
    assert lib.max_real_diff(adapted, base, mask) > 100 * lib.TOL


def _hf_dict(**changes):
    d = transformers.Qwen3MoeConfig(**dict(TINY_MOE, **VARIANTS["norm_topk_mlp_only"])).to_dict()
    d.update(changes)
    return d


def test_config_reads_num_experts_and_num_local_experts():
    written = _hf_dict()
    assert "num_local_experts" in written  # what transformers 5 writes
    config = qwen3_moe.Qwen3MoeConfig.from_hf_dict(written)
    official = {k: v for k, v in written.items() if k != "num_local_experts"}
    official.update(num_experts=8, rope_theta=10000.0)
    official.pop("rope_parameters")
    assert qwen3_moe.Qwen3MoeConfig.from_hf_dict(official) == config
    assert config.mlp_only_layers == (1,) and config.router_aux_loss_coef == 0.001
    assert qwen3_moe.Qwen3MoeConfig.from_hf_dict(config.to_hf_dict()) == config


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_type": "qwen3"}, "model_type 'qwen3'"),
        ({"architectures": ["Qwen3MoeForSequenceClassification"]}, "ForSequenceClassification"),
        ({"use_sliding_window": True}, "use_sliding_window=True"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ],
)
def test_config_that_is_not_supported_qwen3_moe_fails_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as info:
        qwen3_moe.Qwen3MoeConfig.from_hf_dict(_hf_dict(**changes))
    assert "\n" not in str(info.value)


def test_dense_qwen3_loader_rejects_a_moe_checkpoint(tiny):
    with pytest.raises(ValueError, match="model_type 'qwen3_moe'"):
        qwen3.load_hf(tiny("norm_topk_mlp_only")[0])


# Qwen3-30B-A3B model card: "30.5B in total and 3.3B activated", "29.9B" non-embedding
# (figures cut, not rounded, to 0.1B); Qwen3-Coder-30B-A3B-Instruct's card gives 30.5B / 3.3B.
OFFICIAL_BILLIONS = {"30B-A3B": (30.5, 3.3, 29.9), "Coder-30B-A3B": (30.5, 3.3, 29.9)}
# Exact counts from the official shapes: untied 151936 x 2048 embedding and head, 48
# layers of attention (q/k norms included) and 128 experts of 3 x 2048 x 768 plus a
# 128 x 2048 router; active counts 8 experts per layer and both vocabulary tables.
EXACT_TOTAL = 30_532_122_624
EXACT_ACTIVE = 3_353_032_704


def _billions(n: int) -> float:
    return int(n / 1e8) / 10


@pytest.mark.parametrize("name", list(OFFICIAL_BILLIONS))
def test_preset_parameter_counts_match_the_official_totals(name):
    config = qwen3_moe.PRESETS[name]
    abstract = qwen3_moe.abstract_model(config, dtype="bfloat16")
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing allocated
    total = sum(x.size for x in leaves)
    assert total == config.num_parameters() == EXACT_TOTAL
    embeddings = 2 * config.vocab_size * config.hidden_size
    expected = OFFICIAL_BILLIONS[name]
    active = config.num_parameters(active=True)
    assert active == EXACT_ACTIVE
    assert (_billions(total), _billions(active), _billions(total - embeddings)) == expected


GIN_PRESETS = {"qwen3_30b_a3b.gin": "30B-A3B", "qwen3_coder_30b_a3b.gin": "Coder-30B-A3B"}


def test_every_preset_has_a_gin_file():
    assert sorted(p.name for p in GIN_DIR.glob("qwen3_*a3b*.gin")) == sorted(GIN_PRESETS)
    assert sorted(GIN_PRESETS.values()) == sorted(qwen3_moe.PRESETS)


@pytest.mark.parametrize("file_name", list(GIN_PRESETS))
def test_gin_preset_builds_the_python_preset(file_name):
    module = "pau_jax.models.qwen3_moe"
    config = lib.gin_config(qwen3_moe.Qwen3MoeConfig, module, GIN_DIR / file_name)
    assert config == qwen3_moe.PRESETS[GIN_PRESETS[file_name]]
