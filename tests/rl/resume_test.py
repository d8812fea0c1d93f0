"""A run killed with SIGKILL resumes cleanly: steps logged once, a whole base model, its summary.

The kill tests start a tiny training in a fresh interpreter (``tiny_training.py``),
``kill -9`` it at a seeded random point and resume it in another one (which
loads the programs the first compiled from a shared compilation cache).
"""

import json
import random
import time

import checkpoints
import pytest
import tiny_training
from tensorboard_events import read_scalars

from pau_jax import metrics_writer, models
from pau_jax.rl import loop
from pau_jax.training import artefacts

STEPS = 6


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("xla_cache")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "base_model"
    models.random_checkpoint(checkpoints.tiny_qwen3_config(), path, seed=tiny_training.SEED)
    return str(path)


def _rows(run_dir) -> list[dict]:
    return metrics_writer.read_rows(run_dir)


def test_steps_are_logged_once_after_a_kill_9(base, cache, tmp_path):
    # Killed once the row of a step after a checkpoint (not itself one) is written: lost steps.
    every = tiny_training.CHECKPOINT_EVERY
    kill_at = random.Random(20240601).choice([s for s in range(every + 1, STEPS) if s % every])
    run_dir = tmp_path / "run"

    def logged():
        return any(row["step"] == kill_at for row in _rows(run_dir))

    args = [str(run_dir), str(STEPS), base]
    tiny_training.kill_when(args, logged, log=tmp_path / "killed.log", cache=cache)
    killed_at = time.time()
    lost = [row for row in _rows(run_dir) if row["step"] == kill_at]
    restored = kill_at - kill_at % every
    assert [row["step"] for row in _rows(run_dir)] == list(range(1, kill_at + 1))

    out = tiny_training.run(args, log=tmp_path / "resumed.log", cache=cache)
    assert f"resuming from step {restored} " in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS
    rows = _rows(run_dir)
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    # The steps after the checkpoint were taken again (same numbers), the rest kept.
    assert all(row["time"] > killed_at for row in rows[restored:])
    assert all(row["time"] < killed_at for row in rows[:restored])
    for key in ("train/loss", "rollout/reward_mean", "train/tokens"):  # The same step again.
        assert rows[kill_at - 1][key] == pytest.approx(lost[0][key], rel=1e-6, abs=1e-9), key
    scalars = read_scalars(run_dir)
    for tag in ("train/loss", "rollout/reward_mean", "time/update_seconds"):
        assert sorted(step for step, _ in scalars[tag]) == list(range(1, STEPS + 1)), tag
    for step, value in scalars["train/loss"]:
        assert value == pytest.approx(rows[step - 1]["train/loss"], rel=1e-6)
    assert summary["last_metrics"]["train/loss"] == rows[-1]["train/loss"]


def test_a_kill_9_while_the_base_model_is_written_leaves_a_run_that_restarts(cache, tmp_path):
    # Killed as soon as a file of the random base model appears, wherever it is written.
    name = random.Random(7).choice(["model.safetensors", "config.json"])
    run_dir = tmp_path / "run"

    def writing():
        return any(run_dir.glob(f"*base_model*/{name}"))

    args = [str(run_dir), "1"]
    tiny_training.kill_when(args, writing, log=tmp_path / "killed.log", cache=cache)
    tiny_training.run(args, log=tmp_path / "restarted.log", cache=cache)
    assert [row["step"] for row in _rows(run_dir)] == [1]
    assert artefacts.base_model_problem(run_dir / "base_model") is None
    assert sorted(p.name for p in run_dir.iterdir() if "base_model" in p.name) == ["base_model"]


def test_a_rerun_of_a_finished_run_keeps_its_summary_and_rows(base, tmp_path):
    run_dir = tmp_path / "run"
    settings = dict(tiny_training.settings(base), eval_every=1, eval_fn=lambda **_: {"score": 0.5})
    first = loop.train(run_dir=str(run_dir), steps=1, **settings)
    written = json.loads((run_dir / "summary.json").read_text())
    assert first["last_metrics"] and "train/loss" in first["last_metrics"]
    again = loop.train(run_dir=str(run_dir), steps=1, **settings)
    assert again["last_metrics"] == first["last_metrics"]
    rerun = json.loads((run_dir / "summary.json").read_text())
    assert rerun["last_metrics"] == written["last_metrics"] == first["last_metrics"]
    # One row per step, training and evaluation metrics together.
    rows = _rows(run_dir)
    assert [row["step"] for row in rows] == [1] and rows[0]["eval/score"] == 0.5
    assert rows[0]["train/loss"] == first["last_metrics"]["train/loss"]
