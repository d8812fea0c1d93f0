"""The interactive mode: the paper's three-phase episode with sandboxed calls, then scoring."""

from pau_jax.env import runner
from pau_jax.evaluation.modes.context import Context, Mode, ModeRun, episodes_path, score_episodes


def run(context: Context) -> ModeRun:
    """Runs (or resumes) one interactive episode per task and scores them."""
    options = context.options
    runner.run_episodes(
        context.specs,
        context.agent,
        context.executor,
        options.episode_config,
        out_path=episodes_path(context, "interactive"),
        call_timeout_s=options.call_timeout_s,
        max_parallel_calls=options.max_parallel_calls,
        max_active=options.batch_size,
    )
    return ModeRun(runs=score_episodes(context, "interactive"))


MODE = Mode(run=run, compared_with=("in_context",), ensembled_with=("in_context",))
