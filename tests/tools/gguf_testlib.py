"""Tiny GGUF files written as llama.cpp writes them, from tiny random transformers models.

Quantised tensors are written from the model's weights, and the model's weights are
then set to what those quantised tensors dequantise to, so a correct conversion gives
back the model exactly.
"""

import pathlib

import gguf
import numpy as np
import torch
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode

CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<tool_call>"]
UNUSED = ["[PAD0]", "[PAD1]", "[PAD2]"]  # llama.cpp's fillers up to the embedding size
MERGES = ["Ġ t", "h e", "Ġt he", "1 2", "d e", "de f"]  # "1 2" never applies: digits split
TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SIZES = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.1,
)
# Hugging Face module -> llama.cpp tensor key, written out here (not taken from the converter).
GGUF_KEYS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
Q8, Q5 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q5_0


def vocabulary(pre: str) -> tuple[list[str], list[int]]:
    """(tokens, llama.cpp token types): bytes, merged tokens, specials (and qwen2 extras)."""
    tokens = list(bytes_to_unicode().values()) + ["Ġt", "he", "Ġthe", "12", "de", "def"]
    types = [1] * len(tokens) + [3] * len(CONTROL)
    tokens += CONTROL
    if pre == "qwen2":
        tokens += USER_DEFINED + UNUSED
        types += [4] * len(USER_DEFINED) + [5] * len(UNUSED)
    return tokens, types


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Llama q/k rows (the converter undoes it)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def tiny_model(arch: str, vocab_size: int, seed: int = 0) -> transformers.PreTrainedModel:
    """A random tiny Llama (tied embeddings) or Qwen2 (separate lm_head, q/k/v biases)."""
    torch.manual_seed(seed)
    if arch == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab_size,
            head_dim=16,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
            tie_word_embeddings=True,
            **SIZES,
        )
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen2Config(
            vocab_size=vocab_size,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
            **SIZES,
        )
        model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def _quantized(model, name: str, qtype) -> np.ndarray:
    """The quantised bytes of parameter ``name``; the parameter becomes their dequantisation."""
    param = model.get_parameter(name)
    raw = gguf.quants.quantize(param.detach().numpy(), qtype)
    with torch.no_grad():
        param.copy_(torch.from_numpy(gguf.quants.dequantize(raw, qtype)))
    return raw


def write_gguf(path: pathlib.Path, model, *, pre: str) -> None:
    """Writes ``model`` as llama.cpp would, with the tokenizer of ``vocabulary(pre)``.

    Llama: q/k rows permuted, Q8_0 MLP weights. Qwen2: no permutation, Q8_0 MLP and
    lm_head, Q5_0 v/o projections, F32 embedding, norms and biases.
    """
    c = model.config
    arch = c.model_type
    tokens, types = vocabulary(pre)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    if arch == "llama":
        writer.add_rope_dimension_count(c.head_dim)
        writer.add_vocab_size(len(tokens))
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    if arch == "llama":
        writer.add_bos_token_id(tokens.index("<|im_start|>"))
        writer.add_unk_token_id(tokens.index("<|endoftext|>"))
        writer.add_pad_token_id(tokens.index("<|im_end|>"))
    else:
        writer.add_bos_token_id(tokens.index("<|endoftext|>"))
        writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    quantize = {"ffn_gate": Q8, "ffn_up": Q8, "ffn_down": Q8}
    if arch == "qwen2":
        quantize |= {"attn_v": Q5, "attn_output": Q5, "output": Q8}
    for name in list(model.state_dict()):
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            key = {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm"}
            gguf_name, kind = f"{key.get(name, 'output')}.weight", key.get(name, "output")
        else:
            _, _, layer, *module, suffix = name.split(".")
            kind = GGUF_KEYS[".".join(module)]
            gguf_name = f"blk.{layer}.{kind}.{suffix}"
        if kind in quantize and name.endswith(".weight"):
            raw = _quantized(model, name, quantize[kind])
            writer.add_tensor(gguf_name, raw, raw_dtype=quantize[kind])
            continue
        w = model.get_parameter(name).detach().numpy()
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            heads = c.num_attention_heads if kind == "attn_q" else c.num_key_value_heads
            w = llama_cpp_permute(w, heads)
        writer.add_tensor(gguf_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_gguf(
    directory: pathlib.Path, arch: str
) -> tuple[pathlib.Path, transformers.PreTrainedModel]:
    """(path of a tiny GGUF file in ``directory``, the model it holds exactly)."""
    pre = "smollm" if arch == "llama" else "qwen2"
    model = tiny_model(arch, len(vocabulary(pre)[0]))
    path = directory / f"tiny-{arch}.gguf"
    write_gguf(path, model, pre=pre)
    return path, model
