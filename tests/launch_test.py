"""The launcher end to end: gin parsing, run directory, the main job (quickstart) in a reduced form."""

import json
import pathlib
import struct

import launching
import pytest
import safetensors.numpy
from tensorboardX.proto import event_pb2

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The quickstart with every stage, at the smallest sizes: 3 tasks, 1 call per episode, one
# AAC step of 1 task x 2 episodes of at most 3 phases.
REDUCED = (
    "--gin.pau_jax.experiment.quickstart.eval_limit=3",
    "--gin.EVAL_CALL_BUDGET=1",
    "--gin.agent/pau_jax.policy.config.SamplingConfig.max_new_tokens=8",
    "--gin.judge/pau_jax.policy.config.SamplingConfig.max_new_tokens=8",
    "--gin.pau_jax.experiment.quickstart.bootstrap_resamples=200",
    "--gin.T_MAX=3",
    "--gin.pau_jax.env.episode.EpisodeConfig.call_budget=1",
    "--gin.pau_jax.rl.rollout.RolloutConfig.tasks_per_batch=1",
    "--gin.pau_jax.rl.rollout.RolloutConfig.group_size=2",
    "--gin.rollout/pau_jax.policy.config.SamplingConfig.max_new_tokens=6",
    "--gin.critic/pau_jax.policy.config.SamplingConfig.max_new_tokens=4",
    "--gin.pau_jax.experiment.train.steps=1",
)


def _event_tags(folder: pathlib.Path) -> dict[str, list[int]]:
    """Scalar tags -> steps of every TensorBoard event file in `folder` (TFRecord framing)."""
    tags: dict[str, list[int]] = {}
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event file in {folder}"
    for path in files:
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    return tags


def _jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_dry_run_prints_the_config_with_overrides(tmp_path):
    proc = launching.launch(
        "--gin_file=quickstart.gin",
        "--gin.EVAL_CALL_BUDGET=7",
        "--gin.pau_jax.experiment.train.steps=9",
        "--dry_run",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "EVAL_CALL_BUDGET = 7" in proc.stdout and "train.steps = 9" in proc.stdout
    assert "run_defaults.run_mode = 'quickstart'" in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_unknown_gin_file_is_a_one_line_usage_error(tmp_path):
    proc = launching.launch("--gin_file=nope.gin", cwd=tmp_path)
    assert proc.returncode != 0
    assert "gin file 'nope.gin' not found" in proc.stderr


def test_quickstart_reduced_writes_every_artefact(tmp_path):
    run_dir, data_dir = tmp_path / "run", tmp_path / "tfds"
    proc = launching.launch(
        "--gin_file=quickstart.gin",
        f"--run_dir={run_dir}",
        f"--gin.DATA_DIR='{data_dir}'",
        *REDUCED,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for n in range(1, 6):
        assert f"[quickstart] {n}/5" in out, n
    assert out.rstrip().splitlines()[-1] == f"[quickstart] report: {run_dir / 'report.md'}"
    assert "[train] step 1/1" in out

    # The dataset was built where asked; what launch records about the run.
    assert (data_dir / "pau" / "debug").is_dir()
    config = (run_dir / "config.gin").read_text()
    assert "EVAL_CALL_BUDGET = 1" in config and "train.steps = 1" in config
    assert json.loads((run_dir / "run_info.json").read_text())["packages"]["jax"]
    assert "quickstart.eval_limit = 3" in (run_dir / "operative_config.gin").read_text()
    # Compiled programs went to the persistent cache the launcher points JAX at.
    assert any((tmp_path / "xla_cache").iterdir())

    # The base checkpoint in the Hugging Face layout, with the real tokenizer.
    hf_config = json.loads((run_dir / "checkpoint" / "config.json").read_text())
    assert hf_config["vocab_size"] == 151936 and hf_config["num_hidden_layers"] == 2
    assert (run_dir / "checkpoint" / "tokenizer.json").exists()
    assert safetensors.numpy.load_file(str(run_dir / "checkpoint" / "model.safetensors"))

    # Training: metrics (JSONL + TensorBoard), an orbax checkpoint, the PEFT adapter.
    train = run_dir / "train"
    metrics = _jsonl(train / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1]
    assert {"train/loss", "rollout/reward_mean"} <= set(metrics[0])
    assert _event_tags(train)["train/loss"] == [1]
    assert (train / "checkpoints" / "1").is_dir()
    peft = json.loads((train / "adapter" / "adapter_config.json").read_text())
    assert peft["r"] == 4 and peft["base_model_name_or_path"] == str(run_dir / "checkpoint")
    tensors = safetensors.numpy.load_file(str(train / "adapter" / "adapter_model.safetensors"))
    assert any("lora_A" in name for name in tensors) and any("lora_B" in name for name in tensors)

    # Both evaluations: trajectories and scores of both modes, the same 3 tasks.
    ids = None
    for stage in ("eval_before", "eval_after"):
        for mode in ("interactive", "in_context"):
            episodes = _jsonl(run_dir / stage / f"{mode}_episodes.jsonl")
            scored = _jsonl(run_dir / stage / f"{mode}_scored.jsonl")
            assert len(episodes) == len(scored) == 3, (stage, mode)
            ids = ids or {r["task_id"] for r in episodes}
            assert {r["task_id"] for r in scored} == ids
            assert all(0.0 <= r["code_match"] <= 1.0 for r in scored)
        interactive = _jsonl(run_dir / stage / "interactive_episodes.jsonl")
        assert all(r["n_calls"] == 1 and r["steps"] for r in interactive)
    assert "LoRA adapter on 14 modules" in out

    # The combined report and the summary.
    report = (run_dir / "report.md").read_text()
    for run in ("before/interactive", "after/interactive", "before/in_context", "after/in_context"):
        assert f"| {run} | 3 |" in report, run
    assert "| after/interactive vs before/interactive | code_match |" in report
    images = [line[line.index("(") + 1 : -1] for line in report.splitlines() if line[:2] == "!["]
    assert {"training.png", "after_interactive_vs_in_context.png"} <= set(images)
    assert "## Training" in report
    for image in images:
        assert (run_dir / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image
    # Judge and coder are the base checkpoint: self-graded, and every report says so at the top.
    assert report.splitlines()[2].startswith("**Self-graded**")
    for stage in ("eval_before", "eval_after"):
        assert (
            (run_dir / stage / "report.md")
            .read_text()
            .splitlines()[2]
            .startswith("**Self-graded**")
        )
        assert json.loads((run_dir / stage / "metrics.json").read_text())["grading"]["self_graded"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["self_graded"] is True
    assert summary["tasks"] == 3 and summary["train"]["steps"] == 1
    assert isinstance(summary["train"]["loss"], float)
    assert set(summary["before"]) == set(summary["after"]) == {"interactive", "in_context"}
    pair = summary["comparisons"]["after/interactive vs before/interactive"]["code_match"]
    assert pair["n"] == 3 and 0.0 <= pair["p_value"] <= 1.0
    assert summary["paths"]["adapter"] == str(train / "adapter")
    assert summary["seconds"]["total"] > 0

    # The same command again resumes every stage: nothing is redone or duplicated.
    again = launching.launch(*proc.args[3:], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from step 1" in again.stdout and "[train] step" not in again.stdout
    assert len(_jsonl(train / "metrics.jsonl")) == 1
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["train"] == summary["train"] and resumed["before"] == summary["before"]
    for stage in ("eval_before", "eval_after"):
        for name in ("interactive_episodes", "interactive_scored", "in_context_scored"):
            assert len(_jsonl(run_dir / stage / f"{name}.jsonl")) == 3, (stage, name)


@pytest.mark.parametrize(
    "name",
    sorted(str(p.relative_to(ROOT / "gin")) for p in (ROOT / "gin").glob("*.gin"))
    + sorted(f"gpu/{p.name}" for p in (ROOT / "gin" / "gpu").glob("*.gin")),
)
def test_top_level_gin_files_parse(name, tmp_path):
    proc = launching.launch(f"--gin_file={name}", "--dry_run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_run_mode_can_be_chosen_on_the_command_line():
    from pau_jax import experiment, launch

    assert launch.flags.FLAGS["run_mode"].parser.enum_values == list(experiment.RUN_MODES)
    assert set(experiment.RUN_MODES) == set(experiment.ENTRIES)
