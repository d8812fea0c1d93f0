"""Device meshes, the learner and sampler layouts, placement of models and batches, and multi-host start-up.

    parallel.initialize_distributed()                        # first, before any JAX computation
    mesh = parallel.make_mesh(parallel.MeshConfig(fsdp=-1, tp=2))
    model, _ = qwen3.load_hf(path, mesh=mesh)                # learner layout
    lora.apply_lora(model, ...); parallel.shard_model(model, mesh)
    state = parallel.shard_state(learner.init_state(model, config), mesh)
    step = learner.make_train_step(model, config, **parallel.train_step_shardings(model, state, mesh))
    state, metrics = step(state, parallel.shard_batch(local_batch, mesh))
    seconds = parallel.reshard(model, mesh, parallel.SAMPLER_RULES)   # weights for rollouts

The mesh axes are ``data`` (replicas), ``fsdp`` (replicas for the batch,
parameter shards along D for training) and ``tp`` (heads, MLP and vocabulary).
The rules tables themselves live in ``pau_jax.models.sharding`` (model code
needs them); they are re-exported here.
"""

import dataclasses
import logging
import math
import os
import time
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from pau_jax.models.sharding import (
    LEARNER_RULES,
    LOGICAL_RULES,
    SAMPLER_RULES,
    Rules,
    named_sharding,
    partition_spec,
)

__all__ = [
    "LAYOUTS",
    "LEARNER_RULES",
    "LOGICAL_RULES",
    "MESH_AXES",
    "MeshConfig",
    "SAMPLER_RULES",
    "Rules",
    "batch_sharding",
    "gather",
    "initialize_distributed",
    "is_primary",
    "make_mesh",
    "mean_metrics",
    "named_sharding",
    "partition_spec",
    "process_split",
    "reshard",
    "shard_batch",
    "shard_model",
    "shard_state",
    "train_step_shardings",
    "tree_shardings",
]

MESH_AXES = ("data", "fsdp", "tp")
LAYOUTS: dict[str, Rules] = {"learner": LEARNER_RULES, "sampler": SAMPLER_RULES}

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Sizes of the ``data``, ``fsdp`` and ``tp`` mesh axes; one of them may be -1 (the rest).

    Attributes:
      data: pure data-parallel replicas.
      fsdp: data-parallel devices that also split the parameters along D (learner layout).
      tp: tensor-parallel devices (attention heads, MLP and vocabulary).
    """

    data: int = 1
    fsdp: int = -1
    tp: int = 1

    def __post_init__(self):
        sizes = dataclasses.asdict(self)
        for name, size in sizes.items():
            if size != -1 and size < 1:
                raise ValueError(f"MeshConfig.{name} must be >= 1 or -1 (the rest), got {size}")
        if list(sizes.values()).count(-1) > 1:
            raise ValueError(f"at most one MeshConfig size may be -1, got {self}")

    def axis_sizes(self, num_devices: int) -> tuple[int, int, int]:
        """(data, fsdp, tp) for ``num_devices`` devices, with -1 filled in.

        Raises:
          ValueError: the sizes do not divide or do not use all ``num_devices``.
        """
        sizes = [self.data, self.fsdp, self.tp]
        fixed = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % fixed:
                raise ValueError(
                    f"{self} needs a multiple of {fixed} devices, but there are {num_devices}; "
                    "change the fixed sizes"
                )
            sizes[sizes.index(-1)] = num_devices // fixed
        elif fixed != num_devices:
            raise ValueError(
                f"{self} uses {fixed} devices, but there are {num_devices}; "
                "make the sizes multiply to the device count or set one to -1"
            )
        return tuple(sizes)


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """A ``(data, fsdp, tp)`` mesh (Auto axis types) over ``devices`` (default: all devices)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = config.axis_sizes(len(devices))
    return jax.make_mesh(
        shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices
    )


def _is_variable(x) -> bool:
    """An ``nnx.Variable`` of one array, placed by its logical axes. A variable that holds a
    pytree (``models.quantization.DecodeWeight``, the sampler's 8-bit copy, made on one
    device only) is not one: its arrays are placed as plain arrays, or left where they are."""
    return isinstance(x, nnx.Variable) and hasattr(x.get_value(), "shape")


def tree_shardings(tree, mesh: jax.sharding.Mesh, rules: Rules = LEARNER_RULES):
    """Shardings mirroring ``tree``: each ``nnx.Variable`` by its logical axes, other arrays replicated.

    Works on model states, train states (optimizer moments keep their
    parameters' metadata) and abstract trees; the result is a valid
    ``in_shardings``/``out_shardings`` prefix for ``jax.jit``.
    """

    def one(x):
        if _is_variable(x):
            return named_sharding(x.get_metadata().get("out_sharding"), x.shape, mesh, rules)
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, tree, is_leaf=_is_variable)


def _place(value, placement: NamedSharding) -> jax.Array:
    """``value`` in ``placement``; across processes every process must pass the same value."""
    if jax.process_count() == 1:
        return jax.device_put(value, placement)
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return jax.device_put(value, placement)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, placement, lambda index: host[index])


def shard_state(tree, mesh: jax.sharding.Mesh, rules: Rules = LEARNER_RULES):
    """A copy of a pytree (e.g. ``learner.TrainState``) placed by ``tree_shardings``."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(x):
        if _is_variable(x):
            axes = x.get_metadata().get("out_sharding")
            return x.replace(_place(x[...], named_sharding(axes, x.shape, mesh, rules)))
        return _place(x, replicated)

    return jax.tree.map(one, tree, is_leaf=_is_variable)


def shard_model(
    model: nnx.Module, mesh: jax.sharding.Mesh, rules: Rules = LEARNER_RULES
) -> nnx.Module:
    """Places every array of ``model`` (base weights and LoRA) by its logical axes, in place.

    Returns:
      The same model, for chaining.
    """
    for _, var in nnx.iter_graph(model):
        if _is_variable(var):
            placement = named_sharding(
                var.get_metadata().get("out_sharding"), var.shape, mesh, rules
            )
            var.set_value(_place(var[...], placement))
    return model


def reshard(model: nnx.Module, mesh: jax.sharding.Mesh, rules: Rules) -> float:
    """Moves a model into another layout (e.g. learner -> sampler) in place and times it.

    Arrays already in their target sharding are not copied. The time includes
    the transfers (it waits for them) and is logged.

    Returns:
      Seconds the move took.
    """
    start = time.perf_counter()
    shard_model(model, mesh, rules)
    jax.block_until_ready(nnx.state(model))
    seconds = time.perf_counter() - start
    _log.info("resharded the model in %.3f s", seconds)
    return seconds


def batch_sharding(mesh: jax.sharding.Mesh, rules: Rules = LEARNER_RULES) -> NamedSharding:
    """Rows (the leading dimension) over the mesh axes of the logical ``batch`` axis."""
    axes = tuple(a for a in _batch_axes(rules) if a in mesh.shape)
    return NamedSharding(mesh, PartitionSpec(axes or None))


def _batch_axes(rules: Rules) -> tuple[str, ...]:
    axes = dict(rules).get("batch")
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def shard_batch(tree, mesh: jax.sharding.Mesh, rules: Rules = LEARNER_RULES):
    """Places host arrays (e.g. a ``learner.Batch``) with their rows split by ``batch_sharding``.

    In a multi-process run each process passes its own rows and the global
    batch is their concatenation in process order
    (``jax.make_array_from_process_local_data``).

    Raises:
      ValueError: the global row count does not divide the batch mesh axes.
    """
    placement = batch_sharding(mesh, rules)
    parts = math.prod(mesh.shape[a] for a in placement.spec[0] or ())

    def one(x):
        x = np.asarray(x)
        rows = x.shape[0] * jax.process_count()
        if rows % parts:
            raise ValueError(
                f"a batch of {rows} rows cannot be split over {parts} data-parallel devices; "
                f"pad it to a multiple of {parts}"
            )
        if jax.process_count() == 1:
            return jax.device_put(x, placement)
        return jax.make_array_from_process_local_data(placement, x)

    return jax.tree.map(one, tree)


def train_step_shardings(
    model: nnx.Module, state, mesh: jax.sharding.Mesh, rules: Rules = LEARNER_RULES
) -> dict:
    """Keyword arguments for ``training.step.make_train_step``: in/out shardings from the rules, and the mesh.

    The base weights follow their logical axes, the train state is sharded like
    the LoRA parameters (optimizer moments share their metadata), the batch is
    split over the ``batch`` mesh axes and the metrics are replicated.

    Args:
      model: the model with LoRA adapters (already placed by ``shard_model``).
      state: its ``learner.TrainState`` (real or abstract).
      mesh: the mesh.
      rules: the learner layout by default.
    """
    base = nnx.state(model, nnx.Not(nnx.LoRAParam))
    state_shardings = tree_shardings(state, mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    return {
        "in_shardings": (
            tree_shardings(base, mesh, rules),
            state_shardings,
            batch_sharding(mesh, rules),
        ),
        "out_shardings": (state_shardings, replicated),
        "mesh": mesh,
    }


# Environment variables of an explicitly configured multi-process run; PAU_DISTRIBUTED=auto
# asks JAX to detect the cluster itself (set by launch/tpu_pod.sh and launch/slurm_gpu.sbatch).
AUTO_ENV = "PAU_DISTRIBUTED"
COORDINATOR_ENV = "PAU_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "PAU_NUM_PROCESSES"
PROCESS_ID_ENV = "PAU_PROCESS_ID"


def _detected_cluster() -> str | None:
    """The multi-process environment JAX can configure itself from, if any."""
    if os.environ.get(AUTO_ENV) == "auto":
        return "requested"
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ:
        return "SLURM"
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if len([h for h in hosts.split(",") if h]) > 1:
        return "TPU pod"
    if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return "Open MPI"
    return None


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: Sequence[int] | None = None,
) -> bool:
    """Joins the processes of a multi-process run with ``jax.distributed.initialize``.

    Explicit arguments win, then ``PAU_COORDINATOR_ADDRESS``/``PAU_NUM_PROCESSES``/
    ``PAU_PROCESS_ID``; otherwise ``PAU_DISTRIBUTED=auto``, SLURM (``srun``), TPU
    pods and Open MPI are detected from their environment and JAX reads the
    rest itself (coordinator, process count and id). A single
    process (none of these) is left alone. Call it before any JAX computation.

    Returns:
      True if ``jax.distributed`` was initialised.

    Raises:
      ValueError: only some of coordinator address, process count and id are given.
    """
    coordinator_address = coordinator_address or os.environ.get(COORDINATOR_ENV)
    if num_processes is None and NUM_PROCESSES_ENV in os.environ:
        num_processes = int(os.environ[NUM_PROCESSES_ENV])
    if process_id is None and PROCESS_ID_ENV in os.environ:
        process_id = int(os.environ[PROCESS_ID_ENV])
    explicit = (coordinator_address, num_processes, process_id)
    if any(v is not None for v in explicit):
        if any(v is None for v in explicit):
            raise ValueError(
                "a multi-process run needs the coordinator address, process count and process "
                f"id together (got {explicit}); set {COORDINATOR_ENV}, {NUM_PROCESSES_ENV} and "
                f"{PROCESS_ID_ENV}"
            )
        if num_processes == 1:
            return False
        jax.distributed.initialize(
            coordinator_address,
            num_processes,
            process_id,
            local_device_ids=local_device_ids,
        )
    elif _detected_cluster() is not None:
        jax.distributed.initialize(local_device_ids=local_device_ids)
    else:
        return False
    _log.info(
        "process %d of %d joined; %d local and %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True


def is_primary() -> bool:
    """True on process 0, the one that writes logs, checkpoints and reports."""
    return jax.process_index() == 0


def process_split(items: Sequence, *, index: int | None = None, count: int | None = None) -> list:
    """This process's contiguous share of ``items`` (sizes differ by at most one).

    Args:
      items: e.g. the episodes (or GRPO groups) of a round, in the same order on every process.
      index: process index (default ``jax.process_index()``).
      count: process count (default ``jax.process_count()``).
    """
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    if not 0 <= index < count:
        raise ValueError(f"process index {index} is outside [0, {count})")
    base, extra = divmod(len(items), count)
    start = index * base + min(index, extra)
    return list(items[start : start + base + (index < extra)])


def gather(tree):
    """Every process's arrays stacked on a new leading axis [P, ...] (numpy, on every process).

    Each process must pass arrays of the same shapes (pad per-process rewards first).
    """
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: np.asarray(x)[None], tree)
    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree))


def mean_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Scalar metrics averaged over processes (identical on every process)."""
    stacked = gather({k: np.asarray(v, np.float64) for k, v in metrics.items()})
    return {k: float(np.mean(v)) for k, v in stacked.items()}


def barrier(name: str) -> None:
    """Waits for every process of a multi-process run (no-op in a single process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def pad_to_largest_batch(batch):
    """Pads this process's [B, T] batch arrays to the largest B and T of any process.

    Rows are added at the end, columns on the left (left padding); the padding is
    zeros, so added rows have an all-zero loss mask. A no-op in a single process.
    """
    if jax.process_count() == 1:
        return batch
    if getattr(batch, "mask_table", None) is not None:
        raise ValueError(
            "masked rollouts (RolloutConfig.sampling.structured 'constrain_inputs' or "
            "'typed_inputs') train in one process for now; use 'end_at_answer' or 'off' "
            "across hosts"
        )
    rows, length = (int(v) for v in gather(np.asarray(batch.input_ids.shape)).max(0))

    def pad(x):
        x = np.asarray(x)
        widths = [(0, rows - x.shape[0])] + [(length - x.shape[1], 0)] * (x.ndim - 1)
        return np.pad(x, widths)

    return jax.tree.map(pad, batch)


def layouts_differ(model: nnx.Module, mesh: jax.sharding.Mesh) -> bool:
    """Whether any array of the model lies differently in the learner and sampler layouts."""
    for _, var in nnx.iter_graph(model):
        if _is_variable(var):
            axes = var.get_metadata().get("out_sharding")
            learn = named_sharding(axes, var.shape, mesh, LEARNER_RULES)
            sample = named_sharding(axes, var.shape, mesh, SAMPLER_RULES)
            if not learn.is_equivalent_to(sample, len(var.shape)):
                return True
    return False
