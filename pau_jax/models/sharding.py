"""The logical-axis to mesh-axis rules (the one table of the project) and their use on arrays.

Model code names logical axes only: parameters carry them as ``out_sharding``
metadata and activations pass them to ``constrain``. A rules table maps each
logical name to a mesh axis, a tuple of mesh axes, or None (replicated). Mesh
axes absent from a mesh are ignored, so one table serves ``("data", "fsdp",
"tp")`` meshes and smaller ones alike. ``pau_jax.parallel`` builds meshes and
chooses between the two layouts defined here.

Parameter names: ``vocab`` (V), ``embed`` (D), ``heads`` (N*H), ``kv_heads``
(K*H), ``mlp`` (F), ``head_dim`` (H). Activation names: ``batch`` (B),
``length`` (T or S), ``act_embed``, ``act_heads``, ``act_kv_heads``, ``act_mlp``.
"""

from collections.abc import Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

MeshAxes = str | tuple[str, ...] | None
Rules = Sequence[tuple[str, MeshAxes]]

# Activations: rows over every data-parallel axis, hidden features replicated,
# head and MLP features over the tensor-parallel axis. Shared by both layouts.
_ACTIVATIONS: tuple[tuple[str, MeshAxes], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tp"),
    ("act_kv_heads", "tp"),
    ("act_mlp", "tp"),
)

# Training: parameters split over fsdp along D and over tp along heads/MLP/vocab.
LEARNER_RULES: tuple[tuple[str, MeshAxes], ...] = (
    ("vocab", "tp"),
    ("embed", "fsdp"),
    ("heads", "tp"),
    ("kv_heads", "tp"),
    ("mlp", "tp"),
    ("head_dim", None),
    ("expert", None),
    *_ACTIVATIONS,
)

# Sampling: whole weights on every fsdp device (no per-step all-gathers), tp as above.
SAMPLER_RULES: tuple[tuple[str, MeshAxes], ...] = tuple(
    (name, None if name == "embed" else axes) for name, axes in LEARNER_RULES
)

# The default placement (checkpoint loading): the learner layout.
LOGICAL_RULES = LEARNER_RULES


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def partition_spec(
    axes: Sequence[str | None],
    shape: Sequence[int],
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh,
    rules: Rules = LOGICAL_RULES,
    *,
    strict: bool = True,
) -> PartitionSpec:
    """The PartitionSpec placing an array of ``shape`` with logical ``axes`` on ``mesh``.

    Args:
      axes: one logical name (or None) per dimension.
      shape: the array's shape.
      mesh: a concrete or abstract mesh.
      rules: logical-to-mesh axis rules.
      strict: raise when a dimension does not divide its mesh axes; otherwise
        split it over the longest prefix of them that divides it (possibly none).

    Raises:
      ValueError: a logical name has no rule, a mesh axis would be used twice,
        or (``strict``) a dimension is not divisible by its mesh axis size.
    """
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape, strict=True):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no sharding rule; add it to the rules")
        mesh_axes = [a for a in _as_tuple(table[name]) if a in mesh.shape]
        for axis in mesh_axes:
            if axis in used:
                raise ValueError(f"mesh axis {axis!r} used twice for logical axes {tuple(axes)}")
            used.add(axis)
        while mesh_axes:
            parts = 1
            for axis in mesh_axes:
                parts *= mesh.shape[axis]
            if size % parts == 0:
                break
            if strict:
                raise ValueError(
                    f"dimension {name!r} of size {size} is not divisible by mesh axes "
                    f"{tuple(mesh_axes)} of size {parts}; choose another mesh shape"
                )
            mesh_axes.pop()
        if not mesh_axes:
            spec.append(None)
        else:
            spec.append(mesh_axes[0] if len(mesh_axes) == 1 else tuple(mesh_axes))
    return PartitionSpec(*spec)


def named_sharding(
    axes: Sequence[str | None] | None,
    shape: Sequence[int],
    mesh: jax.sharding.Mesh,
    rules: Rules = LOGICAL_RULES,
    *,
    strict: bool = True,
) -> NamedSharding:
    """A NamedSharding for ``shape`` on ``mesh``; arrays without axis names are replicated."""
    if axes is None:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, partition_spec(axes, shape, mesh, rules, strict=strict))


def constrain(x: jax.Array, axes: Sequence[str | None], rules: Rules = LOGICAL_RULES) -> jax.Array:
    """Constrains an activation's sharding under the current mesh context; a no-op without one.

    Meant for traced code running under ``jax.set_mesh(mesh)``. Dimensions that
    do not divide their mesh axes (e.g. a batch of 1) are replicated.

    Args:
      x: an activation whose dimensions are named by ``axes``.
      axes: one logical name (or None) per dimension of ``x``.
      rules: logical-to-mesh axis rules (the activation entries are shared by both layouts).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(
        x, partition_spec(axes, x.shape, mesh, rules, strict=False)
    )


def mesh_of(tree) -> jax.sharding.Mesh | None:
    """The mesh of the first array in ``tree`` placed by a NamedSharding over >1 device, or None."""
    for leaf in jax.tree.leaves(tree):
        placement = getattr(leaf, "sharding", None)
        if isinstance(placement, NamedSharding) and placement.mesh.size > 1:
            return placement.mesh
    return None
