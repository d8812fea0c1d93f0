"""Converts a Llama or Qwen2 GGUF file into a float32 Hugging Face checkpoint.

The tensors are dequantised with the ``gguf`` package (the function transformers'
GGUF loader uses) and streamed one at a time into ``model.safetensors``, so the
peak memory is one tensor, not the model. Llama's q/k rows are un-permuted from
llama.cpp's rotary layout (llama.cpp permutes them for ``llama`` only, not for
``qwen2``). The tokenizer (byte-level BPE with the file's pre-tokenizer, its
special tokens and chat template) is rebuilt from the metadata. Converting needs
no torch.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np

if TYPE_CHECKING:
    import transformers

ARCHITECTURES = ("llama", "qwen2")
SAFETENSORS_FILE = "model.safetensors"

# GGUF tensor names -> Hugging Face names; in layer i, "blk.{i}.<key>.<suffix>" becomes
# "model.layers.{i}.<value>.<suffix>".
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Qwen2 has q/k/v biases; Llama (as llama.cpp writes it) has none.
_BIASES = {"llama": (), "qwen2": ("attn_q", "attn_k", "attn_v")}
_CONTROL_TOKEN = int(gguf.TokenType.CONTROL)  # special: whole, dropped by skip_special_tokens
_USER_DEFINED_TOKEN = int(gguf.TokenType.USER_DEFINED)  # added: whole, kept when decoding
_UNUSED_TOKEN = int(gguf.TokenType.UNUSED)  # llama.cpp's "[PAD151665]" fillers up to the embedding


def _field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _required(reader: gguf.GGUFReader, key: str) -> Any:
    value = _field(reader, key)
    if value is None:
        raise ValueError(f"GGUF file has no {key!r} metadata")
    return value


def _float32_value(value: float) -> float:
    """GGUF stores float32; its shortest decimal (1e-06, not 9.99999997e-07) is the original."""
    return float(str(np.float32(value)))


def read_config(reader: gguf.GGUFReader) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict of the model a GGUF file's metadata describes.

    Raises:
      ValueError: the architecture is not Llama or Qwen2, or it uses RoPE scaling or
        partial rotary dimensions.
    """
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF architecture is {arch!r}; only {ARCHITECTURES} convert")
    if _field(reader, f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ValueError("GGUF file uses RoPE scaling, which this converter does not carry over")
    hidden = _required(reader, f"{arch}.embedding_length")
    heads = _required(reader, f"{arch}.attention.head_count")
    head_dim = _field(reader, f"{arch}.attention.key_length", hidden // heads)
    if _field(reader, f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ValueError("GGUF file rotates only part of each head; not supported")
    sizes = dict(
        vocab_size=_field(
            reader, f"{arch}.vocab_size", len(reader.fields["tokenizer.ggml.tokens"].data)
        ),
        hidden_size=hidden,
        intermediate_size=_required(reader, f"{arch}.feed_forward_length"),
        num_hidden_layers=_required(reader, f"{arch}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=_field(reader, f"{arch}.attention.head_count_kv", heads),
        rms_norm_eps=_float32_value(_required(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        max_position_embeddings=_required(reader, f"{arch}.context_length"),
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    )
    theta = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    if arch == "llama":
        from pau_jax.models import llama

        config = llama.LlamaConfig(
            head_dim=head_dim, rope_theta=theta, rope_type="default", **sizes
        )
        return config.to_hf_dict()
    if head_dim * heads != hidden:
        raise ValueError(f"GGUF qwen2 heads are {head_dim} wide, not hidden size / heads")
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **sizes,
        "hidden_act": "silu",
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": sizes["num_hidden_layers"],
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
    }


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row permutation: [heads * H, D] rows back to Hugging Face order.

    llama.cpp stores each head's rows interleaved as (H/2 pairs, 2) for its rotary
    kernel; Hugging Face keeps (2 halves, H/2).
    """
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(gguf_name: str, arch: str) -> tuple[str, str | None]:
    """(Hugging Face name, GGUF layer key or None for a global tensor) of a GGUF tensor."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name], None
    parts = gguf_name.split(".")
    if (
        len(parts) != 4
        or parts[0] != "blk"
        or parts[2] not in _LAYER_NAMES
        or (parts[3] == "bias" and parts[2] not in _BIASES[arch])
        or parts[3] not in ("weight", "bias")
    ):
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face {arch} name")
    return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{parts[3]}", parts[2]


def expected_names(config: dict[str, Any]) -> set[str]:
    """The Hugging Face tensor names of a model with this ``config.json`` dict."""
    biases = _BIASES[config["model_type"]]
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config["tie_word_embeddings"]:
        names.add("lm_head.weight")
    for i in range(config["num_hidden_layers"]):
        names |= {f"model.layers.{i}.{n}.weight" for n in _LAYER_NAMES.values()}
        names |= {f"model.layers.{i}.{_LAYER_NAMES[key]}.bias" for key in biases}
    return names


def read_weights(
    reader: gguf.GGUFReader, config: dict[str, Any]
) -> dict[str, tuple[tuple[int, ...], Callable[[], np.ndarray]]]:
    """Each Hugging Face tensor's shape and a function that dequantises it to float32.

    Llama's q/k rows come back in Hugging Face order.

    Raises:
      ValueError: a tensor has an unknown name or an unexpected shape, or one is missing.
    """
    arch = config["model_type"]
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    head_dim = config.get("head_dim", head_dim)
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out = {}
    for tensor in reader.tensors:
        name, kind = _hf_name(tensor.name, arch)
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # GGUF lists [cols, rows]
        if arch == "llama" and kind in heads and shape[0] != heads[kind] * head_dim:
            raise ValueError(f"GGUF tensor {tensor.name} has {shape[0]} rows")

        def load(tensor=tensor, kind=kind, shape=shape):
            w = np.asarray(gguf.dequantize(tensor.data, tensor.tensor_type), np.float32)
            w = w.reshape(shape)
            if arch == "llama" and kind in heads:
                w = _unpermute(w, heads[kind])
            return np.ascontiguousarray(w)

        out[name] = (shape, load)
    expected = expected_names(config)
    if set(out) != expected:
        missing, extra = sorted(expected - set(out)), sorted(set(out) - expected)
        raise ValueError(f"GGUF tensors do not form the model: missing {missing}, extra {extra}")
    embed = out["model.embed_tokens.weight"][0]
    if embed != (config["vocab_size"], config["hidden_size"]):
        raise ValueError(f"GGUF embedding has shape {embed}, config says {config['vocab_size']}")
    return out


def write_safetensors(
    path: str | os.PathLike, tensors: dict[str, tuple[tuple[int, ...], Callable[[], np.ndarray]]]
) -> None:
    """Writes float32 tensors into one safetensors file, producing one tensor at a time.

    Args:
      path: the file to write.
      tensors: name -> (shape, function returning the float32 array of that shape).
    """
    names = sorted(tensors)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        shape = tensors[name][0]
        size = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for name in names:
            shape, load = tensors[name]
            array = load()
            if array.shape != shape or array.dtype != np.float32:
                raise ValueError(f"{name} came out {array.dtype}{array.shape}, expected {shape}")
            f.write(array.astype("<f4", copy=False).tobytes())


def read_tokenizer(reader: gguf.GGUFReader) -> transformers.PreTrainedTokenizerFast:
    """The tokenizer from the GGUF metadata: vocabulary, merges, specials, chat template.

    ``tokenizer.ggml.pre`` picks the pre-tokenizer: "smollm" (SmolLM2: every digit
    alone, then GPT-2's split) or "qwen2" (NFC, then Qwen2's split). Trailing unused
    "[PAD...]" fillers that pad the vocabulary to the embedding size are left out,
    as the original tokenizers have no such tokens.

    Raises:
      ValueError: the file's tokenizer is not a byte-level BPE with one of these pre-tokenizers.
    """
    import tokenizers
    import transformers
    from tokenizers import decoders, normalizers, pre_tokenizers, processors

    from pau_jax import tokenizer as tokenizer_lib

    model = _field(reader, "tokenizer.ggml.model")
    pre = _field(reader, "tokenizer.ggml.pre")
    if model != "gpt2" or pre not in ("smollm", "qwen2"):
        raise ValueError(
            f"GGUF tokenizer is {model!r} with pre-tokenizer {pre!r}; only 'gpt2' with "
            "'smollm' (SmolLM2) or 'qwen2' converts"
        )
    tokens = _required(reader, "tokenizer.ggml.tokens")
    types = _required(reader, "tokenizer.ggml.token_type")
    count = len(tokens)
    while count and types[count - 1] == _UNUSED_TOKEN:
        count -= 1
    merges = [tuple(m.split(" ")) for m in _required(reader, "tokenizer.ggml.merges")]
    backend = tokenizers.Tokenizer(
        tokenizers.models.BPE(
            vocab={token: i for i, token in enumerate(tokens[:count])},
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    if pre == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    else:
        backend.normalizer = normalizers.NFC()
        split = tokenizers.Regex(tokenizer_lib.PRETOKENIZE_PATTERN)
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(split, behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(
                    add_prefix_space=False, trim_offsets=False, use_regex=False
                ),
            ]
        )
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.decoder = decoders.ByteLevel()
    kinds = list(zip(tokens[:count], types[:count], strict=True))
    control = [t for t, kind in kinds if kind == _CONTROL_TOKEN]
    backend.add_special_tokens(
        [tokenizers.AddedToken(t, special=True, normalized=False) for t in control]
    )
    backend.add_tokens(
        [
            tokenizers.AddedToken(t, special=False, normalized=False)
            for t, kind in kinds
            if kind == _USER_DEFINED_TOKEN
        ]
    )

    def token(key):
        index = _field(reader, f"tokenizer.ggml.{key}")
        return None if index is None else tokens[index]

    if _field(reader, "tokenizer.ggml.add_bos_token", False):
        raise ValueError("GGUF tokenizer asks for a BOS token before every text; not supported")
    arch = _field(reader, "general.architecture")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        additional_special_tokens=control,
        chat_template=_field(reader, "tokenizer.chat_template"),
        model_max_length=_field(reader, f"{arch}.context_length"),
        clean_up_tokenization_spaces=False,
        add_prefix_space=False,
    )


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> pathlib.Path:
    """Writes a float32 Hugging Face checkpoint of a Llama or Qwen2 GGUF file.

    Files: ``config.json``, ``generation_config.json``, ``model.safetensors``,
    ``tokenizer.json``, ``tokenizer_config.json`` (with the chat template).

    Args:
      gguf_path: a GGUF file of a Llama or Qwen2 model with a byte-level BPE tokenizer.
      out_dir: a directory without a checkpoint in it (created if needed).

    Returns:
      ``out_dir`` as a path.
    """
    out = pathlib.Path(out_dir)
    reader = gguf.GGUFReader(str(gguf_path))
    config = read_config(reader)
    tokenizer = read_tokenizer(reader)
    if len(tokenizer) > config["vocab_size"]:
        raise ValueError(
            f"GGUF tokenizer has {len(tokenizer)} tokens, model {config['vocab_size']}"
        )
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / SAFETENSORS_FILE, read_weights(reader, config))
    config.update(pad_token_id=tokenizer.pad_token_id, dtype="float32")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": tokenizer.pad_token_id,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save_pretrained(str(out), save_jinja_files=False)
    return out
