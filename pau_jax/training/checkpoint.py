"""Saving and restoring the train state and its JSON side data with orbax, for resumable runs.

Each step is a directory ``<directory>/<step>/`` with two items: ``state``
(the ``training.step.TrainState`` arrays, written by every process for its own
shards; orbax's collective save, so all processes must call ``save`` with the
same step) and ``extra`` (a JSON object written once: rng key data, data
position, config fingerprint, ...). Orbax writes a step into a temporary
directory and renames it when every item is complete, so a crash during a save
leaves the earlier steps intact and the half-written one invisible; leftover
temporary directories are removed when a ``Checkpointer`` opens the directory.

    ckpt = Checkpointer(run_dir / "checkpoints", max_to_keep=3)
    step = ckpt.latest_step()
    if step is not None:
        state, extra = ckpt.restore(step, state)   # state: concrete or abstract target
    ...
    ckpt.save(int(state.step), state, extra={"rng": key_data, "position": n})
    ckpt.close()

Saving is asynchronous: ``save`` returns once the arrays are copied off the
device (so the state may be donated to the next train step right away) and the
files are written in the background; ``wait`` blocks until they are final.
"""

import json
import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from pau_jax.training.step import TrainState

_STATE, _EXTRA = "state", "extra"


def _path_name(path) -> str:
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _leaf_specs(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    """Leaf path name -> (shape, dtype name) of a target tree."""
    return {
        _path_name(path): (tuple(leaf.shape), np.dtype(leaf.dtype).name)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _abstract(tree):
    """ShapeDtypeStructs with shardings; leaves without one go to the first local device."""
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def one(leaf):
        if isinstance(leaf, jax.ShapeDtypeStruct):
            sharding = leaf.sharding if leaf.sharding is not None else default
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        if isinstance(leaf, jax.Array):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
        array = np.asarray(leaf)
        return jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=default)

    return jax.tree.map(one, tree)


class Checkpointer:
    """Orbax ``CheckpointManager`` over a directory of train-state steps.

    Attributes:
      directory: where the step directories live.
    """

    def __init__(self, directory: str | pathlib.Path, *, max_to_keep: int | None = 3):
        """Opens (and creates) the directory.

        Args:
          directory: the checkpoint root; every process of a multi-host run
            must pass the same (shared) path.
          max_to_keep: how many most recent steps to keep; None keeps all.
        """
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.directory = pathlib.Path(directory).absolute()
        policy = None if max_to_keep is None else ocp.checkpoint_managers.LatestN(n=max_to_keep)
        options = ocp.CheckpointManagerOptions(
            create=True,
            cleanup_tmp_directories=True,
            preservation_policy=policy,
            enable_async_checkpointing=True,
        )
        self._manager = ocp.CheckpointManager(
            self.directory,
            item_handlers={
                _STATE: ocp.StandardCheckpointHandler(),
                _EXTRA: ocp.JsonCheckpointHandler(),
            },
            options=options,
        )

    def save(self, step: int, state: TrainState, *, extra: dict[str, Any]) -> None:
        """Starts saving ``state`` and ``extra`` as ``step`` (every process, same step).

        Args:
          step: the step number (a new one, >= 0).
          state: the train state; its arrays may be donated once this returns.
          extra: a JSON-serialisable dict stored beside the arrays.

        Raises:
          ValueError: ``step`` already exists, or ``extra`` is not JSON-serialisable.
        """
        if not isinstance(extra, dict):
            raise ValueError(f"extra must be a dict, got {type(extra).__name__}")
        try:
            json.dumps(extra, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"extra is not JSON-serialisable ({error}); convert arrays to lists"
            ) from error
        step = int(step)
        if step in self.all_steps():
            raise ValueError(f"{self.directory} already holds step {step}; save a new step")
        self._manager.save(
            step,
            args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardSave(state), _EXTRA: ocp.args.JsonSave(extra)}
            ),
            force=True,
        )

    def all_steps(self) -> list[int]:
        """Every finished or started step, ascending."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest step after any save in progress has finished; None when there is none."""
        self.wait()
        return self._manager.latest_step()

    def restore(self, step: int, target_state: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """Reads ``step`` into the structure, shapes, dtypes and shardings of ``target_state``.

        Args:
          step: a saved step (``latest_step()`` for resuming).
          target_state: a ``TrainState`` of arrays or of ``jax.ShapeDtypeStruct``
            (e.g. ``jax.eval_shape`` of ``training.step.init_state``); leaves without a
            sharding are placed on the first local device.

        Returns:
          (the restored state, the step's ``extra`` dict).

        Raises:
          ValueError: the step does not exist, or its arrays do not match the
            target's names, shapes or dtypes.
        """
        self.wait()
        step = int(step)
        steps = self.all_steps()
        if step not in steps:
            raise ValueError(f"{self.directory} has no step {step}; it has {steps}")
        self._check_structure(step, target_state)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{
                    _STATE: ocp.args.StandardRestore(_abstract(target_state)),
                    _EXTRA: ocp.args.JsonRestore(),
                }
            ),
        )
        return restored[_STATE], dict(restored[_EXTRA])

    def _check_structure(self, step: int, target_state: TrainState) -> None:
        metadata = self._manager.item_metadata(step)[_STATE]
        tree = getattr(metadata, "tree", metadata)
        if tree is None:
            raise ValueError(f"{self.directory}/{step} has no '{_STATE}' item; not a train state")
        saved = {
            "/".join(str(k) for k in key): (tuple(leaf.shape), np.dtype(leaf.dtype).name)
            for key, leaf in ocp.tree.to_flat_dict(tree).items()
        }
        wanted = _leaf_specs(target_state)
        missing = sorted(set(wanted) - set(saved))
        unexpected = sorted(set(saved) - set(wanted))
        differ = sorted(k for k in set(saved) & set(wanted) if saved[k] != wanted[k])
        if not (missing or unexpected or differ):
            return
        details = []
        if missing:
            details.append(f"{len(missing)} arrays missing (e.g. {missing[0]})")
        if unexpected:
            details.append(f"{len(unexpected)} unexpected arrays (e.g. {unexpected[0]})")
        if differ:
            name = differ[0]
            details.append(
                f"{len(differ)} arrays of another shape/dtype (e.g. {name}: saved "
                f"{saved[name]}, expected {wanted[name]})"
            )
        raise ValueError(
            f"checkpoint {self.directory}/{step} does not match the train state: "
            + "; ".join(details)
            + " (another model, LoRA setting or optimizer?)"
        )

    def wait(self) -> None:
        """Blocks until every started save is final on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for saves in progress and releases the manager."""
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
