"""Runs `python -m pau_jax.launch` in a subprocess the way a user would, for end-to-end tests."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "JAX_PLATFORMS": "cpu",
            "PAU_JAX_COMPILATION_CACHE": str(pathlib.Path(cwd) / "xla_cache"),
        },
    )
