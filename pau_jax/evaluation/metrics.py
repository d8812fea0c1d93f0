"""Summary metrics of scored episodes: judge scores, code match, calls, stop rate, per source.

An episode record is a dict with at least `n_calls` and `stopped_by_agent`, and
optionally `judge_score` (1–5, or None when the judge's answer could not be
parsed), `code_match` (fraction in [0, 1], or None), `source` and the failure-mode
fields of `failure_modes.attribute`. `stopped_by_agent` is None in in-context
records (no stop decision) and such records are left out of the stop rate.
Unparsed judge scores are counted and reported, never replaced by a value;
records with `judge_skipped` (no gold description) are left out of the judge metrics.
Records with `steps` (phase, parse_ok) add the parse-failure rate of each phase, and every
block counts the records' finish reasons.
"""

import collections
from collections.abc import Sequence

import numpy as np

from pau_jax.evaluation import failure_modes

CODE_MATCH_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def _mean_std(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(values.mean()), "std": float(values.std(ddof=0)), "n": int(values.size)}


def judge_summary(scores: Sequence[int | None]) -> dict:
    """Mean ± std, distribution over 1..5, share >= 3, and the count of unparsed scores."""
    parsed = np.array([s for s in scores if s is not None], dtype=np.float64)
    out = _mean_std(parsed)
    out["unparsed"] = sum(s is None for s in scores)
    out["distribution"] = {k: int(np.sum(parsed == k)) for k in range(1, 6)}
    out["frac_ge_3"] = float(np.mean(parsed >= 3)) if parsed.size else None
    return out


def code_match_summary(matches: Sequence[float | None]) -> dict:
    """Mean, share fully matched, share >= 0.5, share zero, and a histogram in 20% bins.

    Bins are [0, 0.2), [0.2, 0.4), [0.4, 0.6), [0.6, 0.8), [0.8, 1.0]; missing
    values (no held-out input could be compared with the true function) are
    counted as `missing`.
    """
    values = np.array([m for m in matches if m is not None], dtype=np.float64)
    out = _mean_std(values)
    out["missing"] = sum(m is None for m in matches)
    if values.size:
        out["frac_full"] = float(np.mean(values >= 1.0))
        out["frac_ge_half"] = float(np.mean(values >= 0.5))
        out["frac_zero"] = float(np.mean(values <= 0.0))
        counts, _ = np.histogram(values, bins=CODE_MATCH_BINS)
        out["bins"] = [int(c) for c in counts]
    else:
        out.update(frac_full=None, frac_ge_half=None, frac_zero=None, bins=[0] * 5)
    return out


def parse_failure_rates(records: Sequence[dict]) -> dict[str, float]:
    """Per phase of the recorded steps, the share whose output the environment could not parse."""
    counts: dict[str, list[int]] = {}
    for r in records:
        for step in r.get("steps", ()):
            if "phase" in step and "parse_ok" in step:
                seen = counts.setdefault(step["phase"], [0, 0])
                seen[0] += not step["parse_ok"]
                seen[1] += 1
    return {phase: failed / total for phase, (failed, total) in sorted(counts.items())}


def summarize(records: Sequence[dict]) -> dict:
    """All metrics over the records, overall, per `source` and per description origin.

    The judge compares with the gold description, so its scores mean what that description
    is worth: `per_description_origin` reads them by where it came from (the benchmark's own
    text, a model's verified by execution on all held-out examples or on a majority, a
    model's unverified: `origin_group`).
    """

    def block(rs):
        calls = np.array([r["n_calls"] for r in rs], dtype=np.float64)
        stops = [bool(r["stopped_by_agent"]) for r in rs if r["stopped_by_agent"] is not None]
        out = {
            "episodes": len(rs),
            "calls": _mean_std(calls),
            "stop_rate": float(np.mean(stops)) if stops else None,
            "judge": judge_summary(
                [
                    r.get("judge_score")
                    for r in rs
                    if "judge_score" in r and not r.get("judge_skipped")
                ]
            ),
            "code_match": code_match_summary(
                [r.get("code_match") for r in rs if "code_match" in r]
            ),
        }
        # Items with held-out inputs whose true result could not be obtained (not compared).
        out["code_match"]["incomparable_items"] = sum(
            1 for r in rs if r.get("code_match_incomparable")
        )
        phases = parse_failure_rates(rs)
        if phases:
            out["parse_failure_rate"] = phases
        out["finish_reasons"] = dict(
            sorted(collections.Counter(r.get("finish_reason") or "none" for r in rs).items())
        )
        if any("failure_by" in r for r in rs):
            out["failure_modes"] = failure_modes.failure_summary(rs)
        return out

    out = block(list(records))
    sources = sorted({r["source"] for r in records if r.get("source")})
    out["per_source"] = {s: block([r for r in records if r.get("source") == s]) for s in sources}
    origins = collections.defaultdict(list)
    for r in records:
        if r.get("description_origin"):
            origins[origin_group(r["description_origin"])].append(r)
    out["per_description_origin"] = {k: block(v) for k, v in sorted(origins.items())}
    return out


def origin_group(origin: str) -> str:
    """A description origin without its per-item count: ``annotator:m verified 4/4`` ->
    ``annotator:m verified all``, ``annotator:m verified 3/4`` -> ``annotator:m verified
    majority`` (a majority can keep a wrong description); others as they are."""
    head, sep, count = origin.partition(" verified ")
    if not sep:
        return origin
    matched, _, held_out = count.partition("/")
    return f"{head} verified {'all' if matched == held_out else 'majority'}"


def gold_shares(summaries: dict) -> dict:
    """The gold run's code match and every other run's code match as a share of it."""
    g = summaries.get("gold", {}).get("code_match", {}).get("mean")
    if g is None:
        return {}
    shares = {
        name: s["code_match"]["mean"] / g
        for name, s in summaries.items()
        if name != "gold" and s["code_match"]["mean"] is not None and g > 0
    }
    return {"code_match_mean": g, "share_of_gold": shares}
