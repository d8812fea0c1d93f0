"""Training metrics to ``metrics.jsonl`` (one flushed JSON line per write) and TensorBoard scalars.

    with MetricsWriter(run_dir) as writer:
        writer.write(step, {"train/loss": loss, "rollout/reward_mean": reward})

Values may be Python, NumPy or JAX scalars (or one-element arrays); strings go
to the JSON line only. Only process 0 of a multi-host run writes anything, so
every process can call ``write`` with the same metrics.
"""

import json
import numbers
import pathlib
import time
from typing import Any

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"


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


class MetricsWriter:
    """Appends metrics of a run to ``run_dir/metrics.jsonl`` and, optionally, TensorBoard.

    Attributes:
      run_dir: the run directory.
      active: whether this process writes (process 0 only).
    """

    def __init__(self, run_dir: str | pathlib.Path, *, tensorboard: bool = True):
        """Opens the files (on process 0; other processes do nothing).

        Args:
          run_dir: created if missing; an existing ``metrics.jsonl`` is appended to.
          tensorboard: also write event files (tensorboardX) into ``run_dir``.
        """
        self.run_dir = pathlib.Path(run_dir)
        self.active = jax.process_index() == 0
        self._file = None
        self._tensorboard = None
        if not self.active:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")
        if tensorboard:
            import tensorboardX

            self._tensorboard = tensorboardX.SummaryWriter(logdir=str(self.run_dir))

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
            for name, value in values.items():
                if isinstance(value, str):
                    continue
                self._tensorboard.add_scalar(name, float(value), global_step=step)
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
