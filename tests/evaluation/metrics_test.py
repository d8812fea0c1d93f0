"""Summary metrics against hand-computed values."""

import pytest

from pau_jax.evaluation import metrics


def test_judge_summary_counts_unparsed_and_never_fills_them():
    out = metrics.judge_summary([1, 3, 5, None, 3])
    assert out["mean"] == pytest.approx(3.0)
    assert out["std"] == pytest.approx((8 / 4) ** 0.5)  # deviations -2, 0, 2, 0
    assert out["n"] == 4 and out["unparsed"] == 1
    assert out["distribution"] == {1: 1, 2: 0, 3: 2, 4: 0, 5: 1}
    assert out["frac_ge_3"] == pytest.approx(0.75)


def test_code_match_summary_bins_and_fractions():
    out = metrics.code_match_summary([0.0, 0.1, 0.5, 0.79, 1.0, 1.0, None])
    assert out["missing"] == 1
    assert out["mean"] == pytest.approx((0.0 + 0.1 + 0.5 + 0.79 + 2.0) / 6)
    assert out["frac_full"] == pytest.approx(2 / 6)
    assert out["frac_ge_half"] == pytest.approx(4 / 6)
    assert out["frac_zero"] == pytest.approx(1 / 6)
    assert out["bins"] == [2, 0, 1, 1, 2]


def test_summarize_overall_and_per_source():
    records = [
        {
            "n_calls": 4,
            "stopped_by_agent": True,
            "judge_score": 4,
            "code_match": 1.0,
            "source": "mbpp",
        },
        {
            "n_calls": 2,
            "stopped_by_agent": False,
            "judge_score": 2,
            "code_match": 0.0,
            "source": "mbpp",
        },
        {
            "n_calls": 6,
            "stopped_by_agent": True,
            "judge_score": None,
            "code_match": 0.5,
            "source": "cruxeval",
        },
    ]
    out = metrics.summarize(records)
    assert out["episodes"] == 3
    assert out["calls"]["mean"] == pytest.approx(4.0)
    assert out["stop_rate"] == pytest.approx(2 / 3)
    assert out["judge"]["unparsed"] == 1 and out["judge"]["mean"] == pytest.approx(3.0)
    assert out["per_source"]["mbpp"]["code_match"]["mean"] == pytest.approx(0.5)
    assert out["per_source"]["cruxeval"]["judge"]["n"] == 0


def test_empty_inputs():
    assert metrics.judge_summary([])["mean"] is None
    assert metrics.code_match_summary([None])["bins"] == [0, 0, 0, 0, 0]


def test_stop_rate_leaves_out_records_without_a_stop_decision():
    records = [
        {"n_calls": 3, "stopped_by_agent": True},
        {"n_calls": 5, "stopped_by_agent": False},
        {"n_calls": 0, "stopped_by_agent": None},
    ]
    assert metrics.summarize(records)["stop_rate"] == pytest.approx(0.5)
    assert metrics.summarize(records[2:])["stop_rate"] is None


def test_parse_failure_rates_per_phase_and_finish_reasons():
    def step(phase, ok):
        return {"phase": phase, "parse_ok": ok}

    records = [
        {"n_calls": 1, "stopped_by_agent": False, "finish_reason": "budget",
         "steps": [step("conceptualize", True), step("generate", False), step("revise", False)]},
        {"n_calls": 1, "stopped_by_agent": True, "finish_reason": "stop",
         "steps": [step("conceptualize", True), step("generate", True), step("revise", True)]},
    ]  # fmt: skip
    out = metrics.summarize(records)
    assert out["parse_failure_rate"] == {"conceptualize": 0.0, "generate": 0.5, "revise": 0.5}
    assert out["finish_reasons"] == {"budget": 1, "stop": 1}
    assert metrics.parse_failure_rates([{"n_calls": 0}]) == {}


def test_judge_scores_are_read_by_gold_description_origin():
    def rec(score, origin):
        return {
            "n_calls": 1,
            "stopped_by_agent": True,
            "judge_score": score,
            "code_match": 0.5,
            "description_origin": origin,
        }

    records = [
        rec(5, "humaneval_docstring"),
        rec(4, "annotator:m verified 3/4"),
        rec(2, "annotator:m verified 5/5"),
        rec(1, "annotator:m"),
        {"n_calls": 0, "stopped_by_agent": None, "judge_score": None, "judge_skipped": True},
    ]
    by_origin = metrics.summarize(records)["per_description_origin"]
    assert list(by_origin) == [
        "annotator:m",
        "annotator:m verified all",
        "annotator:m verified majority",
        "humaneval_docstring",
    ]
    # Descriptions whose code matched every held-out example are read apart from the rest.
    assert by_origin["annotator:m verified all"]["judge"]["mean"] == pytest.approx(2.0)
    assert by_origin["annotator:m verified majority"]["judge"]["mean"] == pytest.approx(4.0)
    assert by_origin["annotator:m verified majority"]["episodes"] == 1
    assert by_origin["annotator:m"]["judge"]["mean"] == pytest.approx(1.0)
