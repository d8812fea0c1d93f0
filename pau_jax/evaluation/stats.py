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
