"""Loads any supported Hugging Face checkpoint directory by the `model_type` in its config.json."""

import json
import pathlib

from pau_jax.models import llama, qwen3, qwen3_moe, sharding

# config.json `model_type` -> the module that reads that architecture.
ARCHITECTURES = {"qwen3": qwen3, "qwen3_moe": qwen3_moe, "llama": llama}


def model_type(path: str | pathlib.Path) -> str:
    """The `model_type` of a checkpoint directory (one-line error when it is unsupported)."""
    config_path = pathlib.Path(path) / "config.json"
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
):
    """(model, config) of a Qwen3, Qwen3-MoE or Llama checkpoint directory (see `qwen3.load_hf`)."""
    return ARCHITECTURES[model_type(path)].load_hf(path, dtype, mesh, rules=rules)
