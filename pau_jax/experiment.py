"""The functions gin binds, one per run mode; wiring only, no algorithms here."""

import json
import pathlib
import time

from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy.local import SamplingConfig

_REGISTERED = []

# Modules whose frozen `*Config` dataclasses gin may construct, under their own module
# names (e.g. `@pau_jax.rl.grpo.GRPOConfig()`).
CONFIG_MODULES = (
    "pau_jax.models.qwen3",
    "pau_jax.models.llama",
    "pau_jax.env.episode",
    "pau_jax.policy.local",
    "pau_jax.policy.http",
    "pau_jax.rl.rewards",
    "pau_jax.rl.grpo",
    "pau_jax.rl.learner",
    "pau_jax.rl.critic",
    "pau_jax.rl.rollout",
    "pau_jax.rl.loop",
    "pau_jax.sft.trainer",
    "pau_jax.evaluation.pipeline",
    "pau_jax.parallel",
)

# Functions chosen by reference in gin files (`advantage_fn = @pau_jax.rl.credit.return_to_go`).
FUNCTIONS = (
    ("pau_jax.rl.credit", "return_to_go"),
    ("pau_jax.rl.credit", "final_only"),
    ("pau_jax.rl.credit", "last_step_broadcast"),
)

# Run mode -> (module, function): the entry functions gin binds as `pau_jax.experiment.<name>`.
ENTRIES = {
    "smoke": ("pau_jax.experiment", "smoke_run"),
    "train": ("pau_jax.rl.loop", "train"),
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
ENTRY_NAMES = {"smoke": "smoke_run", "train": "train", "eval": "evaluate"}


def run_defaults(*, run_mode: str = "train") -> str:
    """The run mode a gin file selects (`run_defaults.run_mode = 'eval'`); `--run_mode` wins."""
    if run_mode not in ENTRY_NAMES:
        raise ValueError(f"run_mode must be one of {sorted(ENTRY_NAMES)}, got {run_mode!r}")
    return run_mode


def smoke_run(
    *,
    run_dir: str,
    model_config,
    seed: int = 0,
    lora_rank: int = 4,
    lora_alpha: float = 4.0,
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=32, temperature=1.0),
    episode_config: EpisodeConfig = EpisodeConfig(call_budget=2),
    sandbox_workers: int = 2,
) -> dict:
    """End to end on the CPU with no downloads: checkpoint -> load -> LoRA -> PAU episodes.

    1. creates a random Qwen3 with `model_config` and writes it, with the real
       offline Qwen3 tokenizer, as a Hugging Face checkpoint directory;
    2. loads that directory back (`load_hf`, `load_tokenizer`) and adds LoRA;
    3. runs the embedded demo tasks as batched PAU episodes (local JAX policy,
       sandboxed calls), writing trajectories to `episodes.jsonl`;
    4. scores the episodes (the same local model as judge and coder; code match
       on held-out inputs in the sandbox) and writes `report.md` with plots;
    5. exports the adapter in PEFT format and writes `summary.json`.
    """
    from flax import nnx

    from pau_jax import demo_tasks
    from pau_jax.evaluation import report, runner, score
    from pau_jax.models import lora, qwen3
    from pau_jax.policy.local import LocalPolicy
    from pau_jax.sandbox import Executor
    from pau_jax.tokenizer import load_tokenizer, save_offline_tokenizer

    out = pathlib.Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    # Checkpoint: a random model in the Hugging Face layout, with the real tokenizer.
    checkpoint = out / "checkpoint"
    if not (checkpoint / "config.json").exists():
        fresh = qwen3.Qwen3ForCausalLM(model_config, rngs=nnx.Rngs(seed))
        qwen3.save_hf(fresh, model_config, checkpoint)
        save_offline_tokenizer(checkpoint)
        del fresh
    print(f"[smoke] checkpoint: {checkpoint}", flush=True)

    # Load it back the way a real checkpoint is loaded, then adapt.
    model, config = qwen3.load_hf(checkpoint, dtype="float32")
    tokenizer = load_tokenizer(checkpoint)
    n_adapted = lora.apply_lora(model, rank=lora_rank, alpha=lora_alpha)
    print(f"[smoke] loaded {config.num_hidden_layers}-layer model; LoRA on {n_adapted} modules")

    policy = LocalPolicy(model, tokenizer, sampling)
    with Executor(workers=sandbox_workers) as executor:
        specs = demo_tasks.demo_specs(executor, episode_config)
        records = runner.run_episodes(
            specs, policy, executor, episode_config, out_path=out / "episodes.jsonl"
        )
        all_records = runner.load_records(out / "episodes.jsonl")
        references = {
            t.task_id: score.Reference(
                code=t.code, header=t.header, description=t.description, held_out=t.held_out
            )
            for t in demo_tasks.DEMO_TASKS
        }
        print("[smoke] scoring: judge and code match", flush=True)
        scored = score.score_episodes(
            all_records, references, judge_policy=policy, coder_policy=policy, executor=executor
        )
    with (out / "scored.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in scored)
    report_path = report.write_report(
        out, {"interactive": scored}, title="pau_jax smoke run (random weights)"
    )
    lora.export_peft(model, out / "adapter")

    steps = [s for r in all_records for s in r["steps"]]
    summary = {
        "episodes": len(all_records),
        "episodes_run_now": len(records),
        "calls": sum(r["n_calls"] for r in all_records),
        "steps": len(steps),
        "parse_ok_fraction": sum(s["parse_ok"] for s in steps) / max(len(steps), 1),
        "stopped_by_agent": sum(r["stopped_by_agent"] for r in all_records),
        "judge_unparsed": sum(r["judge_score"] is None for r in scored),
        "code_match_mean": sum(r["code_match"] for r in scored) / max(len(scored), 1),
        "lora_modules": n_adapted,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("[smoke] " + ", ".join(f"{k}={v}" for k, v in summary.items()))
    print(f"[smoke] trajectories: {out / 'episodes.jsonl'}; adapter: {out / 'adapter'}")
    print(f"[smoke] report: {report_path}")
    return summary
