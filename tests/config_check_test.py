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


# --dry_run checks what the run mode requires.


def test_dry_run_refuses_a_missing_seat_in_one_line(tmp_path):
    proc = launching.launch(
        *TINY, "--gin.pau_jax.experiment.evaluate.judge=None", "--dry_run", cwd=tmp_path
    )
    err = _short(proc, max_lines=1)
    assert "evaluate.judge" in err and "coder" not in err
    assert "evaluate.judge = None" in proc.stdout  # The configuration is still printed.


def test_dry_run_names_the_required_macros_of_a_template(tmp_path):
    err = _short(launching.launch("--gin_file=eval/interactive.gin", "--dry_run", cwd=tmp_path), 1)
    for flag in ("--gin.JUDGE", "--gin.CODER", "--gin.CHECKPOINT"):
        assert flag in err, flag
    # A judge on a local checkpoint needs the judge's checkpoint too; nothing is loaded.
    proc = launching.launch(
        "--gin_file=eval/interactive.gin",
        "--gin.CHECKPOINT='/no/such/checkpoint'",
        "--gin.JUDGE=@judge/pau_jax.policy.backends.LocalBackendConfig()",
        "--gin.CODER='self'",
        "--dry_run",
        cwd=tmp_path,
    )
    err = _short(proc, max_lines=1)
    assert "judge/LocalBackendConfig.checkpoint_dir (set --gin.JUDGE_CHECKPOINT" in err
    assert "JUDGE " not in err and "CODER" not in err


def test_dry_run_refuses_a_missing_distillation_teacher(tmp_path):
    files = ("--gin_file=aac.gin", "--gin_file=ablations/distill.gin")
    err = _short(launching.launch(*files, "--dry_run", cwd=tmp_path), max_lines=1)
    assert "distill.teacher (set --gin.TEACHER" in err


@pytest.mark.parametrize(
    "args",
    [
        ("--gin_file=eval/interactive.gin", "--gin.CHECKPOINT='/no/such/checkpoint'",
         "--gin.JUDGE='self'", "--gin.CODER='self'"),
        ("--gin_file=eval/gold.gin", "--gin.CHECKPOINT='/no/such/checkpoint'",
         "--gin.CODER='self'"),
        TINY,
        ("--gin_file=aac.gin", "--gin_file=ablations/distill.gin", "--gin.TEACHER='self'"),
    ],
)  # fmt: skip
def test_dry_run_passes_when_everything_required_is_set(args, tmp_path):
    proc = launching.launch(*args, "--dry_run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""


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
