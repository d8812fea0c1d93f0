"""Maps the models' logical axis names to mesh axes with a small rules table."""

from collections.abc import Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

# Logical axis -> mesh axis (or None to replicate). Mesh axes missing from the
# mesh are ignored, so the same table serves ("fsdp", "tp"), ("data", "tp") ...
LOGICAL_RULES: tuple[tuple[str, str | None], ...] = (
    ("vocab", "tp"),
    ("embed", "fsdp"),
    ("heads", "tp"),
    ("kv_heads", "tp"),
    ("mlp", "tp"),
    ("head_dim", None),
)

Rules = Sequence[tuple[str, str | None]]


def partition_spec(
    axes: Sequence[str | None],
    shape: Sequence[int],
    mesh: jax.sharding.Mesh,
    rules: Rules = LOGICAL_RULES,
) -> PartitionSpec:
    """The PartitionSpec placing an array of ``shape`` with logical ``axes`` on ``mesh``.

    Raises:
      ValueError: a logical name has no rule, a mesh axis would be used twice,
        or a dimension is not divisible by its mesh axis size.
    """
    table = dict(rules)
    spec = []
    for name, size in zip(axes, shape, strict=True):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no sharding rule; add it to the rules")
        mesh_axis = table[name]
        if mesh_axis is None or mesh_axis not in mesh.shape:
            spec.append(None)
            continue
        if mesh_axis in spec:
            raise ValueError(f"mesh axis {mesh_axis!r} used twice for logical axes {tuple(axes)}")
        if size % mesh.shape[mesh_axis]:
            raise ValueError(
                f"dimension {name!r} of size {size} is not divisible by mesh axis "
                f"{mesh_axis!r} of size {mesh.shape[mesh_axis]}; choose another mesh shape"
            )
        spec.append(mesh_axis)
    return PartitionSpec(*spec)


def named_sharding(
    axes: Sequence[str | None] | None,
    shape: Sequence[int],
    mesh: jax.sharding.Mesh,
    rules: Rules = LOGICAL_RULES,
) -> NamedSharding:
    """A NamedSharding for ``shape`` on ``mesh``; arrays without axis names are replicated."""
    if axes is None:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, partition_spec(axes, shape, mesh, rules))
