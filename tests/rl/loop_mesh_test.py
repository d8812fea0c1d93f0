"""One tiny step of the AAC loop on a (2, 2, 2) mesh of 8 fake CPU devices equals the one-device step.

The run happens in a subprocess (``loop_mesh_checks.py``) because the fake devices
must be configured before JAX is imported; the rest of the suite keeps one device.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    out = tmp_path_factory.mktemp("loop_mesh")
    proc = subprocess.run(
        [sys.executable, str(HERE / "loop_mesh_checks.py"), str(out), "2,2,2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["devices"] == 8
    return found


def test_loop_step_on_a_2x2x2_mesh_equals_one_device(result):
    single, mesh = result["single"], result["mesh"]
    # The same episodes were played (sampling in the sampler layout gave the same tokens) ...
    for key in ("rollout/reward_mean", "rollout/steps", "train/tokens", "train/batch_length"):
        assert mesh[key] == single[key], key
    # ... and the update agrees to float noise. (All completions are truncated at the same
    # length, so the first on-policy token-mean loss is the mean advantage, ~0 in both runs;
    # the gradient and the adapters carry the comparison.)
    assert mesh["train/loss"] == pytest.approx(single["train/loss"], abs=1e-6)
    assert single["train/grad_norm"] > 1e-3
    assert mesh["train/grad_norm"] == pytest.approx(single["train/grad_norm"], rel=1e-5)
    assert mesh["train/update_norm"] == pytest.approx(single["train/update_norm"], rel=1e-5)
    assert result["max_lora_b"] > 1e-3 and result["max_adapter_diff"] < 1e-6
    # fsdp > 1 shards D only in the learner layout: the model was moved both ways and timed.
    assert mesh["time/reshard_s"] > 0 and "time/reshard_s" not in single
