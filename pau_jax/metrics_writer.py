"""Training metrics to ``metrics.jsonl`` (one flushed JSON line per write) and TensorBoard scalars.

    with MetricsWriter(run_dir, resume_step=latest_checkpoint_step or 0) as writer:
        writer.write(step, {"train/loss": loss, "rollout/reward_mean": reward})

Values may be Python, NumPy or JAX scalars (or one-element arrays); strings go
to the JSON line only. Only process 0 of a multi-host run writes anything, so
every process can call ``write`` with the same metrics.

Resuming: a run that restarts from its checkpoint of step N opens the writer
with ``resume_step=N``. Rows of later steps (written by a process that stopped
before it checkpointed them) are dropped from ``metrics.jsonl``, which is
replaced atomically, and the TensorBoard events are rebuilt from the rows kept,
so every step is logged once however often the run was killed. A row torn by a
kill in the middle of a write is dropped too.
"""

import json
import numbers
import os
import pathlib
import time
import uuid
from typing import Any

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"
EVENTS_GLOB = "events.out.tfevents.*"


def _scalar(name: str, value: Any) -> bool | int | float | str:
    """A metric value as a plain Python scalar."""
    if isinstance(value, str | bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    array = np.asarray(jax.device_get(value))
    if array.size != 1:
        raise ValueError(f"metric {name!r} has shape {array.shape}; write scalars only")
    item = array.reshape(()).item()
    if isinstance(item, bool | int | float):
        return item
    raise ValueError(f"metric {name!r} is a {type(value).__name__}, not a number or string")


def read_rows(run_dir: str | pathlib.Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` in file order ([] without the file).

    A last line without its newline (torn by a kill during the write) is left out.

    Raises:
      ValueError: another line is not a JSON object with an integer ``step``.
    """
    return [row for _, row in _lines(pathlib.Path(run_dir) / METRICS_FILE)[0]]


def _lines(path: pathlib.Path) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """((line with its newline, parsed row) of every whole line, whether the last one is torn)."""
    if not path.exists():
        return [], False
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(keepends=True), 1):
        if not line.endswith("\n"):
            return out, True  # The last line of a write cut short by a kill.
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not JSON ({error}); fix or remove it") from error
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path}:{number} has no integer 'step'; fix or remove it")
        out.append((line, row))
    return out, False


def _replace_text(path: pathlib.Path, text: str) -> None:
    """Writes ``text`` to a temporary file beside ``path`` and renames it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class MetricsWriter:
    """Appends metrics of a run to ``run_dir/metrics.jsonl`` and, optionally, TensorBoard.

    Attributes:
      run_dir: the run directory.
      active: whether this process writes (process 0 only).
    """

    def __init__(
        self,
        run_dir: str | pathlib.Path,
        *,
        tensorboard: bool = True,
        resume_step: int | None = None,
    ):
        """Opens the files (on process 0; other processes do nothing).

        Args:
          run_dir: created if missing; an existing ``metrics.jsonl`` is appended to.
          tensorboard: also write event files (tensorboardX) into ``run_dir``; each
            writer starts a new file.
          resume_step: the step the run continues from (its latest checkpoint; 0 for a
            run without one): rows and TensorBoard events of later steps are dropped
            first. None keeps every row.
        """
        self.run_dir = pathlib.Path(run_dir)
        self.active = jax.process_index() == 0
        self._file = None
        self._tensorboard = None
        if not self.active:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / METRICS_FILE
        lines, torn = _lines(path)
        kept = [x for x in lines if resume_step is None or x[1]["step"] <= resume_step]
        lost = sorted({row["step"] for _, row in lines} - {row["step"] for _, row in kept})
        rewrite = torn or len(kept) < len(lines)
        if tensorboard:
            import tensorboardX

            old_events = sorted(self.run_dir.glob(EVENTS_GLOB))
            self._tensorboard = tensorboardX.SummaryWriter(
                logdir=str(self.run_dir), filename_suffix=f".{uuid.uuid4().hex[:12]}"
            )
            if rewrite:
                # Rebuilt before the rows are cut, so a kill in between redoes it on the next open.
                for _, row in kept:
                    self._add_scalars(row["step"], row, walltime=row.get("time"))
                self._tensorboard.flush()
                for old_file in old_events:
                    old_file.unlink()
        if rewrite:
            _replace_text(path, "".join(line for line, _ in kept))
            shown = ", ".join(map(str, lost[:5])) + (", ..." if len(lost) > 5 else "")
            print(
                f"[metrics] {path}: dropped "
                + (f"the rows of steps after {resume_step} ({shown})" if lost else "")
                + (" and " if lost and torn else "")
                + ("a torn last row" if torn else ""),
                flush=True,
            )
        self._file = open(path, "a", encoding="utf-8")

    def _add_scalars(self, step: int, values: dict[str, Any], *, walltime=None) -> None:
        for name, value in values.items():
            if name in ("step", "time") or isinstance(value, str):
                continue
            self._tensorboard.add_scalar(name, float(value), global_step=step, walltime=walltime)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Writes the metrics of one step: a JSON line ``{"step": ..., "time": ..., **metrics}``.

        Raises:
          ValueError: a value is not a scalar, or a name is "step" or "time".
          RuntimeError: the writer is closed.
        """
        if not self.active:
            return
        if self._file is None:
            raise RuntimeError("MetricsWriter.write after close()")
        clash = {"step", "time"} & set(metrics)
        if clash:
            raise ValueError(f"metric names {sorted(clash)} are reserved; rename them")
        step = int(step)
        values = {str(name): _scalar(str(name), value) for name, value in metrics.items()}
        record = {"step": step, "time": time.time(), **values}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            self._add_scalars(step, values)
            self._tensorboard.flush()

    def close(self) -> None:
        """Flushes and closes the files; further writes raise."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
