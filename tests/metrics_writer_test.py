"""MetricsWriter: JSON lines and TensorBoard scalars read back, process 0 only, clear misuse errors."""

import json
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from pau_jax import metrics_writer
from pau_jax.metrics_writer import MetricsWriter


def _read_events(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Scalars of every event file in run_dir, by tag, from the TFRecord framing."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    files = sorted(run_dir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {run_dir}"
    for path in files:
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            payload = data[offset + 12 : offset + 12 + length]
            offset += 12 + length + 4
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_jsonl_and_tensorboard_round_trip(tmp_path):
    steps = {
        1: {
            "train/loss": jnp.float32(0.25),
            "train/tokens": np.int64(12),
            "rollout/reward_mean": 0.5,
            "grpo/kl": np.array([1.5e-3], np.float32),
            "train/finite": True,
            "note": "warmup",
        },
        2: {"train/loss": jnp.asarray(0.125), "rollout/reward_mean": jnp.float32(0.75)},
    }
    with MetricsWriter(tmp_path) as writer:
        for step, metrics in steps.items():
            writer.write(step, metrics)
            # Flushed at once: the line is on disk before close.
            lines = (tmp_path / metrics_writer.METRICS_FILE).read_text().splitlines()
            assert len(lines) == step
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    first = records[0]
    assert first["train/loss"] == 0.25 and isinstance(first["train/loss"], float)
    assert first["train/tokens"] == 12 and isinstance(first["train/tokens"], int)
    assert first["grpo/kl"] == pytest.approx(1.5e-3, rel=1e-6)
    assert first["train/finite"] is True
    assert first["note"] == "warmup"
    assert records[1]["train/loss"] == 0.125
    assert records[0]["time"] <= records[1]["time"]

    scalars = _read_events(tmp_path)
    assert scalars["train/loss"] == [(1, 0.25), (2, 0.125)]
    assert scalars["rollout/reward_mean"] == [(1, 0.5), (2, 0.75)]
    assert scalars["train/tokens"] == [(1, 12.0)]
    assert "note" not in scalars


def test_reopening_appends_and_tensorboard_can_be_off(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(0, {"a": 1.0})
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(1, {"a": 2.0})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["a"] for line in lines] == [1.0, 2.0]
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_only_process_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    run_dir = tmp_path / "run"
    with MetricsWriter(run_dir) as writer:
        assert not writer.active
        writer.write(0, {"train/loss": 1.0})
    assert not run_dir.exists()


def test_misuse_fails_clearly(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    with pytest.raises(ValueError, match=r"'x' has shape \(3,\)"):
        writer.write(0, {"x": np.zeros(3)})
    with pytest.raises(ValueError, match="reserved"):
        writer.write(0, {"step": 1})
    with pytest.raises(ValueError, match="not a number or string"):
        writer.write(0, {"x": object()})
    writer.close()
    with pytest.raises(RuntimeError, match="after close"):
        writer.write(1, {"a": 1.0})
