"""Whether what a run would read is there: checkpoints, adapters, the actor's model, datasets.

`input_problems` says, for one configurable and the values gin gives it, what it would
read but is not there, without loading anything (`config_check.missing_inputs` walks
the configurables a run calls).
"""

import json
import pathlib

from pau_jax import hub


def _dataset_problem(config, split, data_dir, manual_dir, build: bool) -> str | None:
    """Why split `split` (None: any) of `pau/<config>` under `data_dir` is not built nor buildable."""
    from pau_jax.tasks import pau_dataset

    if not (isinstance(config, str) and isinstance(data_dir, str)):
        return None  # Computed when the run starts.
    root = pathlib.Path(data_dir).expanduser() / pau_dataset.DATASET_NAME / config
    infos = sorted(root.glob("*/dataset_info.json"))
    if infos:
        try:
            splits = {s["name"] for s in json.loads(infos[-1].read_text())["splits"]}
        except (json.JSONDecodeError, KeyError, TypeError):
            return f"{infos[-1]} is not valid (cut short?); rebuild pau/{config}"
        if not isinstance(split, str) or split in splits:
            return None
        return f"pau/{config} under {data_dir} has no split {split!r} (it has {sorted(splits)})"
    if build and isinstance(manual_dir, str):
        if pathlib.Path(manual_dir).expanduser().is_dir():
            return None
        return (
            f"pau/{config} is not built under {data_dir}, and manual_dir {manual_dir} "
            "is not a folder"
        )
    if build and config == "debug":
        return None  # Built from the builder's dummy data.
    return (
        f"pau/{config} is not built under {data_dir}; build it (docs/dataset.md), or "
        "pass DATA_DIR/DATASET_CONFIG of a built one"
    )


def _adapter_problem(path: str) -> str | None:
    folder = pathlib.Path(path).expanduser()
    if not (folder / "adapter_config.json").is_file():
        return f"adapter {folder} has no adapter_config.json (not a PEFT adapter folder)"
    return None


def _actor_problem(values: dict, macros: dict) -> str | None:
    if values.get("checkpoint") is None and values.get("model_config") is None:
        flag = macros.get("checkpoint", "pau_jax.training.run.ActorConfig.checkpoint")
        return (
            f"the actor has no checkpoint (set --gin.{flag}: a Hugging Face model "
            "directory) and no ActorConfig.model_config (a random model)"
        )
    return None


def input_problems(name: str, values: dict, macros: dict, mode: str) -> list[str]:
    """What configurable `name` called with `values` would read but is not there."""
    paths = {
        "ActorConfig": ("checkpoint",),
        "LocalBackendConfig": ("checkpoint_dir",),
        "LocalEmbeddingConfig": ("checkpoint_dir",),
        "quickstart": ("checkpoint",),
    }.get(name, ())
    get = values.get
    problems = [hub.checkpoint_problem(get(p)) for p in paths if isinstance(get(p), str)]
    if name == "ActorConfig" and mode != "quickstart":  # quickstart gives the actor its model
        problems.append(_actor_problem(values, macros))
    if name == "LocalBackendConfig" and isinstance(get("adapter_dir"), str):
        problems.append(_adapter_problem(get("adapter_dir")))
    if name == "DatasetConfig":
        build = get("build_if_missing") is True
        problems.append(
            _dataset_problem(get("config"), get("split"), get("data_dir"), get("manual_dir"), build)
        )
    return [p for p in problems if p is not None]
