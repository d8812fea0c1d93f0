"""The model families by config.json `model_type`: load any checkpoint, write a random one."""

import json
import pathlib

from flax import nnx

from pau_jax import hub
from pau_jax.models import (
    decoder,
    decoder_config,
    hf_checkpoint,
    llama,
    qwen2,
    qwen3,
    qwen3_moe,
    sharding,
)

# config.json `model_type` -> its family (`hf_checkpoint.Family`); the one list of supported models.
ARCHITECTURES: dict[str, hf_checkpoint.Family] = {
    family.model_type: family
    for family in (qwen3.FAMILY, qwen3_moe.FAMILY, qwen2.FAMILY, llama.FAMILY)
}


def model_type(path: str | pathlib.Path) -> str:
    """The `model_type` of a checkpoint directory (one-line error when it is unsupported)."""
    config_path = hub.resolve(path) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found; expected a Hugging Face model directory")
    kind = json.loads(config_path.read_text()).get("model_type")
    if kind not in ARCHITECTURES:
        raise ValueError(
            f"{config_path} has model_type {kind!r}; supported: {sorted(ARCHITECTURES)}"
        )
    return kind


def load_hf(
    path: str | pathlib.Path,
    dtype="float32",
    mesh=None,
    *,
    rules: sharding.Rules = sharding.LOGICAL_RULES,
) -> tuple[decoder.Decoder, decoder_config.DecoderConfig]:
    """(model, config) of a checkpoint of any family (see `hf_checkpoint.load_hf`).

    ``path`` is a directory or a Hugging Face repo id (``Qwen/Qwen3-8B``), taken from the
    hub cache and downloaded first when the hub can be reached (``pau_jax.hub``).
    """
    path = hub.resolve(path)
    return ARCHITECTURES[model_type(path)].load_hf(path, dtype, mesh, rules=rules)


def random_checkpoint(
    config: decoder_config.DecoderConfig,
    path: str | pathlib.Path,
    *,
    seed: int = 0,
    dtype="float32",
    tokenizer: bool = True,
) -> pathlib.Path:
    """Writes a randomly initialised model of `config` as a Hugging Face checkpoint directory.

    The parameters are those of `decoder.Decoder(config, rngs=nnx.Rngs(seed))`;
    `load_hf(path)` reads them back.

    Args:
      config: the config of a family in `ARCHITECTURES` (e.g. a `qwen3.Qwen3Config`).
      path: a directory without a checkpoint in it (created if needed).
      seed: the seed of the initial parameters.
      dtype: parameter dtype, e.g. "float32" or "bfloat16".
      tokenizer: also write the offline Qwen3 tokenizer (`tokenizer.save_offline_tokenizer`);
        its ids must fit `config.vocab_size`.

    Returns:
      The directory as a path.
    """
    family = ARCHITECTURES.get(getattr(config, "model_type", None))
    if family is None or not isinstance(config, family.config):
        raise ValueError(
            f"random_checkpoint: {type(config).__name__} is not a registered family; "
            f"register it in auto.ARCHITECTURES (supported: {sorted(ARCHITECTURES)})"
        )
    path = pathlib.Path(path)
    if tokenizer:
        from pau_jax import tokenizer as tokenizer_lib

        size = len(tokenizer_lib.offline_qwen3_tokenizer())
        if size > config.vocab_size:
            raise ValueError(
                f"random_checkpoint: the offline Qwen3 tokenizer has {size} tokens but "
                f"vocab_size is {config.vocab_size}; pass tokenizer=False or a larger vocabulary"
            )
    model = decoder.Decoder(config, dtype=dtype, rngs=nnx.Rngs(seed))
    family.save_hf(model, config, path)
    if tokenizer:
        tokenizer_lib.save_offline_tokenizer(path)
    return path
