"""The in-context mode: the header and the two shown examples, one description per task, then scoring."""

from pau_jax.evaluation import in_context
from pau_jax.evaluation.modes.context import Context, Mode, ModeRun, episodes_path, score_episodes


def run(context: Context) -> ModeRun:
    """Runs (or resumes) the in-context calls of every task and scores them."""
    in_context.run_in_context(
        context.specs,
        context.agent,
        out_path=episodes_path(context, "in_context"),
        batch_size=context.options.batch_size,
    )
    return ModeRun(runs=score_episodes(context, "in_context"))


MODE = Mode(run=run)
