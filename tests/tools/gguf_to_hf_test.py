"""GGUF to Hugging Face conversion of tiny Llama and Qwen2 models, checked against transformers."""

import json
import unicodedata

import gguf
import gguf_testlib as lib
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from pau_jax import tokenizer as tokenizers_lib
from pau_jax.models import llama
from pau_jax.tools import gguf_to_hf

IDS = torch.tensor([[5, 80, 3, 200, 17, 9, 258, 120]])
# Varied texts, all NFC (transformers' GGUF tokenizer has no NFC normaliser; Qwen2's own has).
TEXTS = [
    " the 12 def",
    "def f(x):\n    return x * 12345  # ok\n",
    "\t\tif a != b:\r\n\t\t\tpass",
    "   leading and trailing   ",
    "a  b   c    d\n\n\n",
    "Café déjà vu, 中文, emoji 🙂, Ω",
    "I'm we're they've I'll he'd IT'S",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    '<tool_call>{"a": 1}</tool_call>',
    "3.14159e-10 0x1F_FF 1,000,000",
    "",
]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return lib.tiny_gguf(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    return lib.tiny_gguf(tmp_path_factory.mktemp("qwen2"), "qwen2")


def _from_gguf(path):
    """transformers' own GGUF loader: the reference."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()


def _assert_same_model(converted, original, reference):
    ours, theirs, want = (m.state_dict() for m in (converted, reference, original))
    assert set(ours) == set(theirs) == set(want)
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=0, msg=name)
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=0, msg=name)
    with torch.no_grad():
        diff = (converted(IDS).logits - original(IDS).logits).abs().max().item()
    assert diff <= 1e-5


def test_unpermute_undoes_llama_cpp_permutation():
    w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4 * 8, 3)
    permuted = lib.llama_cpp_permute(w, heads=4)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(gguf_to_hf._unpermute(permuted, 4), w)


def test_tiny_llama_converts_to_the_model_it_was_written_from(tiny_llama, tmp_path):
    path, original = tiny_llama
    out = gguf_to_hf.convert_gguf(path, tmp_path / "ckpt")
    config = llama.LlamaConfig.from_json(out)
    assert config.tie_word_embeddings and config.rope_theta == 100000.0
    assert config.rms_norm_eps == 1e-5 and config.head_dim == 16
    assert (config.bos_token_id, config.eos_token_id) == (263, 264)
    converted = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert isinstance(converted, transformers.LlamaForCausalLM)
    _assert_same_model(converted, original, _from_gguf(path))


def test_tiny_llama_tokenizer_splits_digits_and_keeps_specials(tiny_llama, tmp_path):
    path, _ = tiny_llama
    out = gguf_to_hf.convert_gguf(path, tmp_path / "ckpt")
    tok = tokenizers_lib.load_tokenizer(out)
    vocab = tok.get_vocab()
    assert tok.encode(" the") == [vocab["Ġthe"]]
    assert tok.encode("12") == [vocab["1"], vocab["2"]]  # the merge "1 2" never applies
    assert tok.encode("<|im_start|>x<|im_end|>") == [263, vocab["x"], 264]
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == lib.TEMPLATE
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"
    assert tok.decode(tok.encode(" the 12 é")) == " the 12 é"


def test_tiny_qwen2_converts_to_the_model_it_was_written_from(tiny_qwen2, tmp_path):
    path, original = tiny_qwen2
    out = gguf_to_hf.convert_gguf(path, tmp_path / "ckpt")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["tie_word_embeddings"] is False and config["use_sliding_window"] is False
    assert config["rms_norm_eps"] == 1e-6 and config["rope_theta"] == 1e6
    assert config["max_position_embeddings"] == 128 and config["hidden_act"] == "silu"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (
        262,
        264,
        262,
    )
    assert config["dtype"] == "float32"
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 262, "eos_token_id": 264, "pad_token_id": 262}
    tensors = safetensors.numpy.load_file(out / gguf_to_hf.SAFETENSORS_FILE)
    assert "lm_head.weight" in tensors and "model.layers.1.self_attn.k_proj.bias" in tensors
    assert not np.array_equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    converted = transformers.Qwen2ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    _assert_same_model(converted, original, _from_gguf(path))


def test_tiny_qwen2_tokenizer_matches_transformers_and_normalises(tiny_qwen2, tmp_path):
    path, _ = tiny_qwen2
    out = gguf_to_hf.convert_gguf(path, tmp_path / "ckpt")
    tok = tokenizers_lib.load_tokenizer(out)
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tokens, _ = lib.vocabulary("qwen2")
    assert len(tok) == len(tokens) - len(lib.UNUSED)  # no "[PAD...]" fillers
    for text in TEXTS:
        assert tok.encode(text) == theirs.encode(text), text
        assert tok.decode(tok.encode(text)) == text
    vocab = tok.get_vocab()
    assert tok.encode("12") == [vocab["1"], vocab["2"]]
    assert tok.encode("def") == [vocab["def"]]
    assert tok.encode("e\u0301") == tok.encode("é")  # NFC, as Qwen2's own tokenizer
    assert unicodedata.normalize("NFC", "e\u0301") == "é"
    assert tok.encode("[PAD0]") == tok.encode("[") + tok.encode("PAD") + [vocab["0"]] + tok.encode(
        "]"
    )
    ids = tok.encode("<|im_start|>a<tool_call><|im_end|>")
    assert ids == [263, vocab["a"], 265, 264]
    assert tok.decode(ids, skip_special_tokens=True) == "a<tool_call>"  # user-defined: kept
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == (
        "<|endoftext|>",
        "<|im_end|>",
        "<|endoftext|>",
        None,
    )
    conversation = [{"role": "user", "content": "hi"}]
    ours = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    want = theirs.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert ours == want == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_streamed_safetensors_read_back(tmp_path):
    arrays = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.ones(5, np.float32)}
    tensors = {name: (a.shape, lambda a=a: a) for name, a in arrays.items()}
    gguf_to_hf.write_safetensors(tmp_path / "x.safetensors", tensors)
    back = safetensors.numpy.load_file(tmp_path / "x.safetensors")
    assert set(back) == set(arrays)
    for name, a in arrays.items():
        np.testing.assert_array_equal(back[name], a)
    header_size = int.from_bytes((tmp_path / "x.safetensors").read_bytes()[:8], "little")
    assert header_size % 8 == 0
    with pytest.raises(ValueError, match="expected"):
        gguf_to_hf.write_safetensors(tmp_path / "y.safetensors", {"a": ((4,), lambda: arrays["a"])})


def test_other_architectures_are_refused(tmp_path):
    path = tmp_path / "gemma.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture is 'gemma'"):
        gguf_to_hf.convert_gguf(path, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
