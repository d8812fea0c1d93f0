"""Sharded train steps and TP sampling on 8 fake CPU devices equal the single-device results.

The checks run in a subprocess (``mesh_checks.py``) because the fake devices must
be configured before JAX is imported; the rest of the suite keeps one device.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def run_checks(*checks: str) -> dict:
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    result = subprocess.run(
        [sys.executable, str(HERE / "mesh_checks.py"), *checks],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["devices"] == 8
    return out["results"]


def assert_same_update(result: dict) -> None:
    assert result["loss"] == pytest.approx(result["reference_loss"], rel=1e-5, abs=1e-6)
    # The step moved the adapters by ~1e-2; the sharded update agrees to float noise.
    assert result["max_lora_change"] > 1e-3
    assert result["max_lora_diff"] < 1e-6, result


def assert_same_tokens(result: dict) -> None:
    assert result["same_tokens"], result["tokens"]
    assert result["max_logprob_diff"] < 1e-4
    assert result["up_proj_spec"] == "P(None, 'tp')"
    assert result["reshard_seconds"] > 0


@pytest.fixture(scope="module")
def fast():
    return run_checks("train:2,2,2", "sample:2", "memory:2,2,2")


def test_train_step_on_a_2x2x2_mesh_equals_one_device(fast):
    result = fast["train:2,2,2"]
    assert_same_update(result)
    # The LoRA state is sharded like the parameters: B over tp, A (and its moments) over fsdp.
    assert result["lora_b_spec"] == "P(None, 'tp')"
    assert result["adam_mu_spec"] == "P('fsdp', None)"


def test_greedy_sampling_with_tp2_equals_unsharded(fast):
    assert_same_tokens(fast["sample:2"])


def test_pure_data_fsdp_and_tp_meshes_and_tp4_sampling_equal_one_device():
    results = run_checks("train:8,1,1", "train:1,8,1", "train:1,1,8", "sample:4")
    for shape in ("8,1,1", "1,8,1", "1,1,8"):
        assert_same_update(results[f"train:{shape}"])
    assert results["train:1,8,1"]["adam_mu_spec"] == "P('fsdp', None)"
    assert results["train:1,1,8"]["lora_b_spec"] == "P(None, 'tp')"
    assert_same_tokens(results["sample:4"])


def test_memory_tool_counts_the_shards_a_device_holds(fast):
    result = fast["memory:2,2,2"]
    assert result["estimated_params"] == result["params"]
    assert result["estimated_lora"] == result["lora"]
