"""Configuration and input errors as a user meets them: short, with a hint, and a non-zero exit.

Each launch runs the launcher in a subprocess on cheap configurations that stop before
any model is loaded: `--dry_run`, the scripted eval overlay, or a path that does not exist.
"""

import pathlib
import subprocess
import sys

import launching
import numpy as np
import pytest

from pau_jax import experiment, launch
from pau_jax.policy.http import EndpointError
from pau_jax.tools.fetch import FetchError

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ("--gin_file=eval/interactive.gin", "--gin_file=debug/eval_tiny.gin")
LOCAL_AGENT = (
    "--gin.pau_jax.experiment.evaluate.policy=@policy/pau_jax.policy.backends.LocalBackendConfig()"
)


_checkpoint = launching.checkpoint_folder
_built = launching.built_dataset


def _short(proc: subprocess.CompletedProcess, max_lines: int = 3) -> str:
    """The stderr of a failed launch, checked to be a short message without a traceback."""
    assert proc.returncode != 0, proc.stdout[-2000:]
    err = proc.stderr
    assert "Traceback" not in err and "In call to configurable" not in err, err[-3000:]
    assert 1 <= len(err.strip().splitlines()) <= max_lines, err
    assert err.startswith("error: "), err
    return err


# A command-line binding that changes nothing, or a name that matches nothing.


def test_misspelled_command_line_macro_is_an_error_with_a_hint(tmp_path):
    proc = launching.launch(*TINY, "--gin.ADAPTR='/runs/adapter'", "--dry_run", cwd=tmp_path)
    err = _short(proc, max_lines=1)
    assert "--gin.ADAPTR sets a macro that no binding uses (did you mean --gin.ADAPTER?)" in err
    assert proc.stdout == ""  # Nothing printed as if the configuration were fine.


def test_binding_in_a_scope_no_reference_enters_is_an_error(tmp_path):
    binding = "--gin.jduge/pau_jax.policy.config.SamplingConfig.max_new_tokens=8"
    err = _short(launching.launch(*TINY, binding, "--dry_run", cwd=tmp_path), max_lines=1)
    assert "scope 'jduge', which no reference enters (did you mean 'judge'?)" in err


@pytest.mark.parametrize(
    "binding, expected",
    [
        (
            "--gin.pau_jax.experiment.evalute.judge=None",
            "unknown configurable 'pau_jax.experiment.evalute' "
            "(did you mean 'pau_jax.experiment.evaluate'?)",
        ),
        (
            "--gin.pau_jax.experiment.evaluate.judg=None",
            "'pau_jax.experiment.evaluate' has no parameter 'judg' (did you mean 'judge'?)",
        ),
        (
            "--gin.JUDGE=@pau_jax.policy.backends.LocalBackndConfig()",
            "(did you mean 'pau_jax.policy.backends.LocalBackendConfig'?)",
        ),
        ("--gin.CODER=%JUDG", "%JUDG is used by CODER but never set (did you mean %JUDGE?)"),
    ],
)
def test_unknown_names_are_short_errors_with_a_hint(binding, expected, tmp_path):
    err = _short(launching.launch(*TINY, binding, "--dry_run", cwd=tmp_path))
    assert expected in err


def test_unknown_parameter_in_a_gin_file_names_the_file_and_line(tmp_path):
    (tmp_path / "mine.gin").write_text(
        "include 'eval/interactive.gin'\npau_jax.experiment.evaluate.sandbox_worker = 2\n"
    )
    err = _short(launching.launch("--gin_file=mine.gin", "--dry_run", cwd=tmp_path))
    assert "has no parameter 'sandbox_worker' (did you mean 'sandbox_workers'?)" in err
    assert "mine.gin, line 2: pau_jax.experiment.evaluate.sandbox_worker = 2" in err


@pytest.mark.parametrize(
    "line, expected",
    [
        ("pau_jax.training.run.ActorConfig.checkpoint = %CHEKPOINT",
         "mine.gin, line 3: %CHEKPOINT is never set (did you mean %CHECKPOINT?)"),
        ("CHEKPOINT = '/ckpt'",
         "mine.gin, line 3: CHEKPOINT sets a macro that no binding uses (did you mean CHECKPOINT?)"),
        ("rollot/pau_jax.policy.config.SamplingConfig.max_new_tokens = 8",
         "mine.gin, line 3: rollot/pau_jax.policy.config.SamplingConfig.max_new_tokens binds in "
         "scope 'rollot', which no reference enters (did you mean 'rollout'?)"),
    ],
)  # fmt: skip
def test_a_typo_in_a_users_gin_file_is_one_line_naming_file_and_line(line, expected, tmp_path):
    (tmp_path / "mine.gin").write_text(
        f"include 'aac.gin'\ninclude 'debug/local_tiny.gin'\n{line}\n"
    )
    err = _short(launching.launch("--gin_file=mine.gin", "--dry_run", cwd=tmp_path), max_lines=1)
    assert err == f"error: {expected}\n"


def test_typos_in_a_users_included_file_are_found_one_line_each(tmp_path):
    (tmp_path / "base.gin").write_text(
        "include 'aac.gin'\n"
        "# a comment\n"
        "pau_jax.rl.critic.CriticConfig.privileged = (\n"
        "    %PRIVILEGD)\n"
        "SEDE = 1\n"
    )
    (tmp_path / "mine.gin").write_text("include 'base.gin'\ninclude 'debug/local_tiny.gin'\n")
    err = _short(launching.launch("--gin_file=mine.gin", "--dry_run", cwd=tmp_path), max_lines=2)
    assert err.splitlines() == [
        "error: base.gin, line 4: %PRIVILEGD is never set",
        "base.gin, line 5: SEDE sets a macro that no binding uses (did you mean SEED?)",
    ]


def test_a_users_gin_file_without_typos_passes(tmp_path):
    (tmp_path / "mine.gin").write_text(
        "include 'aac.gin'\ninclude 'debug/local_tiny.gin'\n"
        "T_MAX = 4  # a comment with %NOT_A_MACRO\n"
        "rollout/pau_jax.policy.config.SamplingConfig.temperature = %TEMPERATURE\n"
        "pau_jax.experiment.train.steps = %gin.REQUIRED\n"
        "pau_jax.experiment.train.steps = 3\n"
        "pau_jax.rl.critic.CriticConfig.privileged = '100%DONE'\n"
    )
    proc = launching.launch("--gin_file=mine.gin", "--dry_run", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


# --dry_run checks what the run mode requires.


def test_dry_run_refuses_a_missing_seat_in_one_line(tmp_path):
    proc = launching.launch(
        *TINY, "--gin.pau_jax.experiment.evaluate.judge=None", "--dry_run", cwd=tmp_path
    )
    err = _short(proc, max_lines=1)
    assert "evaluate.judge" in err and "coder" not in err
    assert "evaluate.judge = None" in proc.stdout  # The configuration is still printed.


def test_dry_run_names_the_required_macros_of_a_template(tmp_path):
    data = f"--gin.DATA_DIR='{_built(tmp_path / 'tfds')}'"
    args = ("--gin_file=eval/interactive.gin", data, "--dry_run")
    err = _short(launching.launch(*args, cwd=tmp_path), max_lines=3)
    for line, flag in zip(err.splitlines(), ("--gin.JUDGE", "--gin.CODER", "--gin.CHECKPOINT")):
        assert flag in line, (flag, err)
    # A judge on a local checkpoint needs the judge's checkpoint too; nothing is loaded.
    proc = launching.launch(
        "--gin_file=eval/interactive.gin",
        f"--gin.CHECKPOINT='{_checkpoint(tmp_path / 'ckpt')}'",
        "--gin.JUDGE=@judge/pau_jax.policy.backends.LocalBackendConfig()",
        "--gin.CODER='self'",
        *args[1:],
        cwd=tmp_path,
    )
    err = _short(proc, max_lines=1)
    assert "judge/LocalBackendConfig.checkpoint_dir (set --gin.JUDGE_CHECKPOINT" in err
    assert "JUDGE " not in err and "CODER" not in err


def test_dry_run_refuses_a_missing_distillation_teacher(tmp_path):
    files = ("--gin_file=aac.gin", "--gin_file=ablations/distill.gin")
    inputs = (f"--gin.CHECKPOINT='{_checkpoint(tmp_path / 'ckpt')}'",
              f"--gin.DATA_DIR='{_built(tmp_path / 'tfds')}'")  # fmt: skip
    err = _short(launching.launch(*files, *inputs, "--dry_run", cwd=tmp_path), max_lines=1)
    assert "distill.teacher (set --gin.TEACHER" in err


@pytest.mark.parametrize(
    "args",
    [
        ("--gin_file=eval/interactive.gin", "--gin.CHECKPOINT='{ckpt}'",
         "--gin.JUDGE='self'", "--gin.CODER='self'", "--gin.DATA_DIR='{tfds}'"),
        ("--gin_file=eval/gold.gin", "--gin.CHECKPOINT='{ckpt}'",
         "--gin.CODER='self'", "--gin.DATA_DIR='{tfds}'"),
        TINY,
        ("--gin_file=aac.gin", "--gin_file=ablations/distill.gin", "--gin.TEACHER='self'",
         "--gin.CHECKPOINT='{ckpt}'", "--gin.DATA_DIR='{tfds}'"),
        ("--gin_file=aac.gin", "--gin.CHECKPOINT='{ckpt}'", "--gin.DATA_DIR='{tfds}'"),
        ("--gin_file=aac.gin", "--gin_file=debug/local_tiny.gin"),
        ("--gin_file=quickstart.gin", "--gin.DATA_DIR='{tmp}/nothing_built_yet'"),
    ],
)  # fmt: skip
def test_dry_run_passes_when_everything_required_is_set(args, tmp_path):
    paths = {"ckpt": _checkpoint(tmp_path / "ckpt"), "tfds": _built(tmp_path / "tfds")}
    args = [a.format(tmp=tmp_path, **paths) for a in args]
    proc = launching.launch(*args, "--dry_run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""


# --dry_run checks what the run reads: checkpoints, adapters, dataset splits.


def test_dry_run_of_aac_without_a_checkpoint_or_a_built_split_fails_one_line_each(tmp_path):
    proc = launching.launch(
        "--gin_file=aac.gin", f"--gin.DATA_DIR='{tmp_path}/tfds'", "--dry_run", cwd=tmp_path
    )
    first, second = _short(proc, max_lines=2).splitlines()
    assert first.startswith("error: train run: the actor has no checkpoint (set --gin.CHECKPOINT:")
    assert second.startswith(f"train run: pau/default is not built under {tmp_path}/tfds;")
    assert "train.steps = None" in proc.stdout  # The configuration is still printed.


def _cut_short(folder: pathlib.Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])


@pytest.mark.parametrize(
    "case, damage, expected",
    [
        ("missing", lambda f: f.rename(f.with_name("elsewhere")), "checkpoint {ckpt} is not a directory"),
        ("no config", lambda f: (f / "config.json").unlink(), "checkpoint {ckpt} has no config.json"),
        ("bad config", lambda f: (f / "config.json").write_text("{"), "{ckpt}/config.json is not valid JSON"),
        ("no weights", lambda f: (f / "model.safetensors").unlink(), "{ckpt} holds no *.safetensors"),
        ("cut short", _cut_short, "{ckpt}/model.safetensors is cut short"),
        ("zeroed", lambda f: (f / "model.safetensors").write_bytes(bytes(200)),
         "{ckpt}/model.safetensors is cut short or not a safetensors file"),
    ],
)  # fmt: skip
def test_dry_run_refuses_a_checkpoint_that_would_not_load(case, damage, expected, tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt")
    damage(ckpt)
    args = (
        "--gin_file=aac.gin",
        f"--gin.CHECKPOINT='{ckpt}'",
        f"--gin.DATA_DIR='{_built(tmp_path / 'tfds')}'",
    )
    err = _short(launching.launch(*args, "--dry_run", cwd=tmp_path), max_lines=1)
    assert err.startswith("error: train run: "), case
    assert expected.format(ckpt=ckpt) in err, case


def test_dry_run_checks_every_seat_checkpoint_adapter_and_split(tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt")
    proc = launching.launch(
        "--gin_file=eval/interactive.gin",
        f"--gin.CHECKPOINT='{ckpt}'",
        f"--gin.ADAPTER='{tmp_path}/no_adapter'",
        "--gin.JUDGE=@judge/pau_jax.policy.backends.LocalBackendConfig()",
        f"--gin.JUDGE_CHECKPOINT='{tmp_path}/no_judge'",
        "--gin.CODER='self'",
        f"--gin.DATA_DIR='{_built(tmp_path / 'tfds', splits=('train',))}'",
        "--dry_run",
        cwd=tmp_path,
    )
    lines = _short(proc, max_lines=3).removeprefix("error: ").splitlines()
    assert sorted(lines) == sorted(
        [
            f"eval run: adapter {tmp_path}/no_adapter has no adapter_config.json (not a PEFT adapter folder)",
            f"eval run: checkpoint {tmp_path}/no_judge is not a directory",
            f"eval run: pau/default under {tmp_path}/tfds has no split 'test' (it has ['train'])",
        ]
    )


# Errors in the input: the message, not the traceback.


@pytest.mark.parametrize(
    "case, args, message",
    [
        (
            "missing checkpoint",
            (*TINY, LOCAL_AGENT, "--gin.CHECKPOINT='/no/such/checkpoint'"),
            "/no/such/checkpoint/config.json not found; expected a Hugging Face model directory",
        ),
        (
            "unknown dataset config",
            (*TINY, "--gin.pau_jax.experiment.evaluate.dataset=@pau_jax.tasks.DatasetConfig()",
             "--gin.DATASET_CONFIG='nope'", "--gin.DATA_DIR='{tmp}/tfds'"),
            "pau/nope is not built under {tmp}/tfds",
        ),
        (
            "unwritable run_dir",
            (*TINY, "--run_dir={tmp}/a_file/run"),
            "cannot write the run directory {tmp}/a_file/run: Not a directory",
        ),
        ("missing judge seat", (*TINY, "--gin.pau_jax.experiment.evaluate.judge=None"),
         "no judge is set: give a checkpoint or an endpoint"),
    ],
)  # fmt: skip
def test_input_errors_are_short_without_traceback(case, args, message, tmp_path):
    (tmp_path / "a_file").write_text("")
    args = [a.format(tmp=tmp_path) for a in args]
    if not any(a.startswith("--run_dir=") for a in args):
        args.append(f"--run_dir={tmp_path / 'run'}")
    err = _short(launching.launch(*args, cwd=tmp_path))
    assert message.format(tmp=tmp_path) in err, case


def _launch_with_env(*args, cwd, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pau_jax.launch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", **env},
    )


def test_traceback_flag_and_variable_show_the_full_traceback(tmp_path):
    args = (*TINY, "--gin.pau_jax.experiment.evaluate.judge=None", f"--run_dir={tmp_path}/r")
    for extra, env in ((("--traceback",), {}), ((), {"PAU_TRACEBACK": "1"})):
        proc = _launch_with_env(*args, *extra, cwd=tmp_path, env=env)
        assert proc.returncode != 0
        assert "Traceback (most recent call last)" in proc.stderr, (extra, env)
        assert "no judge is set" in proc.stderr


def test_unexpected_errors_keep_their_traceback(tmp_path):
    # A TypeError inside the code (a worker count that is a string) is not an input check.
    binding = "--gin.pau_jax.experiment.evaluate.sandbox_workers='two'"
    proc = launching.launch(*TINY, binding, f"--run_dir={tmp_path}/r", cwd=tmp_path)
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr and "TypeError" in proc.stderr


def test_which_errors_count_as_configuration_or_input_errors():
    def raised(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001  (any exception: that is the point)
            return e
        raise AssertionError("nothing raised")

    def fetch_error():
        raise FetchError("no route to PyPI")

    def endpoint_error():
        raise EndpointError(url="http://127.0.0.1:9/v1", error="connection refused", seat="judge")

    user = [
        raised(lambda: experiment.run_defaults(run_mode="evl")),  # A ValueError of a check here.
        raised(lambda: open("/no/such/file")),
        raised(fetch_error),
        raised(endpoint_error),
    ]

    def broken_invariant():
        assert 1 + 1 == 3, "an invariant of the code"

    internal = [
        raised(broken_invariant),
        raised(lambda: np.zeros(2) + np.zeros(3)),  # A ValueError inside NumPy.
        raised(lambda: [][0]),
        raised(lambda: int(None)),
    ]
    assert all(launch._is_user_error(e) for e in user), user
    assert not any(launch._is_user_error(e) for e in internal), internal
