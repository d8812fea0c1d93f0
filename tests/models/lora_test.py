"""LoRA on Qwen3: identity at init, parity with peft both ways, merging, target matching."""

import json
import math

import checkpoints
import jax
import numpy as np
import peft
import pytest
import qwen3_testlib as lib
import transformers
from flax import nnx

from pau_jax.models import lora, qwen3, weights

RANK, ALPHA = 4, 8
LINEARS_PER_LAYER = 7


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return checkpoints.make_tiny_qwen3(tmp_path_factory.mktemp("lora"), seed=5)


@pytest.fixture(scope="module")
def batch():
    return lib.batch(checkpoints.TINY_QWEN3["vocab_size"])


def _peft_logits(ckpt_path, adapter_path, ids, mask):
    base = transformers.AutoModelForCausalLM.from_pretrained(ckpt_path).eval()
    return lib.theirs(peft.PeftModel.from_pretrained(base, adapter_path).eval(), ids, mask)


def test_fresh_adapters_are_lora_params_and_leave_the_model_unchanged(ckpt, batch):
    ids, mask = batch
    model, config = qwen3.load_hf(ckpt[0])
    base = lib.ours(model, ids, mask)
    count = lora.apply_lora(model, rank=RANK, alpha=ALPHA)
    assert count == LINEARS_PER_LAYER * config.num_hidden_layers
    flat = nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
    assert len(flat) == 2 * count
    assert {path[-1] for path, _ in flat} == {"lora_a", "lora_b"}
    assert all(type(var) is nnx.Param for _, var in weights.iter_params(model))
    q = model.model.layers[0].self_attn.q_proj
    assert q.lora.lora_a.shape == (config.hidden_size, RANK)
    assert q.lora.lora_b.shape == (RANK, config.num_attention_heads * config.head_dim)
    assert q.lora.lora_a.get_metadata()["out_sharding"] == ("embed", None)
    assert q.lora.lora_b.get_metadata()["out_sharding"] == (None, "heads")
    a = np.asarray(q.lora.lora_a[...])
    bound = 1 / math.sqrt(config.hidden_size)
    assert np.abs(a).max() <= bound and np.abs(a).std() > bound / 4
    assert not np.asarray(q.lora.lora_b[...]).any()
    np.testing.assert_allclose(lib.ours(model, ids, mask), base, atol=1e-6)


def test_our_adapter_loaded_by_peft_gives_our_logits_and_merges(ckpt, batch, tmp_path):
    ids, mask = batch
    model, config = qwen3.load_hf(ckpt[0])
    base = lib.ours(model, ids, mask)
    lora.apply_lora(model, rank=RANK, alpha=ALPHA)
    lib.randomise_lora_b(model, seed=11)
    adapted = lib.ours(model, ids, mask)
    assert lib.max_real_diff(adapted, base, mask) > 100 * lib.TOL
    lora.export_peft(model, tmp_path / "adapter")
    exported = json.loads((tmp_path / "adapter" / lora.ADAPTER_CONFIG).read_text())
    assert sorted(exported["target_modules"]) == sorted(lora.DEFAULT_TARGETS)
    theirs = _peft_logits(ckpt[0], tmp_path / "adapter", ids, mask)
    assert lib.max_real_diff(adapted, theirs, mask) < lib.TOL
    with pytest.raises(ValueError, match="unmerged LoRA"):
        qwen3.save_hf(model, config, tmp_path / "unmerged")
    assert lora.merge(model) == LINEARS_PER_LAYER * config.num_hidden_layers
    assert not jax.tree.leaves(nnx.state(model, nnx.LoRAParam))
    assert lib.max_real_diff(lib.ours(model, ids, mask), adapted, mask) < 1e-5
    qwen3.save_hf(model, config, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert lib.max_real_diff(lib.theirs(merged, ids, mask), adapted, mask) < lib.TOL


def test_regex_targets_export_full_paths_that_peft_applies(ckpt, batch, tmp_path):
    ids, mask = batch
    model, _ = qwen3.load_hf(ckpt[0])
    pattern = r"model\.layers\.0\.self_attn\.(q|v)_proj"
    assert lora.apply_lora(model, rank=RANK, alpha=ALPHA, targets=pattern) == 2
    lib.randomise_lora_b(model, seed=12)
    lora.export_peft(model, tmp_path)
    exported = json.loads((tmp_path / lora.ADAPTER_CONFIG).read_text())
    assert exported["target_modules"] == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
    ]
    theirs = _peft_logits(ckpt[0], tmp_path, ids, mask)
    assert lib.max_real_diff(lib.ours(model, ids, mask), theirs, mask) < lib.TOL


def test_load_peft_reads_an_adapter_written_by_peft(ckpt, batch, tmp_path):
    ids, mask = batch
    torch_base = transformers.AutoModelForCausalLM.from_pretrained(ckpt[0]).eval()
    config = peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=list(lora.DEFAULT_TARGETS), init_lora_weights=False
    )
    peft_model = peft.get_peft_model(torch_base, config).eval()
    peft_model.save_pretrained(tmp_path)
    model, _ = qwen3.load_hf(ckpt[0])
    assert lora.load_peft(model, tmp_path) == LINEARS_PER_LAYER * 2
    theirs = lib.theirs(peft_model, ids, mask)
    assert lib.max_real_diff(lib.ours(model, ids, mask), theirs, mask) < lib.TOL


@pytest.mark.parametrize("targets", [("no_such_proj",), r"model\.layers\.9\..*"])
def test_targets_matching_nothing_raise(ckpt, targets):
    model, _ = qwen3.load_hf(ckpt[0])
    with pytest.raises(ValueError, match="match no linear layer") as info:
        lora.apply_lora(model, targets=targets)
    assert "\n" not in str(info.value)
    assert not jax.tree.leaves(nnx.state(model, nnx.LoRAParam))


def test_adapting_a_layer_twice_raises(ckpt):
    model, _ = qwen3.load_hf(ckpt[0])
    lora.apply_lora(model, rank=RANK, alpha=ALPHA, targets=("q_proj",))
    with pytest.raises(ValueError, match="already has a LoRA adapter"):
        lora.apply_lora(model, rank=RANK, alpha=ALPHA, targets=("self_attn.q_proj",))
