"""Safetensors checkpoints in and out of NNX models under Hugging Face tensor names.

An NNX parameter path maps to a Hugging Face name by joining its parts with dots
and renaming the leaf: ``kernel`` (an [in, out] linear kernel, transposed to
torch's [out, in]), ``embedding`` and ``weight`` all become ``weight``. So
``model.layers.0.self_attn.q_proj.kernel`` is ``model.layers.0.self_attn.q_proj.weight``.
"""

import dataclasses
import json
import pathlib
from collections.abc import Collection, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from flax import nnx

from pau_jax.models import sharding

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(jnp.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Entry:
    file: pathlib.Path
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def _read_header(file: pathlib.Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the byte offset where its data starts."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


class SafetensorsReader:
    """Named tensors of one or more safetensors files, memory-mapped (see ``open_checkpoint``)."""

    def __init__(self, files: list[pathlib.Path], *, source: str | pathlib.Path):
        self.source = source
        self._entries: dict[str, _Entry] = {}
        self._buffers: dict[pathlib.Path, np.memmap] = {}
        for file in files:
            header, data_start = _read_header(file)
            for name, info in header.items():
                if info["dtype"] not in _DTYPES:
                    raise ValueError(
                        f"tensor {name!r} in {file} has unsupported dtype {info['dtype']}"
                    )
                begin, end = info["data_offsets"]
                self._entries[name] = _Entry(
                    file=file,
                    dtype=_DTYPES[info["dtype"]],
                    shape=tuple(info["shape"]),
                    start=data_start + begin,
                    end=data_start + end,
                )

    @property
    def names(self):
        """The tensor names (a set-like view)."""
        return self._entries.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name].shape

    def file(self, name: str) -> pathlib.Path:
        return self._entries[name].file

    def array(self, name: str) -> np.ndarray:
        """A read-only view of tensor ``name`` over the memory-mapped file."""
        entry = self._entries[name]
        if entry.file not in self._buffers:
            self._buffers[entry.file] = np.memmap(entry.file, dtype=np.uint8, mode="r")
        raw = self._buffers[entry.file][entry.start : entry.end]
        return raw.view(entry.dtype).reshape(entry.shape)


def open_checkpoint(directory: str | pathlib.Path) -> SafetensorsReader:
    """The reader of a checkpoint directory: ``model.safetensors``, or an index and its shards."""
    directory = pathlib.Path(directory)
    index = directory / INDEX_FILE
    if not index.exists():
        if not (directory / SINGLE_FILE).exists():
            raise FileNotFoundError(
                f"{directory} has neither {SINGLE_FILE} nor {INDEX_FILE}; "
                "pass a Hugging Face checkpoint directory"
            )
        return SafetensorsReader([directory / SINGLE_FILE], source=directory)
    weight_map = json.loads(index.read_text())["weight_map"]
    files = sorted({directory / name for name in weight_map.values()})
    for file in files:
        if not file.exists():
            raise FileNotFoundError(f"{index} names {file.name}, which does not exist")
    reader = SafetensorsReader(files, source=directory)
    for name, file_name in weight_map.items():
        if name not in reader.names or reader.file(name).name != file_name:
            raise ValueError(f"{index} places {name!r} in {file_name}, which does not hold it")
    return reader


def hf_name(path: tuple) -> tuple[str, bool]:
    """The Hugging Face tensor name of an NNX parameter path, and whether to transpose it."""
    *modules, leaf = (str(part) for part in path)
    prefix = ".".join(modules)
    if leaf == "kernel":
        return f"{prefix}.weight", True
    if leaf in ("embedding", "weight"):
        return f"{prefix}.weight", False
    raise ValueError(f"parameter {'.'.join(map(str, path))} has no Hugging Face name")


def iter_params(model: nnx.Module) -> Iterator[tuple[tuple, nnx.Variable]]:
    """The model's base parameters (its ``nnx.Param`` objects, not LoRA ones) in graph order."""
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Variable):
            if isinstance(node, nnx.LoRAParam):
                continue
            if not isinstance(node, nnx.Param):
                raise ValueError(f"state {path} is a {type(node).__name__}, not a parameter")
            yield path, node


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def load_into(
    model: nnx.Module,
    directory: str | pathlib.Path,
    *,
    dtype,
    mesh: jax.sharding.Mesh | None = None,
    rules: sharding.Rules = sharding.LOGICAL_RULES,
    ignore: Collection[str] = (),
) -> None:
    """Fills every parameter of ``model`` (abstract or not) from a checkpoint, in place.

    Checks names and shapes from the file headers before reading any data. Each
    tensor is memory-mapped, transposed and converted on the host, then placed on
    the default device (``mesh=None``) or straight into its sharding, reading
    only the slices each device holds.

    Args:
      model: usually from ``nnx.eval_shape``; parameters carry logical axis names.
      directory: a checkpoint directory (``model.safetensors`` or an index and shards).
      dtype: parameter dtype after loading.
      mesh: optional mesh; logical axes are mapped to its axes by ``rules``.
      rules: logical-to-mesh axis rules.
      ignore: checkpoint tensors that may be present and are not loaded.

    Raises:
      ValueError: a parameter has no tensor, a tensor is unused, or a shape differs.
    """
    reader = open_checkpoint(directory)
    wanted = {}
    for path, var in iter_params(model):
        name, transpose = hf_name(path)
        wanted[name] = (var, transpose)
    missing = [n for n in wanted if n not in reader.names]
    if missing:
        raise ValueError(
            f"checkpoint {reader.source} lacks {len(missing)} tensor(s) the model needs: "
            f"{_names(missing)}; check that the checkpoint matches its config.json"
        )
    unused = sorted(reader.names - set(wanted) - set(ignore))
    if unused:
        raise ValueError(
            f"checkpoint {reader.source} has {len(unused)} tensor(s) the model does not use: "
            f"{_names(unused)}; it is not a checkpoint of this architecture"
        )
    for name, (var, transpose) in wanted.items():
        expected = tuple(var.shape[::-1]) if transpose else tuple(var.shape)
        if reader.shape(name) != expected:
            raise ValueError(
                f"tensor {name!r} in {reader.file(name)} has shape {reader.shape(name)}, "
                f"but the config needs {expected}; check config.json against the weights"
            )
    target = np.dtype(dtype)
    for name, (var, transpose) in wanted.items():
        host = reader.array(name)
        if transpose:
            host = host.T
        if mesh is None:
            value = jax.device_put(np.ascontiguousarray(host, dtype=target))
        else:
            placement = sharding.named_sharding(
                var.get_metadata().get("out_sharding"), var.shape, mesh, rules
            )
            value = jax.make_array_from_callback(
                tuple(var.shape),
                placement,
                lambda index, host=host: np.ascontiguousarray(host[index], dtype=target),
            )
        var.set_value(value)


def hf_state_dict(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's base parameters as host arrays under Hugging Face names ([out, in] kernels)."""
    tensors = {}
    for path, var in iter_params(model):
        name, transpose = hf_name(path)
        array = np.asarray(jax.device_get(var[...]))
        tensors[name] = np.ascontiguousarray(array.T if transpose else array)
    return tensors


def write_safetensors(
    tensors: dict[str, np.ndarray],
    directory: str | pathlib.Path,
    *,
    max_shard_bytes: int | None = None,
) -> list[pathlib.Path]:
    """Writes ``model.safetensors``, or shards and an index when ``max_shard_bytes`` is exceeded.

    Returns:
      The safetensors files written.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    groups: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        if max_shard_bytes is not None and groups[-1] and size + array.nbytes > max_shard_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = array
        size += array.nbytes
    metadata = {"format": "pt"}
    if len(groups) == 1:
        path = directory / SINGLE_FILE
        safetensors.numpy.save_file(groups[0], str(path), metadata=metadata)
        return [path]
    paths, weight_map = [], {}
    for i, group in enumerate(groups):
        path = directory / f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        safetensors.numpy.save_file(group, str(path), metadata=metadata)
        paths.append(path)
        weight_map.update({name: path.name for name in group})
    index = {
        "metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
        "weight_map": weight_map,
    }
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return paths
