"""Failure-mode attribution of low-scoring episodes: a deterministic pre-check, then a judge prompt.

Categories: format error, hallucination, insufficient exploration,
overconfident conclusion, other. A record whose failure is evident from its
trajectory (every input failed to parse, no description given, no revision
parsed) is classified by `precheck` without a model. The rest go to a judge
(any policy) in one batched call; its answer is parsed from `Category: X`, and
an answer without a recognisable category is counted as unparsed, never guessed.
"""

import re
from collections.abc import Sequence

from pau_jax.env.text_blocks import strip_think

FAILURE_PROMPT_VERSION = "failure-v1"

CATEGORIES = (
    "format error",
    "hallucination",
    "insufficient exploration",
    "overconfident conclusion",
    "other",
)

_DEFINITIONS = """\
- format error: the agent's outputs did not follow the required format (inputs that could
  not be parsed, missing hypothesis or decision), so the exploration or the answer was lost.
- hallucination: the description claims behaviour that the observations contradict or never
  showed (invented rules, wrong outputs for inputs that were tried).
- insufficient exploration: the description is consistent with what was observed, but the
  agent tried too few or too similar inputs to see the behaviour that matters.
- overconfident conclusion: the agent had evidence of behaviour its description leaves out
  (or stopped right after a surprising result) and stopped early anyway.
- other: none of the above."""

_CATEGORY = re.compile(
    r"category\s*[:=]\s*[*_`\"']*\s*("
    + "|".join(c.replace(" ", r"[\s_-]+") for c in CATEGORIES)
    + r")\b",
    re.I,
)
_MAX_OBSERVATIONS = 30


def is_low(record: dict, *, code_match_below: float = 0.5, judge_below: int = 3) -> bool:
    """Whether a scored record counts as low-scoring (code match or judge score under a bound)."""
    match = record.get("code_match")
    score = record.get("judge_score")
    return (match is not None and match < code_match_below) or (
        score is not None and score < judge_below
    )


def precheck(record: dict) -> str | None:
    """The category evident without a model, or None.

    Format error when: the prediction is empty; every generated input failed to
    parse; or no revision output parsed at all.
    """
    if not (record.get("prediction") or "").strip():
        return "format error"
    steps = record.get("steps") or []
    generated = [s for s in steps if s.get("phase") == "generate"]
    if generated and not any(s.get("parse_ok") for s in generated):
        return "format error"
    revisions = [s for s in steps if s.get("phase") == "revise"]
    if revisions and not any(s.get("parse_ok") for s in revisions):
        return "format error"
    return None


def failure_messages(record: dict, gold: str = "") -> list[dict]:
    """The judge prompt classifying one trajectory."""
    observations = record.get("observations") or []
    shown = [f"{o['call']} -> {o['result']}" for o in observations[-_MAX_OBSERVATIONS:]]
    if len(observations) > _MAX_OBSERVATIONS:
        shown.insert(0, f"({len(observations) - _MAX_OBSERVATIONS} earlier calls not shown)")
    stopped = record.get("stopped_by_agent")
    score = record.get("code_match")
    user = (
        "An agent tried to work out what an unknown Python function does by calling it, then "
        "described it. Its description scored low. Classify the main reason for the failure "
        f"into exactly one category:\n{_DEFINITIONS}\n\n"
        f"Function header: {record.get('header', '')}\n"
        f"True description: {gold or '(not available)'}\n"
        f"Calls made: {record.get('n_calls', 0)}\n"
        f"Stopped by the agent: {'yes' if stopped else 'no'}\n"
        f"Observed calls:\n{chr(10).join(shown) or '(none)'}\n"
        f"Agent's description: {record.get('prediction') or '(none)'}\n"
        f"Code match of the description: {'n/a' if score is None else f'{score:.2f}'}\n\n"
        'Explain in one or two sentences, then answer "Category: <one of the categories>".'
    )
    return [{"role": "user", "content": user}]


def parse_category(text: str) -> str | None:
    """The last `Category: X` with X one of CATEGORIES (any case, `_`/`-` for spaces), or None."""
    found = _CATEGORY.findall(strip_think(text))
    if not found:
        return None
    return re.sub(r"[\s_-]+", " ", found[-1].lower())


def attribute(
    records: Sequence[dict],
    judge_policy,
    *,
    golds: dict[str, str] | None = None,
    code_match_below: float = 0.5,
    judge_below: int = 3,
) -> list[dict]:
    """Returns copies of `records`; low-scoring ones get `failure_mode`, `failure_by`, `failure_raw`.

    `failure_mode` is a category, or None when the judge's answer did not parse
    (`failure_by = 'judge'`); records that are not low-scoring are unchanged.
    The judge is called once for all records the pre-check leaves open; with
    `judge_policy=None` those stay unclassified (`failure_by = 'none'`).
    """
    golds = golds or {}
    out = [dict(r) for r in records]
    to_judge = []
    for r in out:
        if not is_low(r, code_match_below=code_match_below, judge_below=judge_below):
            continue
        category = precheck(r)
        if category is not None:
            r.update(failure_mode=category, failure_by="precheck", failure_raw="")
        elif judge_policy is None:
            r.update(failure_mode=None, failure_by="none", failure_raw="")
        else:
            to_judge.append(r)
    if to_judge:
        texts = judge_policy([failure_messages(r, golds.get(r["task_id"], "")) for r in to_judge])
        for r, text in zip(to_judge, texts, strict=True):
            r.update(failure_mode=parse_category(text), failure_by="judge", failure_raw=text)
    return out


def failure_summary(records: Sequence[dict]) -> dict:
    """Counts per category over the attributed records, with unparsed and unjudged counts."""
    attributed = [r for r in records if "failure_by" in r]
    counts = {c: 0 for c in CATEGORIES}
    for r in attributed:
        if r["failure_mode"] in counts:
            counts[r["failure_mode"]] += 1
    return {
        "low_scoring": len(attributed),
        "counts": counts,
        "by_precheck": sum(r["failure_by"] == "precheck" for r in attributed),
        "unparsed": sum(
            r["failure_by"] == "judge" and r["failure_mode"] is None for r in attributed
        ),
        "unjudged": sum(r["failure_by"] == "none" for r in attributed),
    }
