"""What a run directory records about the run: config.gin and run_info.json, and putting them back.

`record_run` writes the configuration, the git commit, the package versions, the
command line and the host before a run starts; `restore_records` puts back what it
replaced when the entry refuses the directory (`run_claim.RunDirError`).
"""

import json
import pathlib
import platform
import subprocess
import sys
import time

# The checkout whose commit a run records.
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "numpy")

# What `record_run` writes into the run directory.
RECORDS = ("config.gin", "run_info.json")


def make_run_dir(run_dir: pathlib.Path) -> None:
    """Makes the run directory; a one-line `ConfigError` when it cannot be made."""
    from pau_jax import config_check

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise config_check.ConfigError(
            f"cannot write the run directory {run_dir}: {e.strerror or e}; "
            "pass a writable --run_dir"
        ) from e


def record_run(run_dir: pathlib.Path, gin_text: str) -> dict[str, bytes | None]:
    """Writes what ran: config, commit, versions, command line, host.

    Returns:
      The records it replaced (file name -> contents, None where there was none).
    """
    from importlib import metadata

    replaced = {name: _read_bytes(run_dir / name) for name in RECORDS}
    (run_dir / "config.gin").write_text(gin_text)
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    if len(commit) != 40:
        commit = ""  # Not a git checkout, or no commit yet.
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    info = {
        "argv": sys.argv,
        "git_commit": commit or None,
        "python": platform.python_version(),
        "host": platform.node(),
        "packages": versions,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return replaced


def _read_bytes(path: pathlib.Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def restore_records(run_dir: pathlib.Path, replaced: dict[str, bytes | None]) -> None:
    """Puts back the records `record_run` replaced (a refused run leaves none of its own)."""
    for name, data in replaced.items():
        if data is None:
            (run_dir / name).unlink(missing_ok=True)
        else:
            (run_dir / name).write_bytes(data)
