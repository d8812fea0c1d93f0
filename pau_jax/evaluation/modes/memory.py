"""The memory baseline: a second interactive episode informed by critiques of retrieved train tasks."""

from pau_jax.env import runner
from pau_jax.evaluation import memory_baseline as memory
from pau_jax.evaluation.modes.context import (
    Context,
    Mode,
    ModeRun,
    Options,
    episodes_path,
    score_episodes,
)
from pau_jax.policy import backends, embeddings


def check(modes: tuple[str, ...], options: Options) -> None:
    """Refuses a memory run without an earlier interactive run or without an embedder."""
    if "interactive" not in modes or modes.index("interactive") > modes.index("memory"):
        raise ValueError(
            "the memory mode starts from the interactive run: use "
            "modes=('interactive', 'memory') (interactive first)"
        )
    config = options.baselines.get("memory")
    if not isinstance(config, memory.MemoryConfig) or config.embedder is None:
        raise ValueError(
            "the memory mode needs an embedder: baselines={'memory': MemoryConfig(embedder="
            "LocalEmbeddingConfig(checkpoint_dir=...) or HTTPEmbeddingConfig(...)) "
            "(gin: eval/memory.gin and --gin.EMBEDDING_CHECKPOINT=...)"
        )


def run(context: Context) -> ModeRun:
    """Runs (or resumes) the memory baseline from the interactive episodes and scores it."""
    options, config = context.options, context.options.baselines["memory"]
    train_specs, train_references = context.train
    first = {
        r["task_id"]: r
        for r in runner.load_records(episodes_path(context, "interactive"))
        if r["task_id"] in context.ids
    }
    memory.run_memory(
        specs=context.specs,
        first_records=first,
        train_specs=train_specs,
        train_references=train_references,
        agent=context.agent,
        embedder=backends.EmbedderSeat(config.embedder),
        embedder_name=embeddings.describe(config.embedder),
        executor=context.executor,
        episode_config=options.episode_config,
        config=config,
        run_dir=options.out,
        call_timeout_s=options.call_timeout_s,
        max_parallel_calls=options.max_parallel_calls,
    )
    baseline = {
        "embedder": embeddings.describe(config.embedder),
        "top_k": config.top_k,
        "train_tasks": len(train_specs),
    }
    return ModeRun(runs=score_episodes(context, "memory"), baseline=baseline)


MODE = Mode(run=run, check=check, needs_train=True, compared_with=("interactive",))
