"""load_tokenizer on a Llama-3-style checkpoint directory: its own tokenizer.json, config and chat template."""

import json

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from pau_jax.policy.local import LocalPolicy
from pau_jax.tokenizer import load_tokenizer

# Llama 3's pre-tokenizer split: like Qwen's, but digits in runs of up to three.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
)
BOS, EOT = "<|begin_of_text|>", "<|eot_id|>"

# A Llama-3-shaped template: BOS, then one header + content + <|eot_id|> per message.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim }}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

CORPUS = [
    "def test_func(arg0, arg1):\n    return sorted(arg0)[:arg1]\n",
    "The quick brown fox jumps over the lazy dog. It's 2024; they've called it 12345 times.",
    "You are a helpful assistant. Describe what the function does.",
    "Input: [3, 1, 2] -> Output: [1, 2, 3]  # sorted ascending",
]

TEXTS = [
    "Hello world , the quick  brown fox !",  # a space before punctuation survives decoding
    "def f(x):\n    return x ** 2  # 1234567\n\n",
    "it 's , they 've . Ünïcödé 日本語 😀",
    "   leading and trailing   ",
    "",
]


def _backend() -> tokenizers.Tokenizer:
    """A byte-level BPE with Llama 3's pipeline, trained on a tiny corpus."""
    backend = tokenizers.Tokenizer(models.BPE(ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator(CORPUS * 4, trainer)
    backend.add_special_tokens([tokenizers.AddedToken(s, normalized=False) for s in SPECIALS])
    bos_id = backend.token_to_id(BOS)
    backend.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    return backend


@pytest.fixture(scope="module")
def backend():
    return _backend()


@pytest.fixture(scope="module", params=["inline_template", "template_file"])
def checkpoint(request, backend, tmp_path_factory):
    """A checkpoint directory laid out like an official Llama 3 Instruct one (no weights needed)."""
    path = tmp_path_factory.mktemp(request.param)
    backend.save(str(path / "tokenizer.json"))
    decoder = {
        str(backend.token_to_id(s)): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s in SPECIALS
    }
    config = {
        "added_tokens_decoder": decoder,
        "bos_token": BOS,
        "eos_token": EOT,
        # As in the official files; transformers 5 ignores it for BPE, so " ," survives.
        "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if request.param == "inline_template":
        config["chat_template"] = CHAT_TEMPLATE
    else:
        (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOT}))
    (path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    return path


@pytest.fixture(scope="module")
def tok(checkpoint):
    return load_tokenizer(checkpoint)


@pytest.mark.parametrize("text", TEXTS)
def test_encodes_like_its_tokenizer_json_and_round_trips(tok, backend, text):
    ids = tok.encode(text)
    assert ids == backend.encode(text).ids
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids) == BOS + text
    assert tok.encode(text, add_special_tokens=False) == ids[1:]


def test_special_tokens_come_from_the_checkpoint(tok, backend):
    assert tok.bos_token == BOS and tok.eos_token == EOT
    assert tok.eos_token_id == backend.token_to_id(EOT) == len(tok) - 1
    assert len(tok) == backend.get_vocab_size()
    first = len(tok) - len(SPECIALS)  # the special tokens follow the BPE vocabulary
    assert [tok.convert_tokens_to_ids(s) for s in SPECIALS] == list(range(first, len(tok)))
    ids = tok.encode(f"a{EOT}b<|start_header_id|>", add_special_tokens=False)
    assert backend.token_to_id(EOT) in ids
    assert backend.token_to_id("<|start_header_id|>") == ids[-1]
    assert tok.decode(ids, skip_special_tokens=True) == "ab"


CONVERSATION = [
    {"role": "system", "content": "You explore functions."},
    {"role": "user", "content": "  What does test_func do?\n"},
    {"role": "assistant", "content": "It sorts arg0."},
]


def test_chat_template_renders_llama3_turns(tok):
    text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nYou explore functions.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat does test_func do?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nIt sorts arg0.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    closed = tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert text.startswith(closed) and closed.endswith(EOT)


def test_chat_prompt_ids_have_one_bos_and_stop_at_eot(tok):
    # The path the local policy takes: template ids, then sampling stops at the eos.
    policy = LocalPolicy(None, tok)
    ids = policy.encode(CONVERSATION[:2])
    rendered = tok.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True)
    assert ids == tok.encode(rendered, add_special_tokens=False)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    # Llama 3.1's generation_config stops on all three: end of turn, of message, of text.
    stops = {tok.convert_tokens_to_ids(t) for t in (EOT, "<|eom_id|>", "<|end_of_text|>")}
    assert stops <= set(policy.stop_token_ids)
    assert tok.convert_tokens_to_ids("<|start_header_id|>") not in policy.stop_token_ids
