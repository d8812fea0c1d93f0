"""A run directory's claim: the settings its results come from, and the one process writing it.

    with run_claim.claim(run_dir, kind="eval", settings={"agent": policy, ...}):
        ...  # run, resume and write results

Every run mode that resumes from its run directory (evaluation, AAC training,
distillation) holds it this way for the whole run:

- ``run.lock`` is locked with ``fcntl.flock`` (exclusive, not waiting) and records
  the holder's pid, host and start time. A second process that claims the
  directory stops with a one-line ``RunDirError`` naming the holder. The kernel
  ends the lock with its process, so a run killed at any moment (even by
  SIGKILL) leaves no stale lock: the next run simply takes it. Within one
  process the lock is re-entrant (the launcher holds it around the entry
  function, which claims it again).
- ``fingerprint.json`` is written at the first claim: a stable JSON of the
  settings that produce the results, built from the frozen config dataclasses
  (``fingerprint``). A later claim with other settings, on a folder that holds
  results, stops with a one-line ``RunDirError`` naming each field that differs
  (``old -> new``), so results are never resumed, or reported, under settings that
  did not produce them; while the folder holds no results yet (a start that failed
  early, e.g. on a mistyped path), a corrected rerun simply replaces it. Settings
  that may change on resume (limits, batching, memory budgets, worker counts,
  steps to run) are left out: the callers leave out such arguments, and
  ``RESUMABLE_FIELDS`` such fields of the config classes.

Paths are compared, not the files they name: an adapter folder rewritten in place
between two runs is not noticed. Constants that gin binds into a function passed
as a setting (e.g. a credit rule's ``gamma``) are not seen either; ``config.gin``
records them. This module imports nothing of pau_jax; config classes are named by
their module and qualified name.
"""

import contextlib
import dataclasses
import enum
import fcntl
import functools
import hashlib
import json
import math
import os
import pathlib
import platform
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

FINGERPRINT_FILE = "fingerprint.json"
LOCK_FILE = "run.lock"

# Files a run directory may hold before its run first claims it: what the launcher records.
_LAUNCH_FILES = ("config.gin", "run_info.json", "operative_config.gin")

# Fields of config classes that may change when a run resumes and are left out of its
# fingerprint: they change how the results are computed (in which pieces, with how much
# memory, how patiently), not which results are computed. "module.Class" -> field names.
RESUMABLE_FIELDS = {
    # The prefix cache's memory: the same replies, with more or less of each prompt prefilled.
    "pau_jax.policy.backends.LocalBackendConfig": ("prefix_cache_gib",),
    # How an endpoint is reached, not what it answers; the key is a secret, never written.
    "pau_jax.policy.http.HTTPConfig": (
        "api_key",
        "max_concurrency",
        "timeout_s",
        "max_retries",
        "backoff_s",
    ),
    "pau_jax.policy.embeddings.LocalEmbeddingConfig": ("batch_size", "pad_to_multiple"),
    "pau_jax.policy.embeddings.HTTPEmbeddingConfig": (
        "api_key",
        "batch_size",
        "timeout_s",
        "max_retries",
        "backoff_s",
    ),
    # How a missing split is built, not which split is read.
    "pau_jax.tasks.DatasetConfig": ("build_if_missing", "manual_dir"),
    # Prompts per policy call.
    "pau_jax.evaluation.memory_baseline.MemoryConfig": ("batch_size",),
    # A sandbox call's wall-clock limit (machine-dependent), calls in flight, cache memory.
    "pau_jax.rl.rollout.RolloutConfig": (
        "call_timeout_s",
        "max_parallel_calls",
        "prefix_cache_gib",
    ),
    "pau_jax.rl.critic.CriticConfig": ("prefix_cache_gib",),
    # The same gradient computed in other pieces (micro-batches, logit chunks, recomputation).
    "pau_jax.rl.learner.LearnerConfig": (
        "micro_batch_size",
        "logits_chunk_tokens",
        "remat",
        "remat_min_tokens",
    ),
    "pau_jax.sft.trainer.SFTConfig": ("micro_batch_size", "pad_to_multiple", "logits_chunk_tokens"),
}

# Fields of any config class that name a file or folder: written resolved (absolute, links
# followed) when the path exists, as given otherwise (a hub id, 'qwen3-offline').
PATH_FIELDS = ("checkpoint", "checkpoint_dir", "adapter_dir", "data_dir", "tokenizer")

# A memory address in a repr (" at 0x7f..."), which differs from process to process.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

# Longest value shown in a refusal; longer ones are cut with '...'.
_SHOWN_CHARS = 160


class RunDirError(RuntimeError):
    """A run directory that this run may not write: in use, or holding other settings' results.

    The message is one line: what is wrong and how to start a new run directory.
    """


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _path(value):
    if not isinstance(value, str) or not value:
        return value
    path = pathlib.Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


def _callable_name(fn) -> str:
    fn = getattr(fn, "__wrapped__", fn)  # A function as gin wraps it.
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', None) or '?'}.{name}"


def plain(value, *, where: str = "settings", opaque: Callable[[Any], Any] | None = None):
    """``value`` as plain JSON values, the same for equal settings in every process.

    A dataclass becomes an object with its class (``"class"``) and its fields but
    those of ``RESUMABLE_FIELDS``, path fields resolved (``PATH_FIELDS``); tuples
    become lists, sets sorted lists, mappings with other than string keys sorted
    [key, value] pairs; a function its module and name (a ``functools.partial`` with
    its arguments); non-finite floats strings.

    Args:
      value: the settings.
      where: the path of ``value`` in the settings, for the error.
      opaque: what another object becomes (default: a TypeError naming ``where``).
    """
    recurse = functools.partial(plain, opaque=opaque)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, enum.Enum):
        return f"{_class_name(type(value))}.{value.name}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        skip = RESUMABLE_FIELDS.get(_class_name(cls), ())
        out = {"class": _class_name(cls)}
        for field in dataclasses.fields(value):
            if field.name in skip:
                continue
            item = getattr(value, field.name)
            if field.name in PATH_FIELDS:
                item = _path(item)
            out[field.name] = recurse(item, where=f"{where}.{field.name}")
        return out
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {k: recurse(v, where=f"{where}.{k}") for k, v in value.items()}
        pairs = [[recurse(k, where=where), recurse(v, where=where)] for k, v in value.items()]
        return sorted(pairs, key=_canonical)
    if isinstance(value, list | tuple):
        return [recurse(v, where=f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, set | frozenset):
        return sorted((recurse(v, where=where) for v in value), key=_canonical)
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, functools.partial):
        return {
            "function": _callable_name(value.func),
            "args": recurse(value.args, where=where),
            "keywords": recurse(value.keywords, where=where),
        }
    if callable(value) and hasattr(getattr(value, "__wrapped__", value), "__qualname__"):
        return _callable_name(value)
    if opaque is not None:
        return opaque(value)
    raise TypeError(
        f"{where}: a value of type {type(value).__name__} cannot be part of a run's fingerprint"
    )


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def digest(value) -> str:
    """``sha256:<hex>`` of ``value``'s plain JSON (for settings too long to show, e.g. task lists).

    Other objects count by their ``repr``, memory addresses removed (the same in every process).
    """
    text = _canonical(plain(value, opaque=lambda v: _ADDRESS.sub("", repr(v))))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def fingerprint(kind: str, settings: Mapping[str, Any]) -> dict:
    """The fingerprint of a run: its run mode and the plain JSON of its settings (``plain``)."""
    return {"kind": kind, "settings": plain(dict(settings))}


def _show(value) -> str:
    if isinstance(value, dict) and "class" in value:
        return value["class"].rsplit(".", 1)[-1] + "(...)"
    text = _canonical(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def differences(old, new, where: str = "") -> list[str]:
    """``'<field>: <old> -> <new>'`` for each field whose value differs, depth first.

    Objects of one class (and the top level) are compared field by field; a field
    that only one side has came or went with a change of the code, which is not part
    of a fingerprint, and is not compared. Any other difference is shown whole.
    """
    both = isinstance(old, dict) and isinstance(new, dict)
    if both and ("class" in old and old["class"] == new.get("class") or not where):
        out = []
        for key in [k for k in new if k in old and k != "class"]:
            out += differences(old[key], new[key], f"{where}.{key}" if where else key)
        return out
    return [] if old == new else [f"{where}: {_show(old)} -> {_show(new)}"]


# Run directories whose lock this process holds: resolved lock file -> [fd, depth].
_HELD: dict[str, list[int]] = {}
_HELD_GUARD = threading.Lock()


def _holder(fd: int) -> str:
    """Who holds a lock, as its lock file says (the holder may not have written it yet)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"null")
        return f"pid {info['pid']} on {info['host']}, since {info['started']}"
    except (ValueError, TypeError, KeyError):
        return "its holder not recorded yet"


@contextlib.contextmanager
def lock(run_dir: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Holds ``run_dir``'s lock while the block runs (the folder is made if missing).

    Raises:
      RunDirError: another process holds it.
    """
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    key = str(path.resolve())
    with _HELD_GUARD:
        if key in _HELD:
            _HELD[key][1] += 1
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise RunDirError(
                    f"{run_dir} is in use by another run ({holder}); wait for it to end, or "
                    "write this run to another directory (--run_dir)"
                ) from None
            info = {"pid": os.getpid(), "host": platform.node(), "started": _now()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
            _HELD[key] = [fd, 1]
    try:
        yield run_dir
    finally:
        with _HELD_GUARD:
            _HELD[key][1] -= 1
            if not _HELD[key][1]:
                os.close(_HELD.pop(key)[0])  # Closing the file ends the lock.


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _has_results(run_dir: pathlib.Path) -> bool:
    """Whether the folder holds results: a file with contents, other than the launcher's
    records, the lock, the fingerprint and hidden (temporary) files."""
    ignored = {*_LAUNCH_FILES, LOCK_FILE, FINGERPRINT_FILE}
    for path in run_dir.rglob("*"):
        parts = path.relative_to(run_dir).parts
        if parts[0] in ignored or any(part.startswith(".") for part in parts):
            continue
        if path.is_file() and path.stat().st_size > 0:
            return True
    return False


def _write(path: pathlib.Path, data: dict) -> None:
    """Writes JSON under a hidden temporary name, synced, then renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check(run_dir: pathlib.Path, new: dict) -> None:
    """Refuses a fingerprint other than that of the folder's results; else writes ``new``.

    A folder without results yet (a first start, or starts that stopped before writing
    any) takes ``new``. One that holds results but no fingerprint (made by an older
    version) takes it too, with a warning.

    Raises:
      RunDirError: the folder's results come from another run mode or other settings.
    """
    path = run_dir / FINGERPRINT_FILE
    results = _has_results(run_dir)
    start_over = (
        f"write this run to another directory (--run_dir), or delete {run_dir} to start it again"
    )
    if results and path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError as e:  # Written atomically: only an edit by hand can break it.
            raise RunDirError(f"{path} is not JSON ({e}); restore it, or {start_over}") from None
        if old.get("kind") != new["kind"]:
            raise RunDirError(
                f"{run_dir} holds a run of mode {old.get('kind')!r}, not {new['kind']!r}; "
                f"{start_over}"
            )
        changed = differences(old.get("settings", {}), new["settings"])
        if changed:
            raise RunDirError(
                f"{run_dir} holds results of other settings ({'; '.join(changed)}); resuming "
                f"would report them as this run's: {start_over}"
            )
        return
    if results:
        print(
            f"[run] warning: {run_dir} holds results but no {FINGERPRINT_FILE} (made by an "
            "older version); they are taken to come from this run's settings",
            file=sys.stderr,
            flush=True,
        )
    _write(path, {**new, "created": _now()})


@contextlib.contextmanager
def claim(
    run_dir: str | os.PathLike, *, kind: str, settings: Mapping[str, Any], primary: bool = True
) -> Iterator[pathlib.Path]:
    """Holds ``run_dir`` for a run's life: its lock (``lock``), and its fingerprint checked.

    Args:
      run_dir: the run directory (made if missing).
      kind: the run mode ('eval', 'train', 'distill').
      settings: name -> value of everything that produces the run's results (config
        dataclasses, plain values, functions); nothing that may change on resume.
      primary: whether this process writes the run's files; in a multi-process run only
        process 0 does, and only it claims the folder (the others get it unclaimed).

    Raises:
      RunDirError: another process holds the directory, or it holds results of other
        settings (``fingerprint.json``); its results are left as they are.
    """
    new = fingerprint(kind, settings)  # An unsupported value fails before the folder is touched.
    if not primary:
        yield pathlib.Path(run_dir)
        return
    with lock(run_dir) as path:
        _check(path, new)
        yield path
