"""README recipes, each run in a tiny form: commands are read from README.md itself.

Real tiny runs where they are cheap (the debug dataset build, evaluation of a tiny local
checkpoint, evaluation through the local OpenAI-compatible server, an AAC run resumed, its
adapter loaded by PEFT); a configuration parse for those that need real checkpoints or
accelerators. Later flags override earlier ones, which is how the tiny overlays are added.
"""

import json
import pathlib
import re
import shlex
import subprocess
import sys

import checkpoints
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
LAUNCH = "python -m pau_jax.launch"


def readme_commands(section: str) -> list[str]:
    """Commands of the ```bash blocks under the README heading `### {section}`."""
    text = README.read_text()
    match = re.search(rf"^### {re.escape(section)}\n(.*?)(?=^#)", text, re.S | re.M)
    assert match, f"README.md has no section '### {section}'"
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", match.group(1), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(" ".join(line.split()))
    assert commands, f"no commands under '### {section}'"
    return commands


def _argv(command: str, program: str = LAUNCH) -> list[str]:
    """The arguments after `program` in a shell command (checked to be valid shell first)."""
    syntax = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    assert syntax.returncode == 0, f"not valid shell: {command}\n{syntax.stderr}"
    words, head = shlex.split(command), shlex.split(program)
    for i in range(len(words)):
        if words[i : i + len(head)] == head:
            return words[i + len(head) :]
    raise AssertionError(f"{program!r} not in {command!r}")


def _launch(args, cwd, timeout=600):
    proc = subprocess.run(
        [sys.executable, "-m", "pau_jax.launch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _parse(args) -> str:
    """The launcher's gin parse of `args` in this process; returns the configuration text."""
    import gin

    from pau_jax import launch

    rest, bindings = launch._split_gin_dot_flags(args)
    files = [a.split("=", 1)[1] for a in rest if a.startswith("--gin_file=")]
    others = [a for a in rest if not a.startswith("--gin_file=")]
    assert all(a.startswith(("--run_dir=", "--run_mode=")) for a in others), others
    gin.clear_config()
    try:
        launch.parse_config(files, bindings)
        return gin.config_str()
    finally:
        gin.clear_config()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from pau_jax.tasks import pau_dataset as tasks

    return tasks.ensure_built(tmp_path_factory.mktemp("tfds"), config="debug")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random Qwen3 over the real vocabulary, with the offline tokenizer."""
    return checkpoints.save_tiny_chat_checkpoint(tmp_path_factory.mktemp("ckpt"))


def _eval_overlay(data_dir, run_dir) -> list[str]:
    return [
        f"--gin.DATA_DIR='{data_dir}'",
        "--gin.DATASET_CONFIG='debug'",
        "--gin.LIMIT=2",
        "--gin.pau_jax.env.episode.EpisodeConfig.call_budget=1",
        "--gin.pau_jax.experiment.evaluate.sandbox_workers=2",
        "--gin.pau_jax.evaluation.score.ScoringConfig.bootstrap_resamples=200",
        f"--run_dir={run_dir}",
    ]


def test_top_commands_are_the_main_job_and_the_test_suite():
    text = README.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    main_job, tests = blocks[0].strip(), blocks[1].strip()
    assert main_job.split(" && ")[-1] == "python -m pau_jax.launch --gin_file=quickstart.gin"
    for command in (main_job, tests):
        for name in re.findall(r"-r (\S+)", command):
            assert (ROOT / name).is_file(), name
    for folder in tests.split('-m "not slow"')[1].split():
        assert (ROOT / folder).is_dir(), folder
    assert "run_mode = 'quickstart'" in _parse(["--gin_file=quickstart.gin"])


def test_build_dataset(tmp_path):
    default, debug = readme_commands("Build the full dataset")[1:]
    cwd = ROOT / "data_builders"
    program = "python -m pau_jax.data.build_tfds"
    run = [sys.executable, "-m", "pau_jax.data.build_tfds"]
    built = subprocess.run(
        run + _argv(debug, program) + [f"--data_dir={tmp_path}"],
        cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert list((tmp_path / "pau" / "debug").glob("*/dataset_info.json"))
    # The default config reads the four source files; without them it stops with one clear line.
    empty = tmp_path / "no_sources"
    empty.mkdir()
    args = _argv(default, program) + [f"--manual_dir={empty}", f"--data_dir={tmp_path}"]
    failed = subprocess.run(run + args, cwd=cwd, capture_output=True, text=True, env=ENV)
    assert failed.returncode != 0 and "--manual_dir" in failed.stderr.splitlines()[-1]


def test_evaluate_a_checkpoint_directory(tmp_path, data_dir, checkpoint):
    commands = readme_commands("Evaluate a Qwen3 checkpoint directory")
    assert len(commands) == 5
    # The CPU preset on real code models (timed in docs/benchmarks.md): the 0.5B agent fetched
    # by name, the 1.5B as judge and coder, the debug tasks that have a gold description.
    coder = _parse(_argv(commands[3]))
    for binding in (
        "CHECKPOINT = @agent/pau_jax.tools.fetch.checkpoint()",
        "agent/checkpoint.name = 'qwen2.5-coder-0.5b-instruct'",
        "grader/checkpoint.name = 'qwen2.5-coder-1.5b-instruct'",
        "JUDGE = @judge/pau_jax.policy.backends.LocalBackendConfig()",
        "CODER = @coder/pau_jax.policy.backends.LocalBackendConfig()",
        "DatasetConfig.sources = ('humaneval', 'mbpp')", "DATASET_CONFIG = 'debug'",
        "evaluate.modes = ('interactive', 'in_context')",
        "policy/LocalBackendConfig.dtype = 'float32'", "judge/LocalBackendConfig.dtype = 'float32'",
    ):  # fmt: skip
        assert binding in coder, binding
    # The same protocol on SmolLM2, self-graded.
    smollm2 = _parse(_argv(commands[4]))
    for binding in (
        "EpisodeConfig.call_budget = 4", "LIMIT = 4", "MAX_NEW_TOKENS = 160",
        "JUDGE = 'self'", "CODER = 'self'", "DATASET_CONFIG = 'debug'",
        "DatasetConfig.sources = ('humaneval', 'mbpp')",
        "policy/LocalBackendConfig.dtype = 'float32'",
    ):  # fmt: skip
        assert binding in smollm2, binding
    # The tiny checkpoint in every seat (agent, judge, coder), float32 on the CPU.
    tiny = [
        f"--gin.CHECKPOINT='{checkpoint}'",
        f"--gin.JUDGE_CHECKPOINT='{checkpoint}'",
        f"--gin.CODER_CHECKPOINT='{checkpoint}'",
        *(f"--gin.{seat}/pau_jax.policy.backends.LocalBackendConfig.dtype='float32'"
          for seat in ("judge", "coder")),
        *(f"--gin.{seat}/pau_jax.policy.config.SamplingConfig.max_new_tokens=8"
          for seat in ("judge", "coder")),
        *_eval_overlay(data_dir, tmp_path / "run"),
    ]  # fmt: skip
    for command in commands[:2]:
        config = _parse(_argv(command) + tiny)
        assert "LocalBackendConfig.checkpoint_dir = %CHECKPOINT" in config
        assert "evaluate.judge = %JUDGE" in config and "evaluate.coder = %CODER" in config
        assert "JUDGE = @judge/pau_jax.policy.backends.LocalBackendConfig()" in config
    # Both modes for real on the tiny checkpoint, with a LoRA adapter on the agent.
    from pau_jax.models import lora, qwen3

    model, _ = qwen3.load_hf(checkpoint)
    n = lora.apply_lora(model, rank=2, alpha=2.0)
    lora.export_peft(model, tmp_path / "adapter")
    proc = _launch(
        _argv(commands[2])
        + tiny
        + [
            f"--gin.ADAPTER='{tmp_path / 'adapter'}'",
            "--gin.MAX_NEW_TOKENS=8",
            "--gin.policy/pau_jax.policy.backends.LocalBackendConfig.dtype='float32'",
        ],
        cwd=tmp_path,
    )
    assert f"LoRA adapter on {n} modules" in proc.stdout
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["runs"]) == {"interactive", "in_context"} and metrics["tasks"] == 2
    # The same tiny checkpoint judged and coded: recognised as self-graded.
    assert metrics["grading"]["self_graded"] is True
    assert "interactive vs in_context" in metrics["comparisons"]
    assert (tmp_path / "run" / "interactive_vs_in_context.png").exists()


def test_evaluate_a_served_model(tmp_path, data_dir, checkpoint):
    from pau_jax.models import qwen3
    from pau_jax.policy.config import SamplingConfig
    from pau_jax.policy.local import LocalPolicy
    from pau_jax.policy.server import PolicyServer
    from pau_jax.tokenizer import load_tokenizer

    serve, command, own = readme_commands("Evaluate a served model (OpenAI-compatible endpoint)")
    assert serve.startswith("vllm serve ")
    # pau_jax's own server command parses (on the tiny checkpoint instead of the fetched one).
    from pau_jax.tools import serve as serve_tool

    served = _argv(own, "python -m pau_jax.tools.serve")
    parsed = serve_tool.parse_args([str(checkpoint), *served[1:]])
    assert parsed.name == ["qwen2.5-coder-1.5b-instruct"] and parsed.decode_weights == "q8"
    args = _argv(command)
    url = next(a.split("=", 1)[1] for a in args if ".base_url=" in a).strip("'")
    # One server behind every seat: it serves each model name the command sends.
    names = [a.split("=", 1)[1].strip("'") for a in args if ".model=" in a]
    model, _ = qwen3.load_hf(checkpoint)
    policy = LocalPolicy(model, load_tokenizer(checkpoint), SamplingConfig(max_new_tokens=8))
    with PolicyServer(policy, model_name=names) as server:
        tiny = [
            *(f"--gin.{seat}/pau_jax.policy.http.HTTPConfig.base_url='{server.base_url}'"
              for seat in ("policy", "judge", "coder")),
            *(f"--gin.{seat}/pau_jax.policy.http.HTTPConfig.max_tokens=8"
              for seat in ("policy", "judge", "coder")),
            *_eval_overlay(data_dir, tmp_path / "run"),
        ]  # fmt: skip
        assert url.startswith("http://127.0.0.1:") and url != server.base_url
        _launch(args + tiny, cwd=tmp_path)
        assert server.batch_sizes  # The agent, judge and coder all asked the server.
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["runs"]["interactive"]["episodes"] == 2
    assert metrics["backend_failures"] == {"policy": 0, "judge": 0, "coder": 0}


def test_baselines_and_compare(tmp_path):
    memory, ft, gold, compare = readme_commands("Baselines and the cross-model table")
    expected = {
        memory: "evaluate.modes = ('interactive', 'memory')",
        ft: "evaluate.modes = ('in_context', 'ft')",
        gold: "evaluate.modes = ('gold',)",
    }
    for command, modes in expected.items():
        config = _parse(_argv(command))
        assert modes in config and "run_mode = 'eval'" in config, command
        assert "CODER = @coder/pau_jax.policy.backends.LocalBackendConfig()" in config
    # compare for real, on two tiny evaluations (scripted agent, judge and coder; demo tasks).
    program = "python -m pau_jax.evaluation.compare"
    args = _argv(compare, program)
    out = args[args.index("--out") + 1]
    runs = [a for a in args if a.startswith("runs/") and a != out]
    assert len(runs) == 4 and out == "runs/compare"
    for run in runs[:2]:
        _launch(
            ["--gin_file=eval/interactive.gin", "--gin_file=debug/eval_tiny.gin",
             "--gin.pau_jax.evaluation.score.ScoringConfig.bootstrap_resamples=200", f"--run_dir={run}"],
            cwd=tmp_path,
        )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pau_jax.evaluation.compare", *runs[:2], "--out", "runs/compare",
         "--resamples", "200"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "runs" / "compare" / "report.md").read_text()
    assert "eval-qwen3-8b-both" in report and "memory-qwen3-8b" in report


def test_aac_on_accelerators(tmp_path):
    memory, local, tpu, slurm = readme_commands("AAC on GPUs or TPUs with a real checkpoint")
    estimate = subprocess.run(
        [sys.executable, "-m", "pau_jax.tools.memory_estimate", *_argv(memory, "python -m pau_jax.tools.memory_estimate")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert estimate.returncode == 0, estimate.stderr[-2000:]
    for command in (local, tpu):
        config = _parse(_argv(command))
        assert "run_mode = 'train'" in config and "MeshConfig.fsdp = 8" in config
    assert "TPU_NAME=" in tpu and (ROOT / "launch" / "tpu_pod.sh").is_file()
    sbatch = ROOT / "launch" / "slurm_gpu.sbatch"
    assert "MeshConfig.fsdp = 8" in _parse(_argv(slurm, "launch/slurm_gpu.sbatch"))
    for script in (ROOT / "launch" / "tpu_pod.sh", sbatch):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script


EXPECTED = {
    "final": "train.advantage_fn = @pau_jax.rl.credit.final_only",
    "sym_info": "CriticConfig.privileged = 'none'",
    "distill": "distill.privileged = False",
    "codearc_sft": "distill.privileged = True",
}


def test_ablations():
    commands = readme_commands("Ablations")
    listed = {re.search(r"ablations/(\w+)\.gin", c).group(1): c for c in commands}
    on_disk = {p.stem for p in (ROOT / "gin" / "ablations").glob("*.gin")}
    assert set(EXPECTED) <= set(listed) and on_disk <= set(listed), (on_disk, set(listed))
    for name, command in listed.items():
        if not (ROOT / "gin" / "ablations" / f"{name}.gin").exists():
            pytest.fail(f"README lists ablations/{name}.gin, which does not exist")
        config = _parse(_argv(command))
        mode = "distill" if name in ("distill", "codearc_sft") else "train"
        assert EXPECTED.get(name, "") in config and f"run_mode = '{mode}'" in config, name


def test_resume_and_serve_the_adapter(tmp_path, data_dir, checkpoint):
    (command,) = readme_commands("Resume a run")
    (serve,) = readme_commands("Serve the trained adapter with vLLM")
    run_dir = tmp_path / "aac"
    tiny = [
        "--gin_file=debug/local_tiny.gin",
        f"--gin.CHECKPOINT='{checkpoint}'",
        "--gin.DATASET=@aac/pau_jax.tasks.DatasetConfig()",
        "--gin.DATASET_CONFIG='debug'",
        f"--gin.DATA_DIR='{data_dir}'",
        "--gin.pau_jax.rl.rollout.RolloutConfig.tasks_per_batch=1",
        "--gin.rollout/pau_jax.policy.config.SamplingConfig.max_new_tokens=6",
        "--gin.critic/pau_jax.policy.config.SamplingConfig.max_new_tokens=4",
        f"--run_dir={run_dir}",
    ]
    _launch(_argv(command) + tiny + ["--gin.pau_jax.experiment.train.steps=1"], cwd=tmp_path)
    again = _launch(_argv(command) + tiny, cwd=tmp_path)  # local_tiny.gin: 2 steps.
    assert "resuming from step 1 (task position 1)" in again.stdout
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2

    # The adapter is what `vllm serve --enable-lora --lora-modules name=<run_dir>/adapter` reads.
    words = shlex.split(serve)
    module = words[words.index("--lora-modules") + 1].split("=", 1)[1]
    assert module == f"{readme_commands('Resume a run')[0].split('--run_dir=')[1]}/adapter"
    adapter = run_dir / "adapter"
    peft_config = json.loads((adapter / "adapter_config.json").read_text())
    assert peft_config["r"] <= int(words[words.index("--max-lora-rank") + 1])
    import peft
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint))
    served = peft.PeftModel.from_pretrained(base, str(adapter))
    lora_a = [n for n, _ in served.named_parameters() if "lora_A" in n]
    assert len(lora_a) == 7  # every linear layer of the one decoder block


def test_reproducing_commands_parse(tmp_path):
    """Every launcher command of docs/reproducing.md, run by bash with `python` recording its argv."""
    text = (ROOT / "docs" / "reproducing.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    record = tmp_path / "argv"
    script = (
        f'python() {{ printf "%s\\0" "$@" >> {record}; printf "\\n\\0" >> {record}; }}\n'
        "CKPT=/ckpt/Qwen3-1.7B\nDATA=/data/tfds\n" + "\n".join(blocks)
    )
    ran = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    commands = [c.split("\0")[:-1] for c in record.read_text().split("\n\0") if c]
    launches = [c[2:] for c in commands if c[:2] == ["-m", "pau_jax.launch"]]
    assert len(launches) == 11, len(launches)
    for args in launches:
        config = _parse(args)
        assert "CHECKPOINT = '/ckpt/Qwen3-1.7B'" in config or "HTTPBackendConfig()" in config
        assert "DATA_DIR = '/data/tfds'" in config
        if "--gin_file=eval/interactive.gin" in args:  # The paper's judge and coder seats.
            assert "CODER = @coder/pau_jax.policy.backends.HTTPBackendConfig()" in config
            assert "JUDGE = @judge/pau_jax.policy.backends.HTTPBackendConfig()" in config
        if "--gin_file=ablations/distill.gin" in args or "ablations/codearc_sft.gin" in str(args):
            assert "TEACHER = @teacher/pau_jax.policy.backends.HTTPBackendConfig()" in config
