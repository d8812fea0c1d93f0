"""Two CPU processes joined by jax.distributed on loopback train like one process on the whole batch.

The processes are started by ``launch/local_multiprocess.sh`` (2 processes x 2
fake devices, a (data 1, fsdp 2, tp 2) mesh spanning both), each feeding its
half of the rows through ``jax.make_array_from_process_local_data``.
"""

import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import parallel_testlib as plib
import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("multiprocess")
    env = dict(
        os.environ,
        PORT=str(free_port()),
        LOCAL_DEVICES="2",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / "local_multiprocess.sh"), "2", sys.executable,
         str(HERE / "multiprocess_worker.py"), str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return [dict(np.load(out / f"process_{i}.npz")) for i in range(2)]


def lora_of(npz: dict) -> list[np.ndarray]:
    return [npz[f"arr_{i}"] for i in range(sum(k.startswith("arr_") for k in npz))]


def test_both_processes_see_one_global_batch_and_mesh(outputs):
    for i, out in enumerate(outputs):
        assert int(out["global_devices"]) == 4
        assert bool(out["batch_is_global"])
        assert float(out["mean_process"]) == 0.5
        assert bool(out["primary"]) == (i == 0)


def test_two_processes_end_with_identical_lora_equal_to_one_process(outputs):
    first, second = (lora_of(o) for o in outputs)
    assert len(first) == len(second) > 0
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    losses, reference = plib.train_unsharded(plib.batch_arrays(), steps=2)
    np.testing.assert_allclose(outputs[0]["losses"], losses, rtol=1e-5, atol=1e-6)
    assert losses[1] != losses[0]
    for got, want in zip(first, reference):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
