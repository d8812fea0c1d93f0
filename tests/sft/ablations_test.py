"""The SFT ablations (DISTILL, CodeARC-SFT) as gin overlays on aac.gin: parse, run tiny, resume."""

import json
import pathlib

import launching
import numpy as np
import pytest
import safetensors.numpy

from pau_jax.sft import teacher
from pau_jax.tasks import demo as demo_tasks

ROOT = pathlib.Path(__file__).resolve().parents[2]
ORACLE = "--gin.pau_jax.experiment.distill.teacher=@pau_jax.policy.backends.OracleBackendConfig()"


def _records(run_dir):
    lines = (run_dir / "teacher_episodes.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _lora_b_norm(run_dir) -> float:
    tensors = safetensors.numpy.load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
    b = [v for k, v in tensors.items() if k.endswith("lora_B.weight")]
    assert len(b) == 14  # 2 layers x 7 linear modules
    return float(np.sqrt(sum(np.sum(np.square(x)) for x in b)))


def _sft_metrics(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if "sft/loss" in m]


@pytest.mark.parametrize("overlay", ["distill", "codearc_sft"])
def test_sft_overlays_parse(overlay, tmp_path):
    files = ["aac.gin", f"ablations/{overlay}.gin", "debug/local_tiny.gin"]
    proc = launching.launch(
        *(f"--gin_file={f}" for f in files), "--gin.TEACHER='self'", "--dry_run", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "distill.sft_config = @pau_jax.sft.trainer.SFTConfig()" in out
    assert "run_mode = 'distill'" in out
    assert "SFTConfig.batch_size = 4" in out  # local_tiny.gin, parsed last, wins
    assert f"distill.privileged = {overlay == 'codearc_sft'}" in out
    # Without the tiny overlay: the paper-scale settings of the ablation itself.
    proc = launching.launch("--gin_file=aac.gin", f"--gin_file=ablations/{overlay}.gin",
                            "--gin.TEACHER='self'", *launching.dry_run_inputs(tmp_path),
                            "--dry_run", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SFTConfig.epochs = 5" in proc.stdout and "T_MAX = 40" in proc.stdout


def test_distill_with_the_oracle_teacher_trains_the_adapter_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    args = ("--gin_file=aac.gin", "--gin_file=ablations/distill.gin",
            "--gin_file=debug/local_tiny.gin", ORACLE, f"--run_dir={run_dir}")  # fmt: skip
    proc = launching.launch(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = _records(run_dir)
    assert sorted(r["task_id"] for r in records) == sorted(t.task_id for t in demo_tasks.DEMO_TASKS)
    # The oracle probes, then states the source: every episode ends with a parsed hypothesis.
    assert all(r["n_calls"] >= 1 and r["prediction"] for r in records)
    pairs = sum(len(r["steps"]) for r in records)
    metrics = _sft_metrics(run_dir)
    assert len(metrics) == 2 * -(-pairs // 4)  # 2 epochs of batches of 4 pairs
    assert all(np.isfinite(m["sft/loss"]) and m["sft/tokens"] > 0 for m in metrics)
    assert _lora_b_norm(run_dir) > 0  # B starts at zero: the adapter moved
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == "sft" and summary["steps"] == len(metrics)
    assert summary["teacher"] == "OraclePolicy" and summary["self_distillation"] is False
    assert (run_dir / "checkpoints" / str(len(metrics))).is_dir()
    assert "critic/requested" not in (run_dir / "metrics.jsonl").read_text()  # no GRPO
    # A rerun restores the finished SFT instead of collecting or training again.
    proc = launching.launch(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "already trained" in proc.stdout
    assert len(_records(run_dir)) == len(records) and len(_sft_metrics(run_dir)) == len(metrics)


def test_codearc_sft_teacher_knows_the_answer_and_records_do_not(tmp_path):
    run_dir = tmp_path / "run"
    proc = launching.launch(
        "--gin_file=aac.gin",
        "--gin_file=ablations/codearc_sft.gin",
        "--gin_file=debug/local_tiny.gin",
        "--gin.pau_jax.experiment.distill.show_code=True",
        "--gin.TEACHER='self'",
        f"--run_dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = _records(run_dir)
    assert len(records) == len(demo_tasks.DEMO_TASKS)
    prompts = json.dumps([s["messages"] for r in records for s in r["steps"]])
    assert teacher.PRIVILEGED_HEADER not in prompts and "What the function does" not in prompts
    for task in demo_tasks.DEMO_TASKS:
        assert task.description not in prompts
        assert task.code.strip() not in prompts
    assert _sft_metrics(run_dir) and _lora_b_norm(run_dir) > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["teacher"] == "PrivilegedTeacher(LocalPolicy)"
    assert summary["self_distillation"] is True
    assert "SELF-DISTILLATION" in proc.stdout


@pytest.mark.parametrize("overlay", ["distill", "codearc_sft"])
def test_an_sft_ablation_without_a_teacher_refuses_to_start(overlay, tmp_path):
    run_dir = tmp_path / "run"
    proc = launching.launch(
        "--gin_file=aac.gin",
        f"--gin_file=ablations/{overlay}.gin",
        "--gin_file=debug/local_tiny.gin",
        f"--run_dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "needs a teacher" in proc.stderr and "TEACHER" in proc.stderr
    assert not (run_dir / "teacher_episodes.jsonl").exists()
