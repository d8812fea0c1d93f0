"""Resumable JSONL files: records appended durably, read back, a torn tail cut, corrupt lines moved aside.

Every file a run resumes from (episodes, scores, in-context answers, the memory
baseline's stages) holds one JSON object per line, each appended whole and
fsynced. A kill can leave a last line without its newline (a torn tail): `read`
ignores it and `prepare` cuts it before the next append, so its item is redone.
Any other line that is not a JSON object with the required keys is corrupt:
`read` stops with `CorruptRecordError` naming the file and the line, and
`prepare`, which a writer runs before it resumes a file, moves such lines to
`<file>.corrupt` with a warning, so their items are redone and nothing is lost.
"""

import json
import os
import pathlib
import sys
from collections.abc import Iterator, Sequence

SIDECAR_SUFFIX = ".corrupt"


def sidecar(path: str | os.PathLike) -> pathlib.Path:
    """Where `prepare` moves the corrupt lines of `path`: `<path>.corrupt`."""
    path = pathlib.Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


class CorruptRecordError(ValueError):
    """A complete line of a JSONL file that is not a record; the message is one line."""

    def __init__(self, path: pathlib.Path, line: int, reason: str):
        self.path, self.line, self.reason = path, line, reason
        super().__init__(
            f"{path}:{line}: corrupt record ({reason}); fix or delete that line and rerun "
            f"(a rerun of the run that writes this file moves it to {sidecar(path).name} "
            "and redoes its item)"
        )


def _lines(path: pathlib.Path) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, raw line with its newline) of each complete line; not the torn tail."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if raw.endswith(b"\n"):
                yield number, raw


def _parse(raw: bytes, required: Sequence[str]) -> tuple[dict | None, str]:
    """(the record, '') of a non-blank line, or (None, why it is corrupt)."""
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as e:
        return None, f"not JSON: {e.msg} at column {e.colno}"
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    missing = [k for k in required if k not in record]
    if missing:
        return None, "no " + ", ".join(repr(k) for k in missing)
    return record, ""


def read(path: str | os.PathLike, *, required: Sequence[str] = ()) -> list[dict]:
    """The records of a JSONL file, in order; blank lines and a torn last line are skipped.

    Args:
      path: the file (it must exist).
      required: keys every record must have.

    Raises:
      CorruptRecordError: a complete line is not a JSON object with the required keys.
    """
    path = pathlib.Path(path)
    records = []
    for number, raw in _lines(path):
        if not raw.strip():
            continue
        record, reason = _parse(raw, required)
        if record is None:
            raise CorruptRecordError(path, number, reason)
        records.append(record)
    return records


def _fsync_write(path: pathlib.Path, mode: str, data: bytes) -> None:
    with path.open(mode) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def prepare(path: str | os.PathLike, *, required: Sequence[str] = ()) -> int:
    """Readies `path` for appends: its folder made, a torn tail cut, corrupt lines moved aside.

    Each corrupt line (see `read`) is appended to `sidecar(path)` as it was and
    removed from `path` (rewritten atomically), with a warning on stderr naming
    the file and the line. Returns how many lines were moved.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        return 0
    complete, bad = 0, []
    for number, raw in _lines(path):
        complete += len(raw)
        if raw.strip():
            _, reason = _parse(raw, required)
            if reason:
                bad.append((number, reason))
    if not bad:
        if path.stat().st_size > complete:
            with path.open("r+b") as f:
                f.truncate(complete)
        return 0
    numbers = {number for number, _ in bad}
    kept, moved = [], []
    for number, raw in _lines(path):
        (moved if number in numbers else kept).append(raw)
    _fsync_write(sidecar(path), "ab", b"".join(moved))
    tmp = path.with_name(path.name + ".tmp")
    _fsync_write(tmp, "wb", b"".join(kept))
    tmp.replace(path)
    for number, reason in bad:
        print(
            f"[jsonl] warning: {path}:{number}: corrupt record ({reason}); moved to "
            f"{sidecar(path).name}, its item will be redone",
            file=sys.stderr,
            flush=True,
        )
    return len(bad)


def set_aside(path: str | os.PathLike, stale, *, suffix: str, why: str) -> int:
    """Moves the records for which ``stale(record)`` is true to ``<path><suffix>``.

    For records that are whole but no longer belong (a score of an episode since redone):
    they are appended to the side file as they were, ``path`` is rewritten atomically
    without them, and one warning on stderr says how many and ``why``. ``path`` must have
    been ``prepare``d. Returns how many were moved.
    """
    path = pathlib.Path(path)
    if not path.exists():
        return 0
    kept, moved = [], []
    for _, raw in _lines(path):
        record, reason = _parse(raw, ()) if raw.strip() else (None, "blank")
        (moved if record is not None and not reason and stale(record) else kept).append(raw)
    if not moved:
        return 0
    side = path.with_name(path.name + suffix)
    _fsync_write(side, "ab", b"".join(moved))
    tmp = path.with_name(path.name + ".tmp")
    _fsync_write(tmp, "wb", b"".join(kept))
    tmp.replace(path)
    print(
        f"[jsonl] warning: {path}: {len(moved)} record{'s' if len(moved) != 1 else ''} moved to "
        f"{side.name} ({why})",
        file=sys.stderr,
        flush=True,
    )
    return len(moved)


def append(path: str | os.PathLike, records: Sequence[dict]) -> None:
    """Appends records, one JSON line each, flushed and fsynced."""
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    _fsync_write(pathlib.Path(path), "ab", data.encode())


def corrupt_counts(folder: str | os.PathLike) -> dict[str, int]:
    """File (relative to `folder`) -> lines moved aside from it so far, for every sidecar below `folder`."""
    folder = pathlib.Path(folder)
    counts = {}
    for side in sorted(folder.rglob("*" + SIDECAR_SUFFIX)):
        n = side.read_bytes().count(b"\n")
        if n:
            counts[str(side.relative_to(folder))[: -len(SIDECAR_SUFFIX)]] = n
    return counts
