"""The gold mode: the coder's code from the gold description and the shown examples (code match's upper bound)."""

from pau_jax.env import jsonl, runner
from pau_jax.evaluation import gold, score
from pau_jax.evaluation.modes.context import Context, Mode, ModeRun


def run(context: Context) -> ModeRun:
    """Scores the gold descriptions with the coder (not judged) into `gold_scored.jsonl`."""
    options = context.options
    records = gold.gold_records(context.specs, context.references)
    path = options.out / "gold_scored.jsonl"
    jsonl.prepare(path, required=runner.RECORD_KEYS)
    missing = gold.record_missing(records, context.references, path)
    if missing:
        print(f"[eval] gold: {missing} tasks have no gold description", flush=True)
    score.score_into_file(
        [r for r in records if r["prediction"]],
        context.references,
        path,
        judge_policy=None,
        coder_policy=context.coder,
        executor=context.executor,
        with_observations=True,
        judged=None,
        attribute=False,
        low_code_match=options.scoring.low_code_match,
        low_judge_score=options.scoring.low_judge_score,
        batch_size=options.scoring.batch_size,
        timeout_s=options.scoring.timeout_s,
    )
    scored = [r for r in runner.load_records(path) if r["task_id"] in context.ids]
    return ModeRun(runs={"gold": scored})


MODE = Mode(run=run, needs_agent=False)
