"""Mesh sizes, rules tables, layouts, multi-host helpers and mesh gin files on one device."""

import importlib.util  # noqa: F401  (gin-config needs it before parsing)
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from pau_jax import parallel
from pau_jax.models import sharding

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "config, devices, sizes",
    [
        (parallel.MeshConfig(), 8, (1, 8, 1)),
        (parallel.MeshConfig(data=2, fsdp=-1, tp=2), 8, (2, 2, 2)),
        (parallel.MeshConfig(data=-1, fsdp=1, tp=4), 8, (2, 1, 4)),
        (parallel.MeshConfig(data=1, fsdp=1, tp=1), 1, (1, 1, 1)),
    ],
)
def test_mesh_sizes_fill_the_rest(config, devices, sizes):
    assert config.axis_sizes(devices) == sizes


def test_mesh_sizes_that_do_not_fit_the_devices_fail_clearly():
    with pytest.raises(ValueError, match="needs a multiple of 3 devices, but there are 8"):
        parallel.MeshConfig(data=3, fsdp=-1).axis_sizes(8)
    with pytest.raises(ValueError, match="uses 4 devices, but there are 8"):
        parallel.MeshConfig(data=2, fsdp=2, tp=1).axis_sizes(8)
    with pytest.raises(ValueError, match="at most one"):
        parallel.MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="tp must be >= 1"):
        parallel.MeshConfig(tp=0)


def test_make_mesh_on_one_device():
    mesh = parallel.make_mesh(parallel.MeshConfig())
    assert mesh.axis_names == parallel.MESH_AXES
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tp": 1}
    with pytest.raises(ValueError, match="uses 2 devices"):
        parallel.make_mesh(parallel.MeshConfig(data=2, fsdp=1))


def test_one_rules_table_two_layouts():
    assert parallel.LOGICAL_RULES is sharding.LOGICAL_RULES is parallel.LEARNER_RULES
    assert parallel.LAYOUTS["sampler"] is sharding.SAMPLER_RULES
    mesh = AbstractMesh((2, 2, 2), parallel.MESH_AXES)
    kernel = (("embed", "mlp"), (64, 96))
    assert parallel.partition_spec(*kernel, mesh) == PartitionSpec("fsdp", "tp")
    assert parallel.partition_spec(*kernel, mesh, parallel.SAMPLER_RULES) == PartitionSpec(
        None, "tp"
    )
    rows = parallel.partition_spec(("batch", "length", "act_embed"), (8, 5, 64), mesh)
    assert rows == PartitionSpec(("data", "fsdp"), None, None)


def test_activation_rules_fall_back_to_fewer_axes_when_not_strict():
    mesh = AbstractMesh((2, 2, 2), parallel.MESH_AXES)
    axes = ("batch", "length", "act_heads")
    assert sharding.partition_spec(axes, (2, 5, 6), mesh, strict=False) == PartitionSpec(
        "data", None, "tp"
    )
    assert sharding.partition_spec(axes, (1, 5, 3), mesh, strict=False) == PartitionSpec(
        None, None, None
    )
    with pytest.raises(ValueError, match="not divisible by mesh axes"):
        sharding.partition_spec(axes, (2, 5, 6), mesh)


def test_constrain_is_a_no_op_without_a_mesh():
    x = jnp.arange(12.0).reshape(2, 2, 3)
    out = jax.jit(lambda v: sharding.constrain(v, ("batch", "length", "act_embed")))(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
    assert "sharding_constraint" not in str(
        jax.make_jaxpr(lambda v: sharding.constrain(v, ("batch", "length", "act_embed")))(x)
    )


def test_shard_batch_rejects_rows_that_do_not_split():
    mesh = parallel.make_mesh(parallel.MeshConfig())
    placed = parallel.shard_batch({"ids": np.ones((3, 4), np.int32)}, mesh)
    assert placed["ids"].shape == (3, 4)
    assert parallel.batch_sharding(mesh).spec == PartitionSpec(("data", "fsdp"))


def test_process_split_is_contiguous_and_covers_everything():
    items = list(range(10))
    parts = [parallel.process_split(items, index=i, count=3) for i in range(3)]
    assert parts == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert parallel.process_split(items) == items
    with pytest.raises(ValueError, match="outside"):
        parallel.process_split(items, index=3, count=3)


def test_single_process_helpers():
    assert parallel.is_primary()
    gathered = parallel.gather({"reward": np.array([1.0, 2.0])})
    np.testing.assert_array_equal(gathered["reward"], [[1.0, 2.0]])
    assert parallel.mean_metrics({"rollout/reward_mean": 0.25}) == {"rollout/reward_mean": 0.25}


def test_initialize_distributed_leaves_a_single_process_alone(monkeypatch):
    for name in ("PAU_COORDINATOR_ADDRESS", "PAU_NUM_PROCESSES", "PAU_PROCESS_ID",
                 "PAU_DISTRIBUTED", "SLURM_NTASKS", "TPU_WORKER_HOSTNAMES",
                 "OMPI_COMM_WORLD_SIZE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    assert parallel.initialize_distributed() is False
    assert parallel.initialize_distributed("localhost:1234", 1, 0) is False
    monkeypatch.setenv("PAU_NUM_PROCESSES", "2")
    with pytest.raises(ValueError, match="together"):
        parallel.initialize_distributed()


@pytest.mark.parametrize(
    "path", sorted((ROOT / "gin" / "mesh").glob("*.gin")), ids=lambda p: p.stem
)
def test_mesh_gin_files_bind_mesh_config(path):
    import gin

    expected = {
        "single": (1, 1, 1),
        "data8": (8, 1, 1),
        "fsdp8": (1, 8, 1),
        "tp8": (1, 1, 8),
        "fsdp2_tp2_data2": (2, 2, 2),
    }[path.stem]
    from pau_jax import experiment

    experiment.register_configurables()
    gin.clear_config()
    try:
        gin.parse_config_file(str(path))
        config = gin.get_configurable("pau_jax.parallel.MeshConfig")()
    finally:
        gin.clear_config()
    assert isinstance(config, parallel.MeshConfig)
    assert config.axis_sizes(int(np.prod(expected))) == expected
