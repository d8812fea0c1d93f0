"""The gold baseline: the coder writes code from the gold description and the two shown examples.

Its code match is the upper bound of code match with this coder: what a perfect
description would score. Each task becomes a record whose prediction is the
gold description (no agent, no calls); scoring gives the coder the shown
examples too (`score.score_episodes(..., with_observations=True)`) and does
not judge (the gold description would be rated against itself). A task without
a gold description gets a record with no code match (`gold_missing`), so that
the gold run still covers every task when runs are aligned (`compare.py`).
"""

import json
import pathlib
from collections.abc import Mapping, Sequence

from pau_jax.env import runner
from pau_jax.tasks.reference import TaskReference


def gold_records(
    specs: Sequence[runner.EpisodeSpec], references: Mapping[str, TaskReference]
) -> list[dict]:
    """One record per task with the gold description as its prediction.

    Records have the fields `score.score_episodes` and `metrics.summarize` read;
    `stopped_by_agent` is None (no stop decision), `n_calls` 0, no observations.
    """
    out = []
    for spec in specs:
        ref = references[spec.task.task_id]
        out.append(
            {
                "task_id": spec.task.task_id,
                "episode_id": spec.task.task_id,
                "header": spec.task.header,
                "mode": "gold",
                "prediction": ref.description,
                "finish_reason": "gold",
                "stopped_by_agent": None,
                "n_calls": 0,
                "n_steps": 0,
                "observations": [],
                "steps": [],
                "seconds": 0.0,
            }
        )
    return out


def record_missing(records: Sequence[dict], references: Mapping[str, TaskReference], path) -> int:
    """Appends to the scored file `path` the records without a gold description not yet in it.

    They carry the scored fields with nothing scored (`code_match` None, judge
    skipped) and `gold_missing: True`. Returns how many records lack a description.
    """
    path = pathlib.Path(path)
    done = runner.finished_ids(path)
    runner.drop_torn_tail(path)
    missing = [r for r in records if not r["prediction"]]
    new = []
    for r in missing:
        if r["task_id"] in done:
            continue
        source = references[r["task_id"]].source
        new.append(
            dict(
                r,
                **({"source": source} if source else {}),
                judge_score=None,
                judge_raw="",
                judge_skipped=True,
                code_match=None,
                code_runnable=None,
                code_match_incomparable=0,
                predicted_code="",
                gold_missing=True,
            )
        )
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in new)
    return len(missing)
