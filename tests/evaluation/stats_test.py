"""Paired statistics against hand-computed values and scipy."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from pau_jax.evaluation import stats


def test_permutation_exact_hand_computed():
    # d = [1, 2]: sign patterns give means 1.5, -0.5, 0.5, -1.5; |.| >= 1.5 twice -> p = 2/4.
    assert stats.paired_permutation_test([3, 4], [2, 2]) == pytest.approx(0.5)
    assert stats.paired_permutation_test([3, 4], [2, 2], alternative="greater") == pytest.approx(
        0.25
    )
    assert stats.paired_permutation_test([3, 4], [2, 2], alternative="less") == pytest.approx(1.0)


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_permutation_exact_matches_scipy(alternative):
    rng = np.random.default_rng(3)
    a = rng.integers(1, 6, size=10).astype(float)
    b = rng.integers(1, 6, size=10).astype(float)
    ours = stats.paired_permutation_test(a, b, alternative=alternative)
    ref = scipy_stats.permutation_test(
        (a, b),
        lambda x, y: np.mean(x - y),
        permutation_type="samples",
        alternative=alternative,
        n_resamples=np.inf,
    ).pvalue
    assert ours == pytest.approx(ref, abs=1e-12)


def test_permutation_random_close_to_exact_and_seeded():
    rng = np.random.default_rng(0)
    a = rng.normal(0.3, 1, size=30)
    b = rng.normal(0.0, 1, size=30)
    p1 = stats.paired_permutation_test(a, b, n_permutations=20_000, seed=1)
    p2 = stats.paired_permutation_test(a, b, n_permutations=20_000, seed=1)
    assert p1 == p2
    ref = scipy_stats.ttest_rel(a, b).pvalue  # permutation and t-test agree roughly at n=30
    assert abs(p1 - ref) < 0.05


def test_bootstrap_hand_and_properties():
    # Constant data: every resample has the same mean.
    iv = stats.bootstrap_mean([2.0, 2.0, 2.0])
    assert (iv.estimate, iv.low, iv.high) == (2.0, 2.0, 2.0)
    x = np.random.default_rng(5).normal(1.0, 2.0, size=200)
    iv = stats.bootstrap_mean(x, seed=7)
    assert iv == stats.bootstrap_mean(x, seed=7)
    assert iv.low < x.mean() < iv.high
    # Close to the normal-theory interval for n = 200.
    half = 1.96 * x.std(ddof=1) / np.sqrt(x.size)
    assert iv.low == pytest.approx(x.mean() - half, abs=0.1)
    assert iv.high == pytest.approx(x.mean() + half, abs=0.1)


def test_bootstrap_matches_scipy_percentile():
    x = np.random.default_rng(11).exponential(size=80)
    ours = stats.bootstrap_mean(x, n_resamples=20_000, seed=2)
    ref = scipy_stats.bootstrap(
        (x,), np.mean, n_resamples=20_000, method="percentile", random_state=2
    ).confidence_interval
    assert ours.low == pytest.approx(ref.low, abs=0.02)
    assert ours.high == pytest.approx(ref.high, abs=0.02)


def test_paired_bootstrap_is_bootstrap_of_differences():
    a, b = [5, 3, 4, 1], [4, 3, 2, 2]
    assert stats.paired_bootstrap(a, b, seed=4) == stats.bootstrap_mean([1, 0, 2, -1], seed=4)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_bootstrap([1, 2], [1])
    with pytest.raises(ValueError, match="NaN"):
        stats.bootstrap_mean([1, float("nan")])
    with pytest.raises(ValueError, match="alternative"):
        stats.paired_permutation_test([1], [2], alternative="bigger")


def test_max_ensemble():
    runs = {"x": {"t1": 1, "t2": 5}, "y": {"t1": 3, "t2": 2}}
    assert stats.max_ensemble(runs) == {"t1": 3, "t2": 5}
    with pytest.raises(ValueError, match="different items"):
        stats.max_ensemble({"x": {"t1": 1}, "y": {"t2": 1}})


def test_summarize_runs_intervals_pairs_and_ensemble():
    def run(matches, judged):
        return [
            {"task_id": f"t{i}", "code_match": m, "judge_score": j}
            for i, (m, j) in enumerate(zip(matches, judged, strict=True))
        ]

    runs = {
        "a": run([1.0, 0.0, 0.5], [5, 1, None]),
        "b": run([0.0, 1.0, 0.5], [3, 3, 3]),
        "a+observations": run([1.0, 1.0, 1.0], [None, None, None]),
    }
    out = stats.summarize_runs(
        runs, paired=[("a", "b")], ensembled=[("a", "b")], seed=0, resamples=200
    )
    assert set(out) == {"intervals", "comparisons", "max_ensemble"}
    assert set(out["intervals"]["a+observations"]) == {"code_match"}  # no judge scores
    assert out["intervals"]["b"]["judge"]["estimate"] == pytest.approx(3.0)
    assert list(out["comparisons"]) == ["a vs b"]  # b+observations is missing
    pair = out["comparisons"]["a vs b"]
    assert pair["code_match"]["n"] == 3 and pair["judge_score"]["n"] == 2
    assert pair["judge_score"]["estimate"] == pytest.approx(0.0)
    assert out["max_ensemble"] == {"max(a, b)": {"code_match_mean": pytest.approx(2.5 / 3), "n": 3}}
