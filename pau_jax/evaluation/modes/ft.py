"""The ft baseline: in-context mode with a LoRA adapter fine-tuned on the train split's in-context pairs."""

import dataclasses

from pau_jax.evaluation import in_context
from pau_jax.evaluation.modes.context import (
    Context,
    Mode,
    ModeRun,
    Options,
    episodes_path,
    score_episodes,
)
from pau_jax.policy.backends import LocalBackendConfig, Seat


def check(modes: tuple[str, ...], options: Options) -> None:
    """Refuses an ft run without a fine-tuning function or without a fresh local agent."""
    del modes
    if not callable(options.baselines.get("ft")):
        raise ValueError(
            "the ft mode needs its adapter trainer: baselines={'ft': train_adapter} (gin: "
            "eval/ft.gin binds @pau_jax.sft.finetune.train_adapter)"
        )
    if not isinstance(options.policy, LocalBackendConfig) or options.policy.adapter_dir:
        raise ValueError(
            "the ft mode fine-tunes a fresh LoRA on a local checkpoint: the agent must be a "
            "LocalBackendConfig without adapter_dir"
        )


def run(context: Context) -> ModeRun:
    """Fine-tunes an adapter (`Options.baselines['ft']`), runs in-context with it and scores it."""
    options, policy = context.options, context.options.policy
    pairs = in_context.training_pairs(*context.train)
    print(f"[eval] ft: fine-tuning on {len(pairs)} train pairs", flush=True)
    adapter = options.baselines["ft"](
        checkpoint_dir=policy.checkpoint_dir,
        out_dir=str(options.out / "ft"),
        pairs=pairs,
        dtype=policy.dtype,
        tokenizer=policy.tokenizer,
    )
    agent = Seat(
        "agent", context.seats.build(dataclasses.replace(policy, adapter_dir=str(adapter)))
    )
    in_context.run_in_context(
        context.specs,
        agent,
        out_path=episodes_path(context, "ft"),
        batch_size=options.batch_size,
        mode="ft",
    )
    baseline = {"adapter": str(adapter), "train_pairs": len(pairs)}
    return ModeRun(runs=score_episodes(context, "ft"), baseline=baseline)


MODE = Mode(run=run, check=check, needs_train=True, compared_with=("in_context",))
