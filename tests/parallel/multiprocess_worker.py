"""One of two processes joined by jax.distributed: two sharded train steps on a global batch.

    LOCAL_DEVICES=2 launch/local_multiprocess.sh 2 python multiprocess_worker.py OUT_DIR

Each process contributes its half of the rows; the LoRA state ends up in
``OUT_DIR/process_<i>.npz`` (gathered to full arrays) with the losses and checks.
"""

import pathlib
import sys

from pau_jax import parallel

assert parallel.initialize_distributed(), "PAU_* variables are missing; use local_multiprocess.sh"

import jax  # noqa: E402
import numpy as np  # noqa: E402
import parallel_testlib as plib  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402


def main(out_dir: pathlib.Path) -> None:
    index = jax.process_index()
    mesh = parallel.make_mesh(parallel.MeshConfig(data=1, fsdp=2, tp=2))
    arrays = plib.batch_arrays()
    rows = parallel.process_split(range(plib.ROWS))
    local = {k: v[rows[0] : rows[-1] + 1] for k, v in arrays.items()}
    global_ids = multihost_utils.process_allgather(
        parallel.shard_batch(local["input_ids"], mesh), tiled=True
    )
    losses, state = plib.train_on_mesh(mesh, local, steps=2)
    lora = [
        np.asarray(multihost_utils.process_allgather(x, tiled=True))
        for x in jax.tree.leaves(state.lora)
    ]
    metrics = parallel.mean_metrics({"process": float(index)})
    np.savez(
        out_dir / f"process_{index}.npz",
        *lora,
        losses=np.asarray(losses),
        batch_is_global=np.asarray(np.array_equal(global_ids, arrays["input_ids"])),
        mean_process=np.asarray(metrics["process"]),
        primary=np.asarray(parallel.is_primary()),
        global_devices=np.asarray(jax.device_count()),
    )


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
