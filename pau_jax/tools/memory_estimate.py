"""Per-device memory of a configured model, mesh and batch, and whether it fits a chip.

    python -m pau_jax.tools.memory_estimate --gin_file=models/qwen3_8b.gin --gin_file=mesh/fsdp8.gin \\
        --chip=h200 --batch=64 --seq_len=4096

Parameters, LoRA adapters and optimizer state are counted exactly from the
model's abstract parameter tree and the learner layout's sharding rules; the
KV cache is the sampler's ([B, S, K, H] per layer, rows over the batch axes,
heads over tp where they divide); activations are an estimate of what the
backward pass of one training micro-batch keeps, plus one chunk of logits:
every layer's activations, or with ``--remat`` (``LearnerConfig.remat``: layers
scanned, each recomputed in the backward pass) every layer's input plus one layer's
activations.
"""

import argparse
import dataclasses
import math
import os
import pathlib

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh

from pau_jax import parallel
from pau_jax.models import layers, qwen3

GIB = 1024**3
# Device memory in bytes (what the runtime reports as the device's total).
CHIPS: dict[str, int] = {
    "h200": 143_771 * 1024**2,
    "a100-80g": 81_920 * 1024**2,
    "v5e": 16 * GIB,
    "v5p": 95 * GIB,
}
# Share of device memory a run can use (runtime reservations, fragmentation).
USABLE_FRACTION = 0.9
GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin"
# Gin names of the model configs a preset may bind, most specific first.
MODEL_CONFIGS = (
    "pau_jax.models.qwen3_moe.Qwen3MoeConfig",
    "pau_jax.models.llama.LlamaConfig",
    "pau_jax.models.qwen2.Qwen2Config",
    "pau_jax.models.qwen3.Qwen3Config",
)


def chip_bytes(chip: str) -> int:
    """Device memory of ``chip``; "cpu" is this host's physical memory."""
    if chip == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if chip not in CHIPS:
        raise ValueError(f"unknown chip {chip!r}; choose one of {sorted([*CHIPS, 'cpu'])}")
    return CHIPS[chip]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Bytes per device (the most loaded device where shards are uneven).

    Attributes:
      params: base weights in the learner layout.
      sampler_params: the extra copy in the sampler layout (0 when fsdp is 1: same arrays).
      lora: LoRA adapters (float32).
      optimizer: AdamW moments of the adapters.
      kv_cache: the rollout batch's KV cache.
      activations: what one training micro-batch keeps for the backward pass.
      num_params: total base parameters (all devices).
      capacity: the chip's memory, or None.
    """

    params: int
    sampler_params: int
    lora: int
    optimizer: int
    kv_cache: int
    activations: int
    num_params: int
    capacity: int | None = None

    @property
    def total(self) -> int:
        return (
            self.params
            + self.sampler_params
            + self.lora
            + self.optimizer
            + self.kv_cache
            + self.activations
        )

    @property
    def fits(self) -> bool | None:
        """Whether the total fits ``USABLE_FRACTION`` of the chip (None without a chip)."""
        return None if self.capacity is None else self.total <= USABLE_FRACTION * self.capacity


def _shard_factor(spec, mesh: AbstractMesh) -> int:
    factor = 1
    for entry in spec:
        for axis in (entry,) if isinstance(entry, str) else entry or ():
            factor *= mesh.shape[axis]
    return factor


def _per_device(shape, axes, itemsize: int, mesh: AbstractMesh, rules) -> int:
    if axes is None:
        return int(np.prod(shape)) * itemsize
    spec = parallel.partition_spec(axes, shape, mesh, rules)
    return math.ceil(int(np.prod(shape)) / _shard_factor(spec, mesh)) * itemsize


def count_params(config: qwen3.Qwen3Config) -> int:
    """Base parameters of the model ``config`` describes (from its abstract parameter tree)."""
    model = qwen3.abstract_model(config, "float32")
    return sum(int(np.prod(v.shape)) for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Param))


def estimate(
    model_config: qwen3.Qwen3Config,
    mesh_config: parallel.MeshConfig,
    *,
    num_devices: int,
    batch: int,
    seq_len: int,
    rollout_batch: int | None = None,
    micro_batch_size: int | None = None,
    lora_rank: int = 16,
    dtype="bfloat16",
    kv_dtype=None,
    logits_chunk_tokens: int = 1024,
    remat: bool = False,
    chip: str | None = None,
) -> MemoryEstimate:
    """Estimates per-device memory of training and rollouts.

    Args:
      model_config: a ``Qwen3Config`` (or ``LlamaConfig``).
      mesh_config: mesh sizes; -1 takes the rest of ``num_devices``.
      num_devices: devices in the mesh.
      batch: training rows per step (global).
      seq_len: tokens per row (prompt + completion); also the KV cache slots.
      rollout_batch: sampler rows (global); default ``batch``.
      micro_batch_size: training rows per micro-batch (global); default ``batch``.
      lora_rank: R of the adapters on every decoder linear layer.
      dtype: base weight dtype.
      kv_dtype: KV cache dtype; default ``dtype``.
      logits_chunk_tokens: positions whose [chunk, V] logits exist at once.
      remat: the learner recomputes each layer's activations (``LearnerConfig.remat``).
      chip: a key of ``CHIPS`` or "cpu" to compare against, or None.
    """
    mesh = AbstractMesh(mesh_config.axis_sizes(num_devices), parallel.MESH_AXES)
    size = np.dtype(jnp.dtype(dtype)).itemsize
    kv_size = np.dtype(jnp.dtype(kv_dtype or dtype)).itemsize
    model = qwen3.abstract_model(model_config, dtype)
    params = sampler = lora = num_params = 0
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Param):
            axes = node.get_metadata().get("out_sharding")
            num_params += int(np.prod(node.shape))
            params += _per_device(node.shape, axes, size, mesh, parallel.LEARNER_RULES)
            sampler += _per_device(node.shape, axes, size, mesh, parallel.SAMPLER_RULES)
        if isinstance(node, layers.Linear):
            in_axis, out_axis = node.kernel.get_metadata().get("out_sharding")
            a = ((node.in_features, lora_rank), (in_axis, None))
            b = ((lora_rank, node.out_features), (None, out_axis))
            for shape, axes in (a, b):
                lora += _per_device(shape, axes, 4, mesh, parallel.LEARNER_RULES)
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    tp = mesh.shape["tp"]
    c = model_config
    rows = math.ceil((rollout_batch or batch) / data_parallel)
    kv_heads = (
        c.num_key_value_heads // tp if c.num_key_value_heads % tp == 0 else c.num_key_value_heads
    )
    kv_cache = 2 * c.num_hidden_layers * rows * seq_len * kv_heads * c.head_dim * kv_size
    return MemoryEstimate(
        params=params,
        sampler_params=0 if mesh.shape["fsdp"] == 1 else sampler,
        lora=lora,
        optimizer=2 * lora,
        kv_cache=kv_cache,
        activations=_activations(
            c,
            math.ceil((micro_batch_size or batch) / data_parallel),
            seq_len,
            tp,
            size,
            logits_chunk_tokens,
            remat,
        ),  # fmt: skip
        num_params=num_params,
        capacity=None if chip is None else chip_bytes(chip),
    )


def _activations(
    c, rows: int, seq_len: int, tp: int, size: int, chunk: int, remat: bool = False
) -> int:
    """Bytes one micro-batch keeps for the backward pass (see the module docstring).

    Per token and layer: block input, two norm outputs and the residual (4 D),
    queries, keys and values before and after RoPE (2 (N + 2K) H / tp), the
    attention output (N H / tp), the MLP's gate, up, silu and product (4 F / tp)
    in the weight dtype, plus the float32 norm statistics (2 D); per layer the
    float32 attention scores and probabilities (2 N T^2 / tp per row). The head
    adds one [chunk, V / tp] float32 block of logits, probabilities and gradient. With
    ``remat`` the layers keep only their inputs (D per token each) and one layer's
    activations exist at a time, in its recomputation.
    """
    d, f, h = c.hidden_size, c.intermediate_size, c.head_dim
    n, k = c.num_attention_heads, c.num_key_value_heads
    per_token = size * (4 * d + (2 * (n + 2 * k) * h + n * h + 4 * f) // tp) + 4 * 2 * d
    scores = 4 * 2 * (n // tp if n % tp == 0 else n) * seq_len * seq_len
    tokens = rows * seq_len
    head = (
        3
        * 4
        * min(chunk, tokens)
        * (c.vocab_size // tp if c.vocab_size % tp == 0 else c.vocab_size)
    )
    layer = tokens * per_token + rows * scores
    if remat:
        return c.num_hidden_layers * tokens * size * c.hidden_size + layer + head
    return c.num_hidden_layers * layer + head


def _register(gin) -> None:
    """Makes the model configs and the mesh config known to gin, each once.

    Only these: every other binding of a run's gin files is skipped (``skip_unknown``),
    so the tool needs nothing of the run modes above it.
    """
    import importlib

    for name in (*MODEL_CONFIGS, "pau_jax.parallel.MeshConfig"):
        try:
            gin.get_configurable(name)
            continue
        except ValueError:
            pass
        module, cls = name.rsplit(".", 1)
        gin.external_configurable(getattr(importlib.import_module(module), cls), module=module)


def load_gin(
    files: list[str], bindings: list[str] = ()
) -> tuple[qwen3.Qwen3Config, parallel.MeshConfig]:
    """The model config and mesh config that gin files bind (model presets, mesh files, run files)."""
    import importlib.util  # noqa: F401  (gin-config 0.5.0 needs it before parsing includes)

    import gin

    _register(gin)
    gin.clear_config()
    gin.add_config_file_search_path(str(GIN_DIR))
    paths = []
    for name in files:
        candidates = [pathlib.Path(name), GIN_DIR / name]
        found = next((p for p in candidates if p.exists()), None)
        if found is None:
            raise FileNotFoundError(f"gin file {name!r} not found here or in {GIN_DIR}")
        paths.append(str(found))
    gin.parse_config_files_and_bindings(
        paths, list(bindings), finalize_config=False, skip_unknown=True
    )
    model_config = None
    for name in MODEL_CONFIGS:
        try:
            gin.query_parameter(f"{name}.hidden_size")
        except ValueError:
            continue
        model_config = gin.get_configurable(name)()
        break
    if model_config is None:
        raise ValueError(
            f"{files} bind no model; include a preset from {GIN_DIR / 'models'} "
            "(e.g. --gin_file=models/qwen3_8b.gin)"
        )
    mesh_config = gin.get_configurable("pau_jax.parallel.MeshConfig")()
    gin.clear_config()
    return model_config, mesh_config


def _gib(n: int) -> str:
    return f"{n / GIB:10.3f} GiB"


def report(est: MemoryEstimate, *, chip: str | None, mesh_text: str) -> str:
    """The human-readable table ``main`` prints."""
    lines = [
        f"base parameters: {est.num_params:,} ({est.num_params / 1e9:.2f} B); mesh {mesh_text}",
        "per device:",
        f"  parameters (learner layout)      {_gib(est.params)}",
        f"  parameters (sampler copy)        {_gib(est.sampler_params)}",
        f"  LoRA adapters                    {_gib(est.lora)}",
        f"  optimizer state (AdamW)          {_gib(est.optimizer)}",
        f"  KV cache (rollout batch)         {_gib(est.kv_cache)}",
        f"  activations (train micro-batch)  {_gib(est.activations)}",
        f"  total                            {_gib(est.total)}",
    ]
    if chip is not None:
        usable = USABLE_FRACTION * est.capacity
        verdict = "fits" if est.fits else "does NOT fit"
        lines.append(
            f"{verdict} on {chip}: {est.total / usable:.0%} of {usable / GIB:.1f} GiB usable "
            f"({USABLE_FRACTION:.0%} of {est.capacity / GIB:.1f} GiB)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pau_jax.tools.memory_estimate", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--gin_file", action="append", required=True, help="model preset, mesh or run file"
    )
    parser.add_argument("--gin_bindings", action="append", default=[])
    parser.add_argument("--chip", choices=[*CHIPS, "cpu"], default=None)
    parser.add_argument(
        "--num_devices", type=int, default=None, help="default: the mesh's fixed sizes, else 1"
    )
    parser.add_argument("--batch", type=int, default=64, help="training rows per step (global)")
    parser.add_argument(
        "--rollout_batch", type=int, default=None, help="sampler rows (default --batch)"
    )
    parser.add_argument(
        "--micro_batch", type=int, default=None, help="training rows per micro-batch"
    )
    parser.add_argument("--seq_len", type=int, default=4096)
    parser.add_argument("--lora_rank", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--remat", action="store_true", help="the learner recomputes layer activations"
    )
    args = parser.parse_args(argv)
    model_config, mesh_config = load_gin(args.gin_file, args.gin_bindings)
    sizes = dataclasses.astuple(mesh_config)
    num_devices = args.num_devices or (math.prod(sizes) if -1 not in sizes else 1)
    est = estimate(
        model_config, mesh_config, num_devices=num_devices, batch=args.batch,
        seq_len=args.seq_len, rollout_batch=args.rollout_batch,
        micro_batch_size=args.micro_batch, lora_rank=args.lora_rank, dtype=args.dtype,
        remat=args.remat, chip=args.chip,
    )  # fmt: skip
    data, fsdp, tp = mesh_config.axis_sizes(num_devices)
    print(
        report(
            est,
            chip=args.chip,
            mesh_text=f"data={data} fsdp={fsdp} tp={tp} ({num_devices} devices)",
        )
    )
    return 0 if est.fits in (None, True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
