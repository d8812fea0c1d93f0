"""Runs `python -m pau_jax.launch` in a subprocess the way a user would, for end-to-end tests."""

import json
import pathlib
import signal
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env(cwd) -> dict:
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "JAX_PLATFORMS": "cpu",
        "PAU_JAX_COMPILATION_CACHE": str(pathlib.Path(cwd) / "xla_cache"),
    }


def launch(*args: str, cwd, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m pau_jax.launch *args` from `cwd` on the CPU, with a minimal environment.

    Compiled programs are cached in `cwd`/xla_cache, not in the user's cache.
    """
    return subprocess.run(
        [sys.executable, "-m", "pau_jax.launch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(cwd),
    )


def _interruptible() -> None:
    """In the child before it runs: Ctrl-C as at a terminal, even when the tests themselves
    were started in the background (``&`` and ``nohup`` leave SIGINT ignored, and a child
    inherits that, so `launch` would rightly ignore it too)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args: str, cwd) -> subprocess.Popen:
    """`launch` started in the background: stdout and stderr are pipes (text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pau_jax.launch", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(cwd),
        preexec_fn=_interruptible,
    )


def checkpoint_folder(folder: pathlib.Path) -> pathlib.Path:
    """A folder the dry run takes for a checkpoint (config.json, whole safetensors weights)."""
    import numpy as np
    import safetensors.numpy

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    weights = {"w": np.zeros((4, 4), np.float32)}
    safetensors.numpy.save_file(weights, str(folder / "model.safetensors"))
    return folder


def built_dataset(data_dir: pathlib.Path, config: str = "default", splits=("test", "train")) -> str:
    """`data_dir` with what marks `pau/<config>` built for the dry run (its dataset_info.json)."""
    version = pathlib.Path(data_dir) / "pau" / config / "1.0.0"
    version.mkdir(parents=True, exist_ok=True)
    info = {"name": "pau", "splits": [{"name": s} for s in splits]}
    (version / "dataset_info.json").write_text(json.dumps(info))
    return str(data_dir)


def dry_run_inputs(tmp_path: pathlib.Path) -> tuple[str, str]:
    """`--gin.CHECKPOINT` and `--gin.DATA_DIR` flags naming inputs that pass the dry run's checks."""
    ckpt = checkpoint_folder(tmp_path / "dry_run_checkpoint")
    return f"--gin.CHECKPOINT='{ckpt}'", f"--gin.DATA_DIR='{built_dataset(tmp_path / 'tfds')}'"
