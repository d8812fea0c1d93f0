"""The launcher end to end: gin parsing, run directory, the main job in a reduced form."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _launch(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "pau_jax.launch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
    )


def test_dry_run_prints_the_config_with_overrides(tmp_path):
    proc = _launch(
        "--gin_file=quickstart.gin", "--gin.EpisodeConfig.call_budget=7", "--dry_run", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "EpisodeConfig.call_budget = 7" in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_unknown_gin_file_is_a_one_line_usage_error(tmp_path):
    proc = _launch("--gin_file=nope.gin", cwd=tmp_path)
    assert proc.returncode != 0
    assert "gin file 'nope.gin' not found" in proc.stderr


def test_quickstart_reduced_writes_every_artefact(tmp_path):
    run_dir = tmp_path / "run"
    proc = _launch(
        "--gin_file=quickstart.gin",
        f"--run_dir={run_dir}",
        "--gin.SamplingConfig.max_new_tokens=8",
        "--gin.EpisodeConfig.call_budget=1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"] == 4 and summary["steps"] == 12
    assert summary["lora_modules"] == 14
    records = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in records} == {
        "demo/affine",
        "demo/vowels",
        "demo/runs",
        "demo/sorted",
    }
    assert all(r["n_calls"] == 1 for r in records)
    assert "EpisodeConfig.call_budget = 1" in (run_dir / "config.gin").read_text()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["packages"]["jax"]
    assert (run_dir / "operative_config.gin").read_text().strip()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (run_dir / "checkpoint" / name).exists(), name
    peft_config = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert peft_config["r"] == 4
    assert "[smoke] episodes=4" in proc.stdout
    report = (run_dir / "report.md").read_text()
    assert "| interactive | 4 |" in report and (run_dir / "code_match.png").exists()
    scored = [json.loads(line) for line in (run_dir / "scored.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["code_match"] <= 1.0 for r in scored) and len(scored) == 4


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "gin").glob("*.gin")))
def test_top_level_gin_files_parse(name, tmp_path):
    proc = _launch(f"--gin_file={name}", "--dry_run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
