"""Run-directory files and folders written under a temporary name and renamed into place.

A process killed at any moment leaves each artefact whole or absent, never
half-written: ``replace_text`` (summary.json, ...), ``replace_dir`` (the
exported adapter, ...) and ``random_base_model`` (the random base checkpoint a
run writes for itself, which also rebuilds one left half-written by an older
version that wrote in place). Orbax checkpoints rename their steps into place
themselves (``training.checkpoint``).

    artefacts.replace_text(out / "summary.json", text)
    artefacts.replace_dir(out / "adapter", lambda tmp: lora.export_peft(model, tmp))
    base = artefacts.random_base_model(out / "base_model", model_config, seed=0)
"""

import json
import os
import pathlib
import shutil
from collections.abc import Callable

from pau_jax import hub

# What ``models.random_checkpoint`` writes besides the weights (model files, then tokenizer).
_BASE_FILES = ("config.json", "tokenizer_config.json", "tokenizer.json")


def _hidden(path: pathlib.Path, kind: str) -> pathlib.Path:
    return path.with_name(f".{path.name}.{kind}")


def _fsync(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_text(path: str | pathlib.Path, text: str) -> pathlib.Path:
    """Writes ``text`` to ``.<name>.tmp`` beside ``path``, syncs it and renames it over ``path``."""
    path = pathlib.Path(path)
    tmp = _hidden(path, "tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def replace_dir(path: str | pathlib.Path, fill: Callable[[pathlib.Path], object]) -> pathlib.Path:
    """Fills a fresh ``.<name>.tmp`` folder with ``fill(tmp)`` and renames it to ``path``.

    An existing ``path`` is renamed to ``.<name>.old`` first and deleted after; a
    kill between the two renames leaves ``path`` absent (never partial) until the
    next call, which also removes the leftovers of an interrupted one.

    Args:
      path: the folder to (re)place.
      fill: writes the folder's files into the directory it is given.

    Returns:
      ``path``.
    """
    path = pathlib.Path(path)
    tmp, old = _hidden(path, "tmp"), _hidden(path, "old")
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    tmp.mkdir(parents=True)
    fill(tmp)
    for file in tmp.rglob("*"):
        if file.is_file():
            _fsync(file)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    _fsync(path.parent)
    if old.exists():
        shutil.rmtree(old)
    return path


def base_model_problem(path: str | pathlib.Path) -> str | None:
    """Why a folder written by ``models.random_checkpoint`` is not whole; None when it is."""
    path = pathlib.Path(path)
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        return "no *.safetensors weights"
    for file in weights:
        if not hub.whole_safetensors(file):
            return f"{file.name} is cut short"
    for name in _BASE_FILES:
        if not (path / name).is_file():
            return f"no {name}"
        try:
            json.loads((path / name).read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return f"{name} is cut short"
    return None


def random_base_model(
    path: str | pathlib.Path, model_config, *, seed: int, tag: str = "train"
) -> pathlib.Path:
    """The random base checkpoint at ``path``: written (atomically) unless it is there whole.

    A folder left half-written by a killed process of an older version (which
    wrote in place) is said so in one line and rebuilt: the model is a function
    of ``model_config`` and ``seed``.

    Args:
      path: the checkpoint folder (``<run_dir>/base_model``, ...).
      model_config: the config of the random model (any family's config class).
      seed: the seed of its parameters.
      tag: the prefix of the printed line.

    Returns:
      ``path``.
    """
    from pau_jax import models

    path = pathlib.Path(path)
    if path.exists():
        problem = base_model_problem(path)
        if problem is None:
            return path
        print(
            f"[{tag}] {path} is half-written ({problem}; a process was killed while "
            "writing it): rebuilding it",
            flush=True,
        )
    return replace_dir(path, lambda tmp: models.random_checkpoint(model_config, tmp, seed=seed))
