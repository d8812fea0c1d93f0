"""Low-rank adapters (LoRA) on a model's linear layers, with peft-compatible export and import.

``apply_lora`` gives each matched ``layers.Linear`` an adapter computing
``x @ A @ B * (alpha / rank)`` (A [in, R], B [R, out], both ``nnx.LoRAParam``)
added to the base output. A is drawn like peft's default (kaiming-uniform with
``a = sqrt(5)``, i.e. uniform in +-1/sqrt(in)), on the host by numpy's PCG64
from ``seed``; B starts at zero, so a fresh adapter leaves the model unchanged.
``merge`` folds the adapters into the base kernels and removes them. Only linear
layers inside the decoder blocks can be adapted (not the embedding or ``lm_head``).
"""

import json
import math
import pathlib
import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from flax import nnx

from pau_jax.models import layers, quantization, weights

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


class LoRA(nnx.Module):
    """The low-rank update of one linear layer: ``x @ A @ B * (alpha / rank)``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        rank: int,
        alpha: float,
        axes: tuple[str | None, str | None],
        param_dtype,
        rng: np.random.Generator,
    ):
        """Draws A uniformly in +-1/sqrt(in) on the host from ``rng``; B is zero."""
        bound = 1.0 / math.sqrt(in_features)
        a = rng.uniform(-bound, bound, (in_features, rank))
        self.lora_a = nnx.LoRAParam(
            jnp.asarray(a, param_dtype), out_sharding=(axes[0], None), eager_sharding=False
        )
        self.lora_b = nnx.LoRAParam(
            jnp.asarray(np.zeros((rank, out_features)), param_dtype),
            out_sharding=(None, axes[1]),
            eager_sharding=False,
        )
        self.rank = rank
        self.alpha = alpha

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps [..., in] to the [..., out] update, computed in the dtype of ``x``."""
        a = self.lora_a[...].astype(x.dtype)
        b = self.lora_b[...].astype(x.dtype)
        return (x @ a @ b) * jnp.asarray(self.scale, x.dtype)

    def delta(self) -> jax.Array:
        """The [in, out] float32 kernel update ``A @ B * scale``."""
        a = self.lora_a[...].astype(jnp.float32)
        return a @ self.lora_b[...].astype(jnp.float32) * self.scale


def _linears(model: nnx.Module) -> list[tuple[str, layers.Linear]]:
    """The adaptable linear layers with their dotted paths (e.g. model.layers.0.mlp.up_proj)."""
    return [
        (".".join(str(p) for p in path), module)
        for path, module in nnx.iter_modules(model)
        if isinstance(module, layers.Linear)
    ]


def _matches(path: str, targets: str | Sequence[str]) -> bool:
    """peft's rule: a string is a regex over the full path; a list matches path suffixes."""
    if isinstance(targets, str):
        return re.fullmatch(targets, path) is not None
    return any(path == t or path.endswith("." + t) for t in targets)


def apply_lora(
    model: nnx.Module,
    rank: int = 16,
    alpha: float = 16,
    targets: str | Sequence[str] = DEFAULT_TARGETS,
    *,
    seed: int = 0,
    param_dtype=jnp.float32,
) -> int:
    """Adds LoRA adapters (``nnx.LoRAParam`` A and B) to the matched linear layers, in place.

    Args:
      model: a model whose linear layers are ``layers.Linear``.
      rank: R.
      alpha: scale numerator; the update is scaled by ``alpha / rank``.
      targets: module names matched as path suffixes (``"q_proj"``,
        ``"self_attn.q_proj"``), or one regex matched against the whole dotted path.
      seed: seed of the host generator that draws every A.
      param_dtype: dtype of A and B (float32 by default so small updates survive
        bfloat16 base weights).

    Returns:
      The number of adapted layers.

    Raises:
      ValueError: nothing matches, a match already has an adapter, or rank <= 0.
    """
    if rank <= 0:
        raise ValueError(f"LoRA rank must be positive, got {rank}")
    candidates = _linears(model)
    matched = [(path, m) for path, m in candidates if _matches(path, targets)]
    if not matched:
        names = sorted({path.rsplit(".", 1)[-1] for path, _ in candidates})
        raise ValueError(f"LoRA targets {targets!r} match no linear layer; the layers are {names}")
    for path, module in matched:
        if module.lora is not None:
            raise ValueError(f"{path} already has a LoRA adapter; merge it or build a fresh model")
    rng = np.random.default_rng(seed)
    for _, module in matched:
        axes = module.kernel.get_metadata().get("out_sharding") or (None, None)
        module.lora = LoRA(
            module.in_features,
            module.out_features,
            rank=rank,
            alpha=alpha,
            axes=tuple(axes),
            param_dtype=param_dtype,
            rng=rng,
        )
    return len(matched)


def adapters(model: nnx.Module) -> dict[str, LoRA]:
    """The model's adapters by dotted path of the layer they adapt."""
    return {path: m.lora for path, m in _linears(model) if m.lora is not None}


def merge(model: nnx.Module) -> int:
    """Folds every adapter into its base kernel (``W += A @ B * scale``) and removes it.

    Afterwards the model has no ``nnx.LoRAParam`` and computes the same function
    (up to rounding in the kernel dtype). Biases are left as they are. Quantised decode
    copies of the kernels (``quantization.quantize_for_decode``) are made again from the
    merged kernels.

    Returns:
      The number of merged layers.
    """
    decode_weights = quantization.decode_weights_of(model)
    count = 0
    for _, module in _linears(model):
        if module.lora is None:
            continue
        kernel = module.kernel[...]
        module.kernel.set_value(
            (kernel.astype(jnp.float32) + module.lora.delta()).astype(kernel.dtype)
        )
        module.lora = None
        count += 1
    if count and decode_weights != "float32":
        quantization.quantize_for_decode(model, decode_weights)
    return count


def _uniform(found: dict[str, LoRA]) -> tuple[int, float]:
    settings = {(m.rank, m.alpha) for m in found.values()}
    if len(settings) != 1:
        raise ValueError(
            f"adapters have different (rank, alpha) {sorted(settings)}; peft needs one"
        )
    return settings.pop()


def _target_modules(model: nnx.Module, adapted: set[str]) -> list[str]:
    """Short names when they select exactly the adapted layers, else the full paths."""
    names = sorted({path.rsplit(".", 1)[-1] for path in adapted})
    # Every module peft would match by these suffixes (e.g. stacked experts named gate_proj).
    every = {".".join(str(p) for p in path) for path, _ in nnx.iter_modules(model) if path}
    selected = {path for path in every if _matches(path, names)}
    return names if selected == adapted else sorted(adapted)


def export_peft(
    model: nnx.Module, path: str | pathlib.Path, *, base_model_name_or_path: str | None = None
) -> None:
    """Writes ``adapter_config.json`` and ``adapter_model.safetensors`` for ``PeftModel.from_pretrained``.

    Tensors are named ``base_model.model.<layer path>.lora_A.weight`` ([R, in])
    and ``...lora_B.weight`` ([out, R]), in the adapters' parameter dtype.
    """
    found = adapters(model)
    if not found:
        raise ValueError("export_peft: the model has no LoRA adapters; call lora.apply_lora first")
    rank, alpha = _uniform(found)
    tensors = {}
    for layer_path, adapter in found.items():
        a = np.asarray(jax.device_get(adapter.lora_a[...]))
        b = np.asarray(jax.device_get(adapter.lora_b[...]))
        tensors[f"{_PEFT_PREFIX}{layer_path}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"{_PEFT_PREFIX}{layer_path}.lora_B.weight"] = np.ascontiguousarray(b.T)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": _target_modules(model, set(found)),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    safetensors.numpy.save_file(tensors, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def load_peft(model: nnx.Module, path: str | pathlib.Path, *, param_dtype=jnp.float32) -> int:
    """Adds the adapters of a peft LoRA directory to ``model`` (plain LoRA only).

    Returns:
      The number of adapted layers.

    Raises:
      ValueError: the adapter uses a feature beyond plain LoRA, or its tensors
        do not match the adapted layers.
    """
    path = pathlib.Path(path)
    config = json.loads((path / ADAPTER_CONFIG).read_text())
    source = path / ADAPTER_CONFIG
    if config.get("peft_type") != "LORA" or config.get("bias", "none") != "none":
        raise ValueError(f"{source} is not a plain LoRA adapter (peft_type LORA, bias none)")
    extras = (
        "use_dora",
        "use_rslora",
        "fan_in_fan_out",
        "lora_bias",
        "modules_to_save",
        "rank_pattern",
        "alpha_pattern",
        "layers_to_transform",
        "layers_pattern",
        "target_parameters",
        "exclude_modules",
    )
    for key in extras:
        if config.get(key):
            raise ValueError(f"{source} sets {key}={config[key]!r}; only plain LoRA is supported")
    rank, targets = config["r"], config["target_modules"]
    reader = weights.SafetensorsReader([path / ADAPTER_WEIGHTS], source=path)
    matched = {p: m for p, m in _linears(model) if _matches(p, targets)}
    wanted = {}
    for layer_path, module in matched.items():
        prefix = f"{_PEFT_PREFIX}{layer_path}"
        wanted[f"{prefix}.lora_A.weight"] = (layer_path, "lora_a", (rank, module.in_features))
        wanted[f"{prefix}.lora_B.weight"] = (layer_path, "lora_b", (module.out_features, rank))
    for name, (_, _, shape) in wanted.items():
        if name not in reader.names:
            raise ValueError(f"{path / ADAPTER_WEIGHTS} lacks {name!r}")
        if reader.shape(name) != shape:
            raise ValueError(f"{name!r} has shape {reader.shape(name)}, expected {shape}")
    unused = sorted(reader.names - set(wanted))
    if unused:
        raise ValueError(f"{path / ADAPTER_WEIGHTS} has tensors no target layer uses: {unused[:3]}")
    count = apply_lora(model, rank, config["lora_alpha"], targets, param_dtype=param_dtype)
    for name, (layer_path, attribute, _) in wanted.items():
        var = getattr(matched[layer_path].lora, attribute)
        var.set_value(jnp.asarray(np.asarray(reader.array(name).T, dtype=param_dtype)))
    return count
