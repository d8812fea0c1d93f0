"""The memory estimate against the arrays JAX really allocates, and preset sizes against official totals."""

import dataclasses
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from pau_jax import parallel
from pau_jax.models import kv_cache, lora, qwen3
from pau_jax.rl import learner
from pau_jax.tools import memory_estimate as memory

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Parameter totals published with the official checkpoints (safetensors metadata). The
# Qwen3-0.6B and -1.7B files also store a copy of the tied embedding as lm_head.weight,
# which the model does not have, so it is subtracted here.
OFFICIAL = {
    "qwen3_0_6b.gin": 751_632_384 - 151_936 * 1024,
    "qwen3_1_7b.gin": 2_031_739_904 - 151_936 * 2048,
    "qwen3_4b.gin": 4_022_468_096,
    "qwen3_8b.gin": 8_190_735_360,
    "qwen3_14b.gin": 14_768_307_200,
    "qwen3_32b.gin": 32_762_123_264,
    "llama3_2_1b_instruct.gin": 1_235_814_400,
    "llama3_2_3b_instruct.gin": 3_212_749_824,
    "llama3_1_8b_instruct.gin": 8_030_261_248,
    "llama3_1_70b_instruct.gin": 70_553_706_496,
}


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_gin_presets_have_the_official_parameter_counts(name):
    model_config, _ = memory.load_gin([f"models/{name}"])
    assert memory.count_params(model_config) == OFFICIAL[name]


def test_cli_prints_every_part_and_the_verdict(capsys):
    code = memory.main(
        ["--gin_file=models/qwen3_0_6b.gin", "--gin_file=mesh/fsdp8.gin", "--chip=h200",
         "--batch=16", "--seq_len=1024"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    for part in ("parameters (learner layout)", "LoRA adapters", "optimizer state",
                 "KV cache", "activations", "fits on h200", "data=1 fsdp=8 tp=1"):  # fmt: skip
        assert part in out, out
    # 0.6B in bf16 split 8 ways: 596,049,920 * 2 / 8 bytes.
    assert f"{596_049_920 * 2 / 8 / memory.GIB:10.3f} GiB" in out


def test_unknown_chip_and_missing_model_fail_clearly():
    with pytest.raises(ValueError, match="unknown chip"):
        memory.chip_bytes("tpu-v9")
    with pytest.raises(ValueError, match="bind no model"):
        memory.load_gin(["mesh/fsdp8.gin"])


CONFIG = qwen3.Qwen3Config(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=512,
)


def _nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("remat", [False, True])
def test_estimate_matches_allocated_arrays_within_20_percent(remat):
    rows, seq_len, rank = 8, 256, 8
    # Remat keeps one layer's activations: with 8 layers the two estimates differ ~3x.
    config = dataclasses.replace(CONFIG, num_hidden_layers=8) if remat else CONFIG
    est = memory.estimate(
        config, parallel.MeshConfig(data=1, fsdp=1, tp=1), num_devices=1, batch=rows,
        seq_len=seq_len, lora_rank=rank, dtype="float32", remat=remat,
    )  # fmt: skip
    model = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    lora.apply_lora(model, rank=rank, alpha=rank)
    learner_config = learner.LearnerConfig(remat=remat)
    state = learner.init_state(model, learner_config)
    learner.sync_model(model, state)  # the model now shares the state's adapters
    cache = kv_cache.init_cache(config, rows, seq_len, np.float32)
    base = nnx.state(model, nnx.Not(nnx.LoRAParam))
    assert est.params == _nbytes(base)
    assert est.lora == _nbytes(state.lora)
    assert est.kv_cache == _nbytes(cache.k) + _nbytes(cache.v)
    allocated = _nbytes([base, state, cache])
    estimated = est.params + est.lora + est.optimizer + est.kv_cache
    assert abs(estimated - allocated) <= 0.2 * allocated, (estimated, allocated)
    # Activations: compare with XLA's temporary buffers of the compiled train step.
    step = learner.make_train_step(model, learner_config)
    batch = learner.Batch(
        input_ids=np.ones((rows, seq_len), np.int32),
        attention_mask=np.ones((rows, seq_len), np.int32),
        loss_mask=np.ones((rows, seq_len), np.float32),
        advantages=np.ones((rows,), np.float32),
        sampler_logprobs=np.zeros((rows, seq_len), np.float32),
    )
    analysis = step.lower(state, batch).compile().memory_analysis()
    if analysis is not None:
        temp = analysis.temp_size_in_bytes
        assert 0.5 * temp <= est.activations <= 2.0 * temp, (est.activations, temp)
