"""Command-line entry point: flags, gin parsing, run directory, dispatch by run mode.

Usage:
  python -m pau_jax.launch --gin_file=quickstart.gin
  python -m pau_jax.launch --gin_file=quickstart.gin --gin.pau_jax.experiment.train.steps=5
  python -m pau_jax.launch --gin_file=aac.gin --gin.CHECKPOINT="'/ckpt/Qwen3-1.7B'" --run_dir=runs/aac
  python -m pau_jax.launch --gin_file=quickstart.gin --dry_run   # check and print the config only

Gin files are looked up in the current directory, then in the repository's `gin/`
folder. The operative configuration, the git commit and the package versions are
written into the run directory before anything else happens, once its lock is held:
a second launcher on a run directory in use stops with one line naming the holder,
and a rerun refused for other settings (`run_claim`) leaves the records as they were.

A mistake in the configuration or the input (a misspelled name, a required seat left
unset, a missing checkpoint or dataset) stops the run with a short message on stderr
and exit status 1; `--traceback` (or PAU_TRACEBACK=1) shows the full traceback instead.
"""

import contextlib
import importlib.util  # noqa: F401  (gin-config 0.5.0 needs it imported before parsing includes)
import json
import logging as std_logging
import os
import pathlib
import platform
import subprocess
import sys
import time

from absl import app, flags, logging

from pau_jax import experiment, run_claim

GIN_DIR = pathlib.Path(__file__).resolve().parents[1] / "gin"

_GIN_FILES = flags.DEFINE_multi_string(
    "gin_file", [], "Gin files, parsed in order (later files override earlier ones)."
)
_GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "Individual gin bindings, applied after the files."
)
_RUN_MODE = flags.DEFINE_enum(
    "run_mode",
    None,
    experiment.RUN_MODES,
    "What to run; default: what the gin files bind (`run_defaults.run_mode = 'eval'`), else train.",
)
_RUN_DIR = flags.DEFINE_string(
    "run_dir", None, "Output directory; default runs/<run_mode>-<timestamp>."
)
_DRY_RUN = flags.DEFINE_bool(
    "dry_run",
    False,
    "Parse the configuration, print it, check that the required seats and values are set "
    "(nothing is loaded) and exit; non-zero when something is missing.",
)
_TRACEBACK = flags.DEFINE_bool(
    "traceback",
    os.environ.get("PAU_TRACEBACK", "").strip().lower() in ("1", "true", "yes", "on"),
    "Show the full traceback of configuration and input errors too (default: $PAU_TRACEBACK).",
)
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache_dir",
    os.environ.get("PAU_JAX_COMPILATION_CACHE", "~/.cache/pau_jax/xla"),
    "Where compiled XLA programs are kept between runs (JAX's persistent compilation "
    "cache), so a second run with the same model and shapes skips most compilation; "
    "'' turns it off. Default: $PAU_JAX_COMPILATION_CACHE or ~/.cache/pau_jax/xla.",
)

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "numpy")


def _split_gin_dot_flags(argv):
    """Turns `--gin.X=V` arguments into gin bindings `X = V`; returns (rest, bindings)."""
    rest, bindings = [], []
    for arg in argv:
        if arg.startswith("--gin.") and "=" in arg:
            key, value = arg[len("--gin.") :].split("=", 1)
            bindings.append(f"{key} = {value}")
        else:
            rest.append(arg)
    return rest, bindings


def _resolve_gin_file(name: str) -> str:
    for candidate in (pathlib.Path(name), GIN_DIR / name):
        if candidate.is_file():
            return str(candidate)
    raise app.UsageError(
        f"gin file {name!r} not found in the current directory or in {GIN_DIR}; "
        "pass a path or a name relative to gin/ (e.g. --gin_file=quickstart.gin)"
    )


# What `_record_run` writes into the run directory.
_RECORDS = ("config.gin", "run_info.json")


def _make_run_dir(run_dir: pathlib.Path) -> None:
    """Makes the run directory; a one-line `ConfigError` when it cannot be made."""
    from pau_jax import config_check

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise config_check.ConfigError(
            f"cannot write the run directory {run_dir}: {e.strerror or e}; "
            "pass a writable --run_dir"
        ) from e


def _record_run(run_dir: pathlib.Path, gin_text: str) -> dict[str, bytes | None]:
    """Writes what ran: config, commit, versions, command line, host.

    Returns:
      The records it replaced (file name -> contents, None where there was none).
    """
    from importlib import metadata

    replaced = {name: _read_bytes(run_dir / name) for name in _RECORDS}
    (run_dir / "config.gin").write_text(gin_text)
    try:
        commit = subprocess.run(
            ["git", "-C", str(GIN_DIR.parent), "rev-parse", "HEAD"],
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


def _restore_records(run_dir: pathlib.Path, replaced: dict[str, bytes | None]) -> None:
    """Puts back the records `_record_run` replaced (a refused run leaves none of its own)."""
    for name, data in replaced.items():
        if data is None:
            (run_dir / name).unlink(missing_ok=True)
        else:
            (run_dir / name).write_bytes(data)


_SEARCH_PATHS: list[str] = []


def parse_config(gin_files, bindings) -> None:
    """Parses and finalizes gin files (named as for --gin_file) and then bindings, in order.

    Raises:
      config_check.ConfigError: a name that matches nothing, a syntax error, or a
        command-line binding that changes nothing (a macro no binding uses).
    """
    import tokenize

    import gin

    from pau_jax import config_check

    experiment.register_configurables()
    for path in (str(GIN_DIR), os.getcwd()):
        if path not in _SEARCH_PATHS:
            gin.add_config_file_search_path(path)
            _SEARCH_PATHS.append(path)
    files = [_resolve_gin_file(f) for f in gin_files]
    try:
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=True)
    except (ValueError, SyntaxError, tokenize.TokenError) as e:
        raise config_check.ConfigError(config_check.explain(e)) from e
    config_check.check_command_line(bindings)


def _drop_include_probe_errors(record) -> bool:
    """False for gin's "Path not found" errors, logged while it probes paths for an include."""
    return not (
        record.filename == "resource_reader.py" and record.getMessage().startswith("Path not found")
    )


def _is_user_error(error: BaseException) -> bool:
    """Whether `error` is a mistake in the configuration or the input, shown without traceback.

    These are: usage and configuration errors; the project's one-line errors of a
    checkpoint that cannot be fetched (`FetchError`), of a model endpoint that
    still fails after its retries (`EndpointError`) and of a run directory in use
    or holding other settings' results (`RunDirError`); operating-system errors (a
    missing file or checkpoint, an unwritable directory, a refused connection); and
    ValueErrors raised by this package's or gin's own checks. Anything else (an
    AssertionError, a TypeError, a ValueError from inside JAX or NumPy) is unexpected
    and keeps its traceback.
    """
    import gin

    from pau_jax import config_check
    from pau_jax.policy.http import EndpointError
    from pau_jax.tools.fetch import FetchError

    user = (
        app.UsageError,
        config_check.ConfigError,
        FetchError,
        EndpointError,
        run_claim.RunDirError,
        OSError,
    )
    if isinstance(error, user):
        return True
    if not isinstance(error, ValueError) or error.__traceback__ is None:
        return False
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    raised_in = pathlib.Path(tb.tb_frame.f_code.co_filename).resolve()
    own = (pathlib.Path(__file__).resolve().parent, pathlib.Path(gin.__file__).resolve().parent)
    return any(raised_in.is_relative_to(folder) for folder in own)


def _report(error: BaseException) -> None:
    """Writes the short form of a configuration or input error to stderr."""
    from pau_jax import config_check

    print(f"error: {config_check.explain(error)}", file=sys.stderr)
    if not isinstance(error, (app.UsageError, config_check.ConfigError)):
        print("(--traceback or PAU_TRACEBACK=1 shows where it was raised)", file=sys.stderr)


def main(argv):
    try:
        _main(argv)
    except Exception as e:  # Re-raised unless it is a configuration or input error.
        if _TRACEBACK.value or not _is_user_error(e):
            raise
        _report(e)
        sys.exit(1)


def _main(argv):
    import gin

    from pau_jax import config_check

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        # Library INFO lines (orbax, TFDS) drown the progress lines; --verbosity=0 shows them.
        logging.set_verbosity(logging.WARNING)
    std_logging.getLogger().addFilter(_drop_include_probe_errors)  # gin logs to the root.
    parse_config(_GIN_FILES.value, list(_GIN_BINDINGS.value) + _EXTRA_BINDINGS)
    selected = gin.get_configurable("pau_jax.experiment.run_defaults")()
    mode = _RUN_MODE.value or selected
    if mode != selected:
        logging.warning("--run_mode=%s overrides the gin files' run mode %r", mode, selected)
    run_dir = pathlib.Path(_RUN_DIR.value or f"runs/{mode}-{time.strftime('%Y%m%d-%H%M%S')}")
    entry_name = experiment.entry_name(mode)
    if _DRY_RUN.value:
        print(gin.config_str(), flush=True)
        missing = config_check.missing_required(mode, entry_name)
        if missing:
            raise config_check.ConfigError(f"{mode} run: not set: {'; '.join(missing)}")
        return
    enable_compilation_cache(_COMPILATION_CACHE.value)
    # A multi-process run (explicit PAU_* variables, SLURM, a TPU pod) joins up before any
    # JAX computation; every process runs the same entry, and only process 0 writes run files.
    from pau_jax import parallel

    if parallel.initialize_distributed() and _RUN_DIR.value is None:
        raise app.UsageError("a multi-process run needs --run_dir (the same on every process)")
    primary = parallel.is_primary()
    with contextlib.ExitStack() as stack:
        if primary:
            _make_run_dir(run_dir)
            # One process writes a run directory: a second launcher stops here, before its
            # records replace those of the run in progress (the entry claims it again).
            stack.enter_context(run_claim.lock(run_dir))
            replaced = _record_run(run_dir, gin.config_str())
            print(f"[launch] {mode} run directory: {run_dir}", flush=True)
        entry = gin.get_configurable(entry_name)
        try:
            entry(run_dir=str(run_dir))
        except run_claim.RunDirError:
            if primary:  # The records stay those of the run whose results the folder holds.
                _restore_records(run_dir, replaced)
            raise
        # The operative config lists only what was actually used; write it after the run.
        if primary:
            (run_dir / "operative_config.gin").write_text(gin.operative_config_str())


def enable_compilation_cache(directory: str) -> pathlib.Path | None:
    """Points JAX's persistent compilation cache at `directory` ('' leaves it off).

    Programs that took at least half a second to compile are stored there and loaded by
    later runs with the same program, backend and JAX version instead of being compiled.
    """
    if not directory:
        return None
    import jax

    path = pathlib.Path(directory).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path


_EXTRA_BINDINGS: list[str] = []


def run():
    argv, extra = _split_gin_dot_flags(sys.argv)
    _EXTRA_BINDINGS.extend(extra)
    sys.argv[:] = argv
    app.run(main)


if __name__ == "__main__":
    run()
