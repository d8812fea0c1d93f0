"""A tiny random BERT checkpoint (transformers, PyTorch CPU) with a small WordPiece tokenizer."""

import pathlib

import numpy as np

TINY_BERT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=24,
    type_vocab_size=2,
)
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = "add two number sort a list of string by length , . the sum return integer".split()
PIECES = ["##s", "##ed", "##er"]
VOCAB = SPECIAL + WORDS + PIECES


def make_tiny_bert(directory, *, seed: int = 0, prefixed: bool = False):
    """Saves a random BERT and its tokenizer with `save_pretrained`; returns (path, torch `BertModel`).

    Args:
      directory: where to write config.json, model.safetensors and the tokenizer files.
      seed: torch seed for the random weights (LayerNorms are perturbed from 1 and 0).
      prefixed: save a `BertForMaskedLM` (tensors `bert.*`, an MLM head, no pooler)
        instead of a `BertModel` (no prefix, a pooler).
    """
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(VOCAB), **TINY_BERT)
    model = (BertForMaskedLM if prefixed else BertModel)(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name:
                param.add_(0.1 * torch.randn_like(param))
    path = pathlib.Path(directory)
    model.save_pretrained(path)
    BertTokenizerFast(vocab={w: i for i, w in enumerate(VOCAB)}).save_pretrained(path)
    return path, (model.bert if prefixed else model)


def torch_mean_pooled(model, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers' last hidden states [B, T, D] and their L2-normalised mean over real tokens [B, D]."""
    import torch

    with torch.no_grad():
        hidden = model(
            input_ids=torch.from_numpy(np.asarray(ids, np.int64)),
            attention_mask=torch.from_numpy(np.asarray(mask, np.int64)),
        ).last_hidden_state
    weight = torch.from_numpy(np.asarray(mask, np.float32))[..., None]
    mean = (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)
    return hidden.numpy(), torch.nn.functional.normalize(mean, p=2, dim=1).numpy()


def right_padded(vocab_size: int, lengths, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random [B, max(lengths)] ids (never the pad id 0) padded on the right, and their mask."""
    rng = np.random.default_rng(seed)
    t = max(lengths)
    ids = np.zeros((len(lengths), t), np.int32)
    mask = np.zeros((len(lengths), t), np.int32)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, vocab_size, n)
        mask[i, :n] = 1
    return ids, mask
