"""Scores finished episodes: judge rating and code match, added to each episode record."""

import dataclasses
from collections.abc import Sequence

from pau_jax.evaluation import code_match, judge


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reference:
    """What scoring needs about a task: the true code, gold description and E_test inputs."""

    code: str
    header: str
    description: str
    held_out: tuple[tuple, ...]


def score_episodes(
    records: Sequence[dict],
    references: dict[str, Reference],
    *,
    judge_policy,
    coder_policy,
    executor,
    with_observations: bool = False,
    timeout_s: float = 2.0,
) -> list[dict]:
    """Returns copies of `records` with `judge_score`, `judge_raw`, `code_match`, `predicted_code`.

    The judge and the coder are each called once for all records (batched).
    Tasks with an empty gold description get `judge_score = None` and
    `judge_skipped = True` (nothing to compare with); the code match still runs.

    Args:
      with_observations: give the coder the episode's observed calls too (the
        "description + examples" variant).
    """
    missing = [r["task_id"] for r in records if r["task_id"] not in references]
    if missing:
        raise ValueError(f"no reference for tasks {missing[:5]}; pass references for every record")
    to_judge = [r for r in records if references[r["task_id"]].description]
    verdicts = judge.judge(
        judge_policy,
        [(references[r["task_id"]].description, r["prediction"]) for r in to_judge],
    )
    by_id = {r["task_id"]: v for r, v in zip(to_judge, verdicts, strict=True)}
    coder_prompts = []
    for r in records:
        ref = references[r["task_id"]]
        shown = (
            [f"{o['call']} -> {o['result']}" for o in r["observations"]]
            if with_observations
            else []
        )
        coder_prompts.append(code_match.coder_messages(ref.header, r["prediction"], shown))
    codes = [code_match.extract_code(t) for t in coder_policy(coder_prompts)]
    out = []
    for r, code in zip(records, codes, strict=True):
        ref = references[r["task_id"]]
        match = code_match.score_code(executor, ref.code, code, ref.held_out, timeout_s=timeout_s)
        verdict = by_id.get(r["task_id"])
        out.append(
            dict(
                r,
                judge_score=verdict.score if verdict else None,
                judge_raw=verdict.raw if verdict else "",
                judge_skipped=verdict is None,
                code_match=match.score,
                code_runnable=match.runnable,
                predicted_code=code,
            )
        )
    return out
