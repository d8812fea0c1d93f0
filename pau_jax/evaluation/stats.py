"""Paired statistics for comparing runs on the same items: bootstrap CIs, permutation tests, max ensemble.

All functions are seeded and deterministic; bootstrap resamples have the full
size of the data (n items drawn with replacement).
"""

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval:
    """A point estimate with a two-sided confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float


def _as_array(x, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D sequence of numbers, got shape {arr.shape}"
        )
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} holds NaN or infinite values; drop or fill them first")
    return arr


def _paired(a, b) -> np.ndarray:
    a, b = _as_array(a, "a"), _as_array(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"paired samples need equal lengths, got {a.size} and {b.size}")
    return a - b


def bootstrap_mean(
    x: Sequence[float], *, n_resamples: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> Interval:
    """Percentile bootstrap CI of the mean of `x`."""
    x = _as_array(x, "x")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_resamples, x.size))
    means = x[idx].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(
        estimate=float(x.mean()), low=float(low), high=float(high), confidence=confidence
    )


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap CI of mean(a - b) over items resampled jointly."""
    return bootstrap_mean(_paired(a, b), n_resamples=n_resamples, confidence=confidence, seed=seed)


def paired_permutation_test(
    a: Sequence[float],
    b: Sequence[float],
    *,
    n_permutations: int = 10_000,
    seed: int = 0,
    alternative: str = "two-sided",
) -> float:
    """p-value of mean(a - b) under random swaps of each pair (sign flips of the differences).

    Enumerates all 2^n sign patterns when that is at most `n_permutations`
    (exact test); otherwise draws `n_permutations` random patterns and counts
    the observed one too (p = (k + 1) / (m + 1), never zero).

    Args:
      alternative: 'two-sided', 'greater' (a > b) or 'less' (a < b).
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")
    d = _paired(a, b)
    observed = d.mean()
    n = d.size
    if 2**n <= n_permutations:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        stats = (signs * d).mean(axis=1)
        extra = 0
    else:
        rng = np.random.default_rng(seed)
        signs = rng.choice((1.0, -1.0), size=(n_permutations, n))
        stats = (signs * d).mean(axis=1)
        extra = 1
    eps = 1e-12 * max(1.0, abs(observed))
    if alternative == "two-sided":
        hits = np.sum(np.abs(stats) >= abs(observed) - eps)
    elif alternative == "greater":
        hits = np.sum(stats >= observed - eps)
    else:
        hits = np.sum(stats <= observed + eps)
    return float((hits + extra) / (stats.size + extra))


def max_ensemble(runs: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Per item, the best score over runs (the paper's "max ensemble" upper bound).

    Args:
      runs: run name -> {item id -> score}. Every run must score the same items.
    """
    if not runs:
        raise ValueError("max_ensemble needs at least one run")
    names = list(runs)
    items = set(runs[names[0]])
    for name in names[1:]:
        if set(runs[name]) != items:
            missing = sorted(items ^ set(runs[name]))[:5]
            raise ValueError(f"run {name!r} scores different items than {names[0]!r}: {missing}")
    return {item: max(runs[name][item] for name in names) for item in sorted(items)}


def bootstrap_interval(values, seed: int, resamples: int) -> dict | None:
    """`bootstrap_mean` of `values` as a dict; None for no values."""
    if not values:
        return None
    return dataclasses.asdict(bootstrap_mean(values, n_resamples=resamples, seed=seed))


def paired_comparison(a: dict, b: dict, key: str, seed: int, resamples: int) -> dict | None:
    """Paired bootstrap and permutation p of `key` over the tasks both runs scored (dicts
    task id -> record); None when they share none."""
    common = sorted(
        t for t in a if t in b and a[t].get(key) is not None and b[t].get(key) is not None
    )
    if not common:
        return None
    x = [float(a[t][key]) for t in common]
    y = [float(b[t][key]) for t in common]
    out = dataclasses.asdict(paired_bootstrap(x, y, n_resamples=resamples, seed=seed))
    out["p_value"] = paired_permutation_test(x, y, n_permutations=resamples, seed=seed)
    out["n"] = len(common)
    return out


def compare_runs(
    a: Sequence[dict],
    b: Sequence[dict],
    *,
    seed: int,
    resamples: int,
    keys: Sequence[str] = ("code_match", "judge_score"),
) -> dict:
    """`paired_comparison` of mean(a - b) for each key over two runs' records (matched by
    `task_id`); a key no task has in both runs is left out."""
    by_a = {r["task_id"]: r for r in a}
    by_b = {r["task_id"]: r for r in b}
    pair = {key: paired_comparison(by_a, by_b, key, seed, resamples) for key in keys}
    return {k: v for k, v in pair.items() if v is not None}


def summarize_runs(
    runs: Mapping[str, Sequence[dict]],
    *,
    paired: Sequence[tuple[str, str]],
    ensembled: Sequence[tuple[str, str]],
    seed: int,
    resamples: int,
    suffixes: Sequence[str] = ("", "+observations"),
) -> dict:
    """The statistics of a set of scored runs, as written to metrics.json.

    Args:
      runs: run name -> scored records (`task_id`, `code_match`, `judge_score`).
      paired: (a, b) run names compared when both are present: mean(a - b), per suffix.
      ensembled: (a, b) run names whose per-task best code match is reported, per suffix
        (every task of b must be scored in a, as for `max_ensemble`).
      seed, resamples: the bootstrap and permutation settings.
      suffixes: run-name suffixes of the coder variants each pair is taken for.

    Returns:
      {"intervals": run -> {"code_match", "judge"} bootstrap intervals of the mean,
       "comparisons": "a vs b" -> `compare_runs`,
       "max_ensemble": "max(a, b)" -> {"code_match_mean", "n"}}.
    """
    intervals = {}
    for name, records in runs.items():
        matches = [r["code_match"] for r in records if r.get("code_match") is not None]
        judged = [r["judge_score"] for r in records if r.get("judge_score") is not None]
        ivs = {"code_match": bootstrap_interval(matches, seed, resamples)}
        ivs["judge"] = bootstrap_interval(judged, seed, resamples)
        intervals[name] = {k: v for k, v in ivs.items() if v is not None}
    comparisons = {}
    for (first, second), suffix in itertools.product(paired, suffixes):
        a, b = runs.get(first + suffix), runs.get(second + suffix)
        if a is not None and b is not None:
            comparisons[f"{first}{suffix} vs {second}{suffix}"] = compare_runs(
                a, b, seed=seed, resamples=resamples
            )
    ensembles = {}
    for (first, second), suffix in itertools.product(ensembled, suffixes):
        a, b = runs.get(first + suffix), runs.get(second + suffix)
        if a is None or b is None:
            continue
        by_a = {r["task_id"]: r["code_match"] for r in a}
        by_b = {r["task_id"]: r["code_match"] for r in b}
        best = max_ensemble({first: by_a, second: {t: m for t, m in by_b.items() if t in by_a}})
        ensembles[f"max({first}{suffix}, {second}{suffix})"] = {
            "code_match_mean": sum(best.values()) / len(best),
            "n": len(best),
        }
    return {"intervals": intervals, "comparisons": comparisons, "max_ensemble": ensembles}
