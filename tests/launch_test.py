"""The launcher end to end: gin parsing, run directory, the main job (quickstart) in a reduced form."""

import json
import pathlib
import re
import signal
import socket
import struct
import subprocess
import threading
import time

import launching
import pytest
import safetensors.numpy
from tensorboardX.proto import event_pb2

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The quickstart with every stage, at the smallest sizes: 3 tasks, 1 call per episode, one
# AAC step of 1 task x 2 episodes of at most 3 phases.
REDUCED = (
    "--gin.eval/pau_jax.tasks.DatasetConfig.limit=3",
    "--gin.EVAL_CALL_BUDGET=1",
    "--gin.agent/pau_jax.policy.config.SamplingConfig.max_new_tokens=8",
    "--gin.judge/pau_jax.policy.config.SamplingConfig.max_new_tokens=8",
    "--gin.pau_jax.evaluation.score.ScoringConfig.bootstrap_resamples=200",
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
    operative = (run_dir / "operative_config.gin").read_text()
    assert re.search(r"eval/(pau_jax\.tasks\.)?DatasetConfig\.limit = 3", operative), operative
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
    # Parsed: the configuration is printed. A template whose inputs are given on the command
    # line (aac.gin: --gin.CHECKPOINT) fails its dry run, with a line per missing input only.
    assert "run_defaults.run_mode = " in proc.stdout, proc.stderr[-2000:]
    lines = proc.stderr.removeprefix("error: ").splitlines()
    assert all(re.match(r"\w+ run: ", line) for line in lines), proc.stderr[-2000:]


def test_every_run_mode_can_be_chosen_on_the_command_line():
    from pau_jax import experiment, launch

    assert launch.flags.FLAGS["run_mode"].parser.enum_values == list(experiment.RUN_MODES)
    assert set(experiment.RUN_MODES) == set(experiment.ENTRIES)


# Ctrl-C: the run stops within seconds (launch.STOP_GRACE_S at most, when something hangs), says
# in one line what it keeps, exit status 130.

TINY_AAC = ("--gin_file=aac.gin", "--gin_file=debug/local_tiny.gin")


def _interrupt(proc: subprocess.Popen, timeout: float) -> tuple[str, str, float]:
    """Sends SIGINT; (stdout, stderr, seconds until the process ended). Kills it on a timeout."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out, err, time.monotonic() - sent


def _interrupted_line(err: str) -> str:
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, err  # The line, after an ended progress line at most.
    return lines[-1]


def test_ctrl_c_during_training_stops_with_one_line_and_a_rerun_resumes(tmp_path):
    run_dir = tmp_path / "run"
    args = (*TINY_AAC, f"--run_dir={run_dir}", "--gin.pau_jax.experiment.train.steps=50")
    proc = launching.start(*args, cwd=tmp_path)
    for line in proc.stdout:
        if line.startswith("[train] step 2/50"):  # Step 1's checkpoint has been started.
            break
    out, err, seconds = _interrupt(proc, timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert seconds < 15, seconds
    line = _interrupted_line(err)
    match = re.fullmatch(
        rf"interrupted: {run_dir} keeps the checkpoint of step (\d+) \({run_dir}/checkpoints\); "
        "rerun the same command to resume",
        line,
    )
    assert match, line
    step = int(match[1])
    assert step >= 1 and (run_dir / "checkpoints" / str(step)).is_dir()

    # The same command (one step more) resumes from that checkpoint.
    more = f"--gin.pau_jax.experiment.train.steps={step + 1}"
    again = launching.launch(*args[:-1], more, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from step {step}" in again.stdout
    assert f"[train] step {step + 1}/{step + 1}" in again.stdout
    assert "[train] step 1/" not in again.stdout


@pytest.fixture
def hanging_endpoint():
    """(base URL of a server that accepts requests and never answers, set once one arrived)."""
    server = socket.create_server(("127.0.0.1", 0))
    arrived, held = threading.Event(), []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # Closed at the end of the test.
                return
            arrived.set()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/v1", arrived
    server.close()
    for connection in held:
        connection.close()


def test_ctrl_c_while_an_endpoint_hangs_stops_within_seconds(hanging_endpoint, tmp_path):
    url, arrived = hanging_endpoint
    http = "pau_jax.policy.http.HTTPConfig"
    proc = launching.start(
        "--gin_file=eval/interactive.gin",
        "--gin_file=debug/eval_tiny.gin",
        f"--run_dir={tmp_path / 'run'}",
        "--gin.pau_jax.experiment.evaluate.policy=@pau_jax.policy.backends.HTTPBackendConfig()",
        f"--gin.pau_jax.policy.backends.HTTPBackendConfig.http=@{http}()",
        f"--gin.{http}.base_url='{url}'",
        f"--gin.{http}.model='m'",
        f"--gin.{http}.timeout_s=300.0",
        cwd=tmp_path,
    )
    try:
        assert arrived.wait(120), "no request reached the endpoint"
    finally:
        out, err, seconds = _interrupt(proc, timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert seconds < 15, seconds
    line = _interrupted_line(err)
    assert line == (
        f"interrupted: {tmp_path / 'run'} keeps no finished step or episode yet; "
        "rerun the same command to resume"
    )
