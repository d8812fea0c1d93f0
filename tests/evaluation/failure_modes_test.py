"""Failure-mode attribution: the pre-check table, category parsing, batching, summaries."""

import pytest

from pau_jax.evaluation import failure_modes, metrics, report


def _record(task_id, *, code_match=0.0, judge_score=None, prediction="adds", gen_ok=(True,),
            rev_ok=(True,), n_calls=1, stopped=True):  # fmt: skip
    steps = [{"phase": "generate", "parse_ok": ok} for ok in gen_ok]
    steps += [{"phase": "revise", "parse_ok": ok} for ok in rev_ok]
    return {
        "task_id": task_id,
        "header": "def test_func(arg0):",
        "prediction": prediction,
        "n_calls": n_calls,
        "stopped_by_agent": stopped,
        "observations": [{"call": "test_func(1)", "result": "2"}],
        "steps": steps,
        "code_match": code_match,
        "judge_score": judge_score,
    }


@pytest.mark.parametrize(
    "record,expected",
    [
        (_record("a", prediction=""), "format error"),
        (_record("b", prediction="  \n"), "format error"),
        (_record("c", gen_ok=(False, False)), "format error"),
        (_record("d", gen_ok=(False, True)), None),
        (_record("e", rev_ok=(False, False)), "format error"),
        (_record("f", rev_ok=(False, True)), None),
        (_record("g", gen_ok=(), rev_ok=()), None),  # in-context record with a description
    ],
)
def test_precheck(record, expected):
    assert failure_modes.precheck(record) == expected


@pytest.mark.parametrize(
    "text,category",
    [
        (
            "It never tried empty lists.\nCategory: insufficient exploration",
            "insufficient exploration",
        ),
        ("Category: **Hallucination**", "hallucination"),
        ("category = overconfident_conclusion", "overconfident conclusion"),
        ("Category: Format-Error", "format error"),
        ("<think>Category: other</think>Category: hallucination", "hallucination"),
        ("Category: hallucination\nOn reflection, Category: other", "other"),
        ("Category: laziness", None),
        ("I think it hallucinated.", None),
        ("", None),
    ],
)
def test_parse_category(text, category):
    assert failure_modes.parse_category(text) == category


def test_is_low():
    assert failure_modes.is_low({"code_match": 0.4, "judge_score": 5})
    assert failure_modes.is_low({"code_match": 1.0, "judge_score": 2})
    assert not failure_modes.is_low({"code_match": 0.5, "judge_score": 3})
    assert not failure_modes.is_low({"code_match": None, "judge_score": None})
    assert failure_modes.is_low({"code_match": 0.9}, code_match_below=1.0)


def test_attribute_judges_only_open_low_records_in_one_call():
    records = [
        _record("ok", code_match=1.0, judge_score=5),
        _record("fmt", prediction=""),
        _record("j1", n_calls=7),
        _record("j2", code_match=0.2),
        _record("j3", judge_score=1, code_match=0.9),
    ]
    batches = []

    def judge(conversations):
        batches.append([c[0]["content"] for c in conversations])
        return ["Category: hallucination", "Category: insufficient exploration", "no idea"]

    out = failure_modes.attribute(records, judge, golds={"j1": "Adds one."})
    by_id = {r["task_id"]: r for r in out}
    assert len(batches) == 1 and len(batches[0]) == 3
    assert "True description: Adds one." in batches[0][0] and "Calls made: 7" in batches[0][0]
    assert "failure_mode" not in by_id["ok"]
    assert (
        by_id["fmt"]["failure_mode"] == "format error" and by_id["fmt"]["failure_by"] == "precheck"
    )
    assert by_id["j1"]["failure_mode"] == "hallucination"
    assert by_id["j2"]["failure_mode"] == "insufficient exploration"
    assert by_id["j3"]["failure_mode"] is None and by_id["j3"]["failure_raw"] == "no idea"
    assert "failure_mode" not in records[1]  # inputs are not modified

    summary = failure_modes.failure_summary(out)
    assert summary["low_scoring"] == 4 and summary["unparsed"] == 1
    assert summary["by_precheck"] == 1 and summary["unjudged"] == 0
    assert summary["counts"] == {
        "format error": 1,
        "hallucination": 1,
        "insufficient exploration": 1,
        "overconfident conclusion": 0,
        "other": 0,
    }


def test_without_judge_open_records_stay_unjudged():
    out = failure_modes.attribute([_record("x")], None)
    assert out[0]["failure_mode"] is None and out[0]["failure_by"] == "none"
    assert failure_modes.failure_summary(out)["unjudged"] == 1


def test_summaries_reach_metrics_and_report(tmp_path):
    records = failure_modes.attribute(
        [_record("a", prediction=""), _record("b", code_match=1.0, judge_score=4)], None
    )
    for r in records:
        r["source"] = "mbpp"
    summary = metrics.summarize(records)
    assert summary["failure_modes"]["counts"]["format error"] == 1
    assert summary["per_source"]["mbpp"]["failure_modes"]["low_scoring"] == 1
    assert "failure_modes" not in metrics.summarize([_record("c")])
    text = report.write_report(tmp_path, {"interactive": records}).read_text()
    assert "## Failure modes of low-scoring episodes" in text
    assert "| interactive | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 1 |" in text
