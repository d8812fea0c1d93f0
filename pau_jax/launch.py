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

Ctrl-C (SIGINT) stops the run: the code running is interrupted and the run's context
managers close its files (checkpoints and records are written as the run goes), then
one line on stderr says what the run directory keeps and how to resume, and the exit
status is 130. A run that has not stopped `STOP_GRACE_S` seconds later (a request to a
hanging endpoint, a long XLA computation), or a second Ctrl-C, exits at once with the
same line: what is on disk is whole either way (atomic writes, orbax's renames).
"""

import contextlib
import importlib.util  # noqa: F401  (gin-config 0.5.0 needs it imported before parsing includes)
import logging as std_logging
import os
import pathlib
import select
import signal
import sys
import threading
import time

from absl import app, flags, logging

from pau_jax import experiment, run_claim, run_records

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
    "and that the checkpoints and dataset splits the run reads are there (nothing is "
    "loaded) and exit; non-zero, with one line per problem, when something is missing.",
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

# Seconds a run has to stop after the first Ctrl-C before the process exits anyway.
STOP_GRACE_S = 5.0
# The exit status of an interrupted run (128 + SIGINT, as a shell reports one).
INTERRUPTED_STATUS = 130


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


_SEARCH_PATHS: list[str] = []


def parse_config(gin_files, bindings) -> None:
    """Parses and finalizes gin files (named as for --gin_file) and then bindings, in order.

    Raises:
      config_check.ConfigError: a name that matches nothing, a syntax error, a
        command-line binding or one in the user's own gin files that changes nothing
        (a macro no binding uses), or a macro used in the user's files but never set.
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
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
    except (ValueError, SyntaxError, tokenize.TokenError) as e:
        raise config_check.ConfigError(config_check.explain(e)) from e
    # The user's own files are checked before gin finalizes, which would report a macro
    # that is never set without saying where it is used.
    config_check.check_gin_files([f for f in files if not _shipped(f)], _user_include)
    try:
        gin.finalize()
    except ValueError as e:
        raise config_check.ConfigError(config_check.explain(e)) from e
    config_check.check_command_line(bindings)


def _shipped(path: str) -> bool:
    return pathlib.Path(path).resolve().is_relative_to(GIN_DIR)


def _user_include(name: str) -> str | None:
    """The user's file that `include 'name'` reads (as gin finds it), None for a shipped one."""
    for candidate in (pathlib.Path(name), GIN_DIR / name):
        if candidate.is_file():
            return None if _shipped(str(candidate)) else str(candidate)
    return None


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


# The run directory of the run in progress (None before it is chosen), for the Ctrl-C line.
_RUN: dict[str, pathlib.Path | None] = {"dir": None}
_INTERRUPT_REPORTED = threading.Lock()


def _saved(run_dir: pathlib.Path) -> str:
    """What `run_dir` keeps that a rerun resumes from, in words."""
    kept = []
    for folder in sorted(run_dir.glob("**/checkpoints")):
        steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()]
        if steps:
            kept.append(f"the checkpoint of step {max(steps)} ({folder})")
    episodes = 0
    for path in run_dir.glob("**/*episodes.jsonl"):
        with path.open("rb") as f:
            episodes += sum(1 for line in f if line.strip())
    if episodes:
        kept.append(f"{episodes} finished episode records")
    return f"{run_dir} keeps " + (" and ".join(kept) or "no finished step or episode yet")


def _report_interrupt() -> None:
    """Writes the one line of an interrupted run (once, whichever thread gets here first)."""
    if not _INTERRUPT_REPORTED.acquire(blocking=False):
        return
    run_dir = _RUN["dir"]
    if run_dir is None:
        line = "interrupted before the run started; nothing was written"
    else:
        again = "" if _RUN_DIR.value else f" with --run_dir={run_dir}"
        line = f"interrupted: {_saved(run_dir)}; rerun the same command{again} to resume"
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)


def _exit_interrupted() -> None:
    """Exits at once with the interrupted run's line and status."""
    _report_interrupt()
    os._exit(INTERRUPTED_STATUS)


def _on_interrupt(signum, frame) -> None:
    """The first Ctrl-C: KeyboardInterrupt in the running code (later ones: `_watch_interrupts`)."""
    signal.signal(signal.SIGINT, lambda *_: None)
    raise KeyboardInterrupt


def _watch_interrupts() -> None:
    """Starts the thread that exits `STOP_GRACE_S` after the first Ctrl-C, or at the second.

    Python runs a signal handler only when the main thread is back in Python code; the
    signal's byte on the wakeup fd reaches this thread at once, even while the main
    thread waits inside a computation or on a hung request.
    """
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def watch():
        while signal.SIGINT not in os.read(read, 64):
            pass
        deadline = time.monotonic() + STOP_GRACE_S
        while (left := deadline - time.monotonic()) > 0:
            if select.select([read], [], [], left)[0] and signal.SIGINT in os.read(read, 64):
                break
        _exit_interrupted()

    threading.Thread(target=watch, name="interrupt-watch", daemon=True).start()


def main(argv):
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # Not ignored (nohup, &).
        signal.signal(signal.SIGINT, _on_interrupt)
        _watch_interrupts()
    try:
        _main(argv)
    except KeyboardInterrupt:
        _report_interrupt()
        sys.exit(INTERRUPTED_STATUS)
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
        problems = [f"not set: {m}" for m in config_check.missing_required(mode, entry_name)]
        problems += config_check.missing_inputs(mode, entry_name)
        if problems:
            raise config_check.ConfigError("\n".join(f"{mode} run: {p}" for p in problems))
        return
    enable_compilation_cache(_COMPILATION_CACHE.value)
    # A multi-process run (explicit PAU_* variables, SLURM, a TPU pod) joins up before any
    # JAX computation; every process runs the same entry, and only process 0 writes run files.
    from pau_jax import parallel

    if parallel.initialize_distributed() and _RUN_DIR.value is None:
        raise app.UsageError("a multi-process run needs --run_dir (the same on every process)")
    primary = parallel.is_primary()
    _RUN["dir"] = run_dir
    with contextlib.ExitStack() as stack:
        if primary:
            run_records.make_run_dir(run_dir)
            # One process writes a run directory: a second launcher stops here, before its
            # records replace those of the run in progress (the entry claims it again).
            stack.enter_context(run_claim.lock(run_dir))
            replaced = run_records.record_run(run_dir, gin.config_str())
            print(f"[launch] {mode} run directory: {run_dir}", flush=True)
        entry = gin.get_configurable(entry_name)
        try:
            entry(run_dir=str(run_dir))
        except run_claim.RunDirError:
            if primary:  # The records stay those of the run whose results the folder holds.
                run_records.restore_records(run_dir, replaced)
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
