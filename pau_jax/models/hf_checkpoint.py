"""Hugging Face checkpoints of the shared decoder: ``load_hf``, ``save_hf`` and ``Family``.

A checkpoint directory holds ``config.json`` (read and written by the family's
config class) and safetensors weights (``weights.py``). Loading fills a model built
abstractly (``abstract_model``: nothing allocated). ``Family`` pairs a config class
with its presets and is what ``auto.ARCHITECTURES`` registers.
"""

import dataclasses
import json
import pathlib
from collections.abc import Mapping

import jax
from flax import nnx

from pau_jax.models import decoder, decoder_config, sharding, weights


class _FixedKey:
    """Stands in for ``nnx.Rngs`` in an abstract build: every draw returns one key.

    Under ``nnx.eval_shape`` each ``nnx.Rngs`` counter update inspects the whole
    trace, which makes abstract builds quadratic in the number of parameters;
    the drawn values are discarded anyway.
    """

    def params(self) -> jax.Array:
        return jax.random.key(0)


def abstract_model(config: decoder_config.DecoderConfig, dtype="float32") -> decoder.Decoder:
    """The model with ``jax.ShapeDtypeStruct`` parameters (``nnx.eval_shape``; nothing allocated)."""
    return nnx.eval_shape(lambda: decoder.Decoder(config, dtype=dtype, rngs=_FixedKey()))


def load_weights(
    config: decoder_config.DecoderConfig,
    path: str | pathlib.Path,
    dtype="float32",
    mesh: jax.sharding.Mesh | None = None,
    *,
    rules: sharding.Rules = sharding.LOGICAL_RULES,
) -> decoder.Decoder:
    """Builds the abstract model for ``config`` and fills it from the checkpoint in ``path``."""
    model = abstract_model(config, dtype)
    ignore = ("lm_head.weight",) if config.tie_word_embeddings else ()
    weights.load_into(
        model, pathlib.Path(path), dtype=model.dtype, mesh=mesh, rules=rules, ignore=ignore
    )
    return model


def load_hf(
    config_class: type[decoder_config.DecoderConfig],
    path: str | pathlib.Path,
    dtype="float32",
    mesh: jax.sharding.Mesh | None = None,
    *,
    rules: sharding.Rules = sharding.LOGICAL_RULES,
) -> tuple[decoder.Decoder, decoder_config.DecoderConfig]:
    """Loads a Hugging Face checkpoint directory of one family without materialising a random model.

    The model is built abstractly with ``nnx.eval_shape``; each tensor is then
    memory-mapped, transposed on the host and placed on the default device
    (``mesh=None``) or into the sharding that ``rules`` give its logical axes.
    With tied embeddings a stored ``lm_head.weight`` is ignored. Experts may be
    stored per expert or fused (see ``weights``).

    Args:
      config_class: the family's config class; config.json must be of that family.
      path: directory with ``config.json`` and ``model.safetensors`` (or an index and shards).
      dtype: parameter dtype, e.g. "float32" or "bfloat16".
      mesh: optional device mesh.
      rules: logical-axis to mesh-axis rules.

    Returns:
      (model, config).
    """
    config = config_class.from_json(pathlib.Path(path))
    return load_weights(config, path, dtype, mesh, rules=rules), config


def save_hf(
    model: decoder.Decoder,
    config: decoder_config.DecoderConfig,
    path: str | pathlib.Path,
    *,
    max_shard_bytes: int | None = None,
) -> None:
    """Writes ``config.json`` (of the config's family) and safetensors weights that ``transformers`` loads.

    Args:
      model: the model; LoRA adapters must be merged first (``lora.merge``).
      config: the model's config.
      path: a directory without a checkpoint in it (created if needed).
      max_shard_bytes: split the weights into shards of at most this size
        (plus ``model.safetensors.index.json``); default one file.
    """
    path = pathlib.Path(path)
    if config != model.config:
        raise ValueError("save_hf: config differs from model.config; pass the model's own config")
    if jax.tree.leaves(nnx.state(model, nnx.LoRAParam)):
        raise ValueError(
            "save_hf: the model has unmerged LoRA adapters; call lora.merge(model) first "
            "or save them with lora.export_peft"
        )
    if path.exists() and (any(path.glob("*.safetensors")) or (path / weights.INDEX_FILE).exists()):
        raise FileExistsError(
            f"save_hf: {path} already holds a checkpoint; choose an empty directory"
        )
    weights.write_safetensors(weights.hf_state_dict(model), path, max_shard_bytes=max_shard_bytes)
    hf_config = config.to_hf_dict()
    hf_config["dtype"] = model.dtype.name
    (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
    """A model family: its config class (which names its config.json ``model_type``) and presets."""

    config: type[decoder_config.DecoderConfig]
    presets: Mapping[str, decoder_config.DecoderConfig]

    @property
    def model_type(self) -> str:
        return self.config.model_type

    def load_hf(
        self,
        path: str | pathlib.Path,
        dtype="float32",
        mesh: jax.sharding.Mesh | None = None,
        *,
        rules: sharding.Rules = sharding.LOGICAL_RULES,
    ) -> tuple[decoder.Decoder, decoder_config.DecoderConfig]:
        """(model, config) of a checkpoint directory of this family (see the module-level ``load_hf``)."""
        return load_hf(self.config, path, dtype, mesh, rules=rules)

    def save_hf(
        self,
        model: decoder.Decoder,
        config: decoder_config.DecoderConfig,
        path: str | pathlib.Path,
        *,
        max_shard_bytes: int | None = None,
    ) -> None:
        """``save_hf`` for a config of this family only."""
        if not isinstance(config, self.config):
            raise ValueError(
                f"save_hf: expected a {self.config.__name__}, got {type(config).__name__}"
            )
        save_hf(model, config, path, max_shard_bytes=max_shard_bytes)
