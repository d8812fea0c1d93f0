"""The `pau` benchmark as tasks: built TFDS splits read back as episode specs and references.

A record of the TFDS `pau` dataset (`pau_jax.data.pipeline.Record`) holds its
inputs and outputs in the sandbox's typed codec. Its two shown examples become
the task's examples (displayed as the agent sees values), its held-out inputs
become E_test of the reference.

    records = pau_dataset.load_split("debug", "test", data_dir)
    specs, references = pau_dataset.from_records(records, EpisodeConfig())
"""

import importlib
import pathlib
import sys
from collections.abc import Sequence

from pau_jax.data.pipeline import Record
from pau_jax.env import display, episode, prompts
from pau_jax.env.episode import EpisodeConfig
from pau_jax.env.runner import EpisodeSpec
from pau_jax.sandbox import values
from pau_jax.tasks.reference import TaskReference

DATASET_NAME = "pau"
_REPO = pathlib.Path(__file__).resolve().parents[2]
BUILDERS_DIR = _REPO / "data_builders"
DUMMY_DATA = BUILDERS_DIR / "pau" / "dummy_data"


def _args(encoded: str) -> tuple:
    args = values.decode(encoded)
    if not isinstance(args, tuple):
        raise ValueError(f"encoded arguments must decode to a tuple, got {type(args).__name__}")
    return args


def example_observations(
    record: Record, display_mode: str = "repr"
) -> tuple[prompts.Observation, ...]:
    """The shown examples of a record as the agent sees them (`test_func(2, 3) -> 7`)."""
    return tuple(
        prompts.Observation(
            call=display.render_call(_args(e.args), display_mode),
            result=display.display_value(values.decode(e.output), display_mode),
        )
        for e in record.shown
    )


def to_spec(record: Record, config: EpisodeConfig) -> EpisodeSpec:
    """The episode of one record (shown examples displayed under `config.display_mode`)."""
    task = episode.Task(
        task_id=record.task_id,
        header=record.header,
        n_params=len(record.arg_types),
        examples=example_observations(record, config.display_mode),
        shown_args=tuple(_args(e.args) for e in record.shown),
    )
    return EpisodeSpec(task=task, code=record.code)


def _lines(observations) -> tuple[str, ...]:
    return tuple(f"{o.call} -> {o.result}" for o in observations)


def to_reference(record: Record, display_mode: str = "repr") -> TaskReference:
    """What scoring needs about one record: code, gold description, E_test, shown examples."""
    return TaskReference(
        code=record.code,
        header=record.header,
        description=record.description,
        held_out=tuple(_args(e.args) for e in record.heldout),
        held_out_outputs=tuple(values.decode(e.output) for e in record.heldout),
        examples=_lines(example_observations(record, display_mode)),
        source=record.source,
        description_origin=record.description_origin,
    )


def from_records(
    records: Sequence[Record], config: EpisodeConfig
) -> tuple[list[EpisodeSpec], dict[str, TaskReference]]:
    """Episode specs (in record order) and references keyed by task id."""
    ids = [r.task_id for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError("dataset records have duplicate task ids; pass each item once")
    references = {r.task_id: to_reference(r, config.display_mode) for r in records}
    return [to_spec(r, config) for r in records], references


def is_built(config: str, data_dir: str | pathlib.Path) -> bool:
    """Whether `pau/<config>` has a prepared version under `data_dir`."""
    root = pathlib.Path(data_dir).expanduser() / DATASET_NAME / config
    return any(root.glob("*/dataset_info.json"))


def load_split(
    config: str, split: str, data_dir: str | pathlib.Path, *, limit: int | None = None
) -> list[Record]:
    """Records of a built split, sorted by task id (read with tfds.data_source, no TensorFlow).

    Args:
      config: builder config ('default', 'debug').
      split: 'test' or 'train'.
      data_dir: the TFDS data_dir the split was built into.
      limit: keep the first `limit` records (by task id); None keeps all.
    """
    from pau_jax.data import export

    data_dir = pathlib.Path(data_dir).expanduser()
    if not is_built(config, data_dir):
        raise FileNotFoundError(
            f"pau/{config} is not built under {data_dir}; build it with "
            f"`cd data_builders && python -m pau_jax.data.build_tfds pau --config={config} "
            f"--data_dir={data_dir} --manual_dir=...` (see docs/dataset.md)"
        )
    records = export.read_split(str(data_dir), config, split)
    return records if limit is None else records[:limit]


def builder_class():
    """The TFDS `Builder` of `data_builders/pau` (the same module the `tfds build` command uses)."""
    if not (BUILDERS_DIR / "pau" / "pau_dataset_builder.py").exists():
        raise FileNotFoundError(
            f"the dataset builder is not at {BUILDERS_DIR}/pau; building needs a source checkout"
        )
    if str(BUILDERS_DIR) not in sys.path:
        sys.path.insert(0, str(BUILDERS_DIR))
    return importlib.import_module("pau.pau_dataset_builder").Builder


def ensure_built(
    data_dir: str | pathlib.Path,
    *,
    config: str = "debug",
    manual_dir: str | pathlib.Path | None = None,
) -> pathlib.Path:
    """Builds `pau/<config>` into `data_dir` unless it is already there; returns `data_dir`.

    Runs the TFDS builder of `data_builders/pau` (array_record output, no
    TensorFlow) with `manual_dir` as its manual directory: by default the small
    `dummy_data` for the debug config (the debug config builds in about 20 s).
    """
    import tensorflow_datasets as tfds

    data_dir = pathlib.Path(data_dir).expanduser()
    if is_built(config, data_dir):
        return data_dir
    if manual_dir is None:
        if config != "debug":
            raise ValueError(f"building pau/{config} needs manual_dir (the folder of source files)")
        manual_dir = DUMMY_DATA
    builder = builder_class()(config=config, data_dir=str(data_dir))
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir))
    )
    return data_dir
