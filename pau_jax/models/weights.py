"""Safetensors checkpoints in and out of NNX models under Hugging Face tensor names.

An NNX parameter path maps to a Hugging Face name by joining its parts with dots
and renaming the leaf: ``kernel`` (an [in, out] linear kernel, transposed to
torch's [out, in]), ``embedding`` and ``weight`` all become ``weight``; a linear
``bias`` [out] keeps its name and layout. So ``model.layers.0.self_attn.q_proj.kernel``
is ``model.layers.0.self_attn.q_proj.weight``.

A kernel whose first logical axis is ``expert`` ([E, in, out]) is a stack of
per-expert linear kernels. It is written as one tensor per expert, with the
expert index before the layer name (``model.layers.0.mlp.experts.0.gate_proj.weight``,
[out, in]), which is what ``save_pretrained`` writes. It is read from that form or
from the fused form transformers 5 holds in memory: ``<experts>.gate_up_proj``
[E, 2 * out, in] (gate rows first, then up rows) and ``<experts>.down_proj`` [E, out, in].
"""

import dataclasses
import json
import pathlib
from collections.abc import Callable, Collection, Iterator

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
    if leaf == "bias":
        return f"{prefix}.bias", False
    raise ValueError(f"parameter {'.'.join(map(str, path))} has no Hugging Face name")


EXPERT_AXIS = "expert"

# A per-expert kernel's fused tensor: name and (part, number of parts) along the out rows.
_FUSED_EXPERTS = {
    "gate_proj": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
    "down_proj": ("down_proj", 0, 1),
}


def is_expert_stack(var: nnx.Variable) -> bool:
    """Whether a parameter is an [E, in, out] stack of per-expert kernels (first axis ``expert``)."""
    axes = var.get_metadata().get("out_sharding") or ()
    return len(axes) == 3 and axes[0] == EXPERT_AXIS


def expert_names(path: tuple, num_experts: int) -> list[str]:
    """Per-expert Hugging Face names of an expert-stack kernel path (``...experts.{i}.<layer>.weight``)."""
    *modules, layer, leaf = (str(part) for part in path)
    if leaf != "kernel":
        raise ValueError(f"expert stack {'.'.join(map(str, path))} must be a linear 'kernel'")
    parent = ".".join(modules)
    return [f"{parent}.{i}.{layer}.weight" for i in range(num_experts)]


def _fused_name(path: tuple) -> tuple[str, int, int] | None:
    """(fused tensor name, part, parts) of an expert-stack kernel path, or None if it has none."""
    *modules, layer, _ = (str(part) for part in path)
    if layer not in _FUSED_EXPERTS:
        return None
    name, part, parts = _FUSED_EXPERTS[layer]
    return ".".join([*modules, name]), part, parts


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Source:
    """Where one parameter's values come from: its checkpoint tensors and a reader of slices."""

    names: tuple[str, ...]
    read: Callable[[tuple], np.ndarray]  # index into the parameter's shape -> host array


def _plan(path: tuple, var: nnx.Variable, reader: "SafetensorsReader") -> _Source | list[str]:
    """The source of one parameter, or the names it needs that the checkpoint lacks.

    Raises:
      ValueError: a tensor exists with a shape the parameter cannot take.
    """
    shape = tuple(var.shape)
    if not is_expert_stack(var):
        name, transpose = hf_name(path)
        if name not in reader.names:
            return [name]
        _check_shape(reader, name, shape[::-1] if transpose else shape)

        def read(index, name=name, transpose=transpose):
            host = reader.array(name)
            return (host.T if transpose else host)[index]

        return _Source(names=(name,), read=read)
    experts, d_in, d_out = shape
    per_expert = expert_names(path, experts)
    fused = _fused_name(path)
    use_fused = fused is not None and fused[0] in reader.names
    if not use_fused or any(n in reader.names for n in per_expert):
        missing = [n for n in per_expert if n not in reader.names]
        if missing:
            return missing
        for name in per_expert:
            _check_shape(reader, name, (d_out, d_in))
        return _Source(
            names=tuple(per_expert),
            read=lambda index: _stack(index, experts, lambda e: reader.array(per_expert[e]).T),
        )
    name, part, parts = fused
    _check_shape(reader, name, (experts, parts * d_out, d_in))
    rows = slice(part * d_out, (part + 1) * d_out)
    return _Source(
        names=(name,),
        read=lambda index: _stack(index, experts, lambda e: reader.array(name)[e, rows].T),
    )


def _stack(index: tuple, num_experts: int, kernel: Callable[[int], np.ndarray]) -> np.ndarray:
    """The ``index`` slice of an [E, in, out] stack whose expert e is ``kernel(e)`` ([in, out])."""
    index = tuple(index) + (slice(None),) * (3 - len(index))
    return np.stack([kernel(e)[index[1:]] for e in range(num_experts)[index[0]]])


def _check_shape(reader: "SafetensorsReader", name: str, expected: tuple[int, ...]) -> None:
    if reader.shape(name) != tuple(expected):
        raise ValueError(
            f"tensor {name!r} in {reader.file(name)} has shape {reader.shape(name)}, "
            f"but the config needs {tuple(expected)}; check config.json against the weights"
        )


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
    wanted, missing = [], []
    for path, var in iter_params(model):
        source = _plan(path, var, reader)
        if isinstance(source, list):
            missing.extend(source)
        else:
            wanted.append((var, source))
    if missing:
        raise ValueError(
            f"checkpoint {reader.source} lacks {len(missing)} tensor(s) the model needs: "
            f"{_names(missing)}; check that the checkpoint matches its config.json"
        )
    used = {name for _, source in wanted for name in source.names}
    unused = sorted(reader.names - used - set(ignore))
    if unused:
        raise ValueError(
            f"checkpoint {reader.source} has {len(unused)} tensor(s) the model does not use: "
            f"{_names(unused)}; it is not a checkpoint of this architecture"
        )
    target = np.dtype(dtype)
    everything = (slice(None),)
    for var, source in wanted:
        if mesh is None:
            value = jax.device_put(np.ascontiguousarray(source.read(everything), dtype=target))
        else:
            placement = sharding.named_sharding(
                var.get_metadata().get("out_sharding"), var.shape, mesh, rules
            )
            value = jax.make_array_from_callback(
                tuple(var.shape),
                placement,
                lambda index, read=source.read: np.ascontiguousarray(read(index), dtype=target),
            )
        var.set_value(value)


def hf_state_dict(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's base parameters as host arrays under Hugging Face names ([out, in] kernels).

    Expert stacks become one tensor per expert (see the module docstring).
    """
    tensors = {}
    for path, var in iter_params(model):
        array = np.asarray(jax.device_get(var[...]))
        if is_expert_stack(var):
            for name, kernel in zip(expert_names(path, array.shape[0]), array, strict=True):
                tensors[name] = np.ascontiguousarray(kernel.T)
            continue
        name, transpose = hf_name(path)
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
