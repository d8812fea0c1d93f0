"""MetricsWriter: JSON lines and TensorBoard scalars read back, resuming, process 0 only, misuse."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard_events import read_scalars

from pau_jax import metrics_writer
from pau_jax.metrics_writer import MetricsWriter


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

    scalars = read_scalars(tmp_path)
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


def _steps(run_dir) -> list[int]:
    return [row["step"] for row in metrics_writer.read_rows(run_dir)]


def test_resuming_drops_the_rows_and_events_of_lost_steps(tmp_path):
    # A first process logs steps 1-3 and is killed after its checkpoint of step 2.
    with MetricsWriter(tmp_path) as writer:
        for step in (1, 2, 3):
            writer.write(step, {"train/loss": float(step), "note": "first"})
    with MetricsWriter(tmp_path, resume_step=2) as writer:
        assert _steps(tmp_path) == [1, 2]  # Cut when opened, before any new row.
        for step in (3, 4):
            writer.write(step, {"train/loss": 10.0 * step, "note": "second"})
    rows = metrics_writer.read_rows(tmp_path)
    assert [(r["step"], r["train/loss"], r["note"]) for r in rows] == [
        (1, 1.0, "first"),
        (2, 2.0, "first"),
        (3, 30.0, "second"),
        (4, 40.0, "second"),
    ]
    assert read_scalars(tmp_path) == {"train/loss": [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]}
    # Nothing lost: every row and event is kept; the next process adds a file of its own.
    with MetricsWriter(tmp_path, resume_step=4) as writer:
        writer.write(5, {"train/loss": 50.0})
    assert _steps(tmp_path) == [1, 2, 3, 4, 5]
    assert sorted(s for s, _ in read_scalars(tmp_path)["train/loss"]) == [1, 2, 3, 4, 5]
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    # No checkpoint at all: every row goes.
    MetricsWriter(tmp_path, resume_step=0).close()
    assert _steps(tmp_path) == [] and read_scalars(tmp_path) == {}


def test_a_torn_last_row_is_dropped_and_a_broken_one_refused(tmp_path, capsys):
    path = tmp_path / metrics_writer.METRICS_FILE
    path.write_text('{"step": 1, "time": 0.0, "a": 1.0}\n{"step": 2, "time": 0.0, "a"')
    assert _steps(tmp_path) == [1]
    with MetricsWriter(tmp_path, tensorboard=False, resume_step=2) as writer:
        writer.write(2, {"a": 2.0})
    assert "dropped a torn last row" in capsys.readouterr().out
    assert [r["a"] for r in metrics_writer.read_rows(tmp_path)] == [1.0, 2.0]
    path.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not JSON"):
        MetricsWriter(tmp_path, resume_step=1)
    path.write_text('{"loss": 1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1 has no integer 'step'"):
        metrics_writer.read_rows(tmp_path)
