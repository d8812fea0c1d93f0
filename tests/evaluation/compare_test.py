"""The comparison over run directories, checked against numbers computed by hand."""

import itertools
import json

import numpy as np
import pytest

from pau_jax.evaluation import compare

SEED, RESAMPLES = 3, 400
SOURCES = {"t1": "mbpp", "t2": "mbpp", "t3": "humaneval", "t4": "mbpp", "t5": "cruxeval"}
# Per run: task -> (judge score, code match, failure mode). t1..t3 are common to all runs;
# t4 and t5 (perfect scores) exist in some runs only and must be dropped everywhere.
EXTRA = (5, 1.0, "hallucination")
RUNS = {
    "alpha": {
        "interactive": {
            "t1": (5, 1.0, None),
            "t2": (3, 0.5, None),
            "t3": (1, 0.0, "hallucination"),
            "t4": EXTRA,
        },
        "in_context": {"t1": (4, 0.5, None), "t2": (2, 0.5, None), "t3": (2, 0.25, None), "t4": EXTRA},
    },
    "beta": {
        "interactive": {
            "t1": (2, 0.0, "insufficient exploration"),
            "t2": (3, 1.0, None),
            "t3": (None, 0.5, None),  # an unparsed judge rating
            "t4": EXTRA,
            "t5": EXTRA,
        },
    },
    "gamma": {
        "interactive": {
            "t1": (4, 0.25, "insufficient exploration"),
            "t2": (4, 0.5, None),
            "t3": (4, 0.0, "overconfident conclusion"),
            "t5": EXTRA,
        },
        "gold": {"t1": (None, 1.0, None), "t2": (None, 1.0, None), "t3": (None, 1.0, None), "t5": EXTRA},
    },
}  # fmt: skip


def _write_runs(root):
    dirs = []
    for label, runs in RUNS.items():
        directory = root / "runs" / label
        directory.mkdir(parents=True)
        for mode, tasks in runs.items():
            with (directory / f"{mode}_scored.jsonl").open("w") as f:
                for task, (judge, code, failure) in tasks.items():
                    record = {
                        "task_id": task,
                        "source": SOURCES[task],
                        "prediction": "...",
                        "judge_score": None if mode == "gold" else judge,
                        "judge_skipped": mode == "gold",
                        "code_match": code,
                    }
                    if failure:
                        record.update(failure_mode=failure, failure_by="judge")
                    f.write(json.dumps(record) + "\n")
        metrics = {
            "grading": {"judge": "llama", "coder": "qwen-coder", "self_graded": False},
            "agent": f"checkpoint /ckpt/{label}",
            "runs": {mode: {} for mode in runs},
        }
        (directory / "metrics.json").write_text(json.dumps(metrics))
        dirs.append(str(directory))
    return dirs


def _bootstrap(x):
    """The percentile bootstrap interval of the mean, by hand."""
    x = np.asarray(x, float)
    idx = np.random.default_rng(SEED).integers(0, len(x), size=(RESAMPLES, len(x)))
    low, high = np.quantile(x[idx].mean(axis=1), [0.025, 0.975])
    return x.mean(), low, high


def _exact_p(a, b):
    d = np.asarray(a, float) - np.asarray(b, float)
    means = [np.mean(np.array(s) * d) for s in itertools.product((1, -1), repeat=len(d))]
    return np.mean([abs(m) >= abs(d.mean()) - 1e-12 for m in means])


def _check(iv, values):
    mean, low, high = _bootstrap(values)
    assert iv["estimate"] == pytest.approx(mean) and iv["n"] == len(values)
    assert (iv["low"], iv["high"]) == pytest.approx((low, high))


def test_three_run_directories_against_hand_computed_numbers(tmp_path, capsys):
    dirs = _write_runs(tmp_path)
    out = tmp_path / "cmp"
    result = compare.main(
        [
            *dirs,
            "--out",
            str(out),
            "--seed",
            str(SEED),
            "--resamples",
            str(RESAMPLES),
            "--top_k",
            "2",
        ]
    )
    assert result["tasks"] == 3
    dropped = {r["name"]: r["dropped"] for r in result["runs"]}
    assert dropped == {
        "alpha/interactive": 1,
        "alpha/in_context": 1,
        "beta/interactive": 2,
        "gamma/interactive": 1,
        "gamma/gold": 1,
    }
    table = result["table"]
    _check(table["alpha/interactive"]["judge"], [5, 3, 1])
    _check(table["alpha/interactive"]["code_match"], [1.0, 0.5, 0.0])
    _check(table["alpha/in_context"]["judge"], [4, 2, 2])
    _check(table["beta/interactive"]["judge"], [2, 3])  # the unparsed rating is left out
    _check(table["gamma/interactive"]["code_match"], [0.25, 0.5, 0.0])
    assert table["gamma/gold"]["judge"] is None
    _check(result["per_source"]["mbpp"]["alpha/interactive"]["judge"], [5, 3])
    _check(result["per_source"]["humaneval"]["alpha/interactive"]["code_match"], [0.0])
    assert "cruxeval" not in result["per_source"]  # t5 is not common to all runs

    # Max ensemble over the four non-gold runs, per task: judge 5, 4, 4; code 1, 1, 0.5.
    ensemble = result["ensemble"]
    assert ensemble["members"] == [
        "alpha/interactive",
        "alpha/in_context",
        "beta/interactive",
        "gamma/interactive",
    ]
    _check(ensemble["judge"], [5, 4, 4])
    _check(ensemble["code_match"], [1.0, 1.0, 0.5])
    assert ensemble["code_match_zero"] == 0.0 and ensemble["code_match_full"] == pytest.approx(
        2 / 3
    )

    # Paired tests: exact over the 2^3 sign patterns; intervals of the mean difference.
    pair = next(
        p
        for p in result["pairs"]
        if (p["a"], p["b"], p["metric"]) == ("alpha/interactive", "alpha/in_context", "code_match")
    )
    a, b = [1.0, 0.5, 0.0], [0.5, 0.5, 0.25]
    assert pair["p"] == pytest.approx(_exact_p(a, b)) and pair["n"] == 3
    _, low, high = _bootstrap(np.subtract(a, b))
    assert (pair["estimate"], pair["low"], pair["high"]) == pytest.approx((1 / 12, low, high))
    judge_pair = next(
        p
        for p in result["pairs"]
        if (p["a"], p["b"], p["metric"]) == ("alpha/interactive", "beta/interactive", "judge")
    )
    assert judge_pair["n"] == 2 and judge_pair["p"] == pytest.approx(_exact_p([5, 3], [2, 3]))
    assert len(result["pairs"]) == 10 + 6  # code match: all 10 pairs; judge: none with gold
    judge_ps = [p["p"] for p in result["pairs"] if p["metric"] == "judge"]
    smallest = min(range(len(judge_ps)), key=lambda i: judge_ps[i])
    adjusted = [p["p_holm"] for p in result["pairs"] if p["metric"] == "judge"]
    assert adjusted[smallest] == pytest.approx(min(1.0, len(judge_ps) * judge_ps[smallest]))

    # Gold and the strongest two interactive runs (judge 4.0 gamma, 3.0 alpha; beta 2.5).
    assert result["gold"]["code_match"] == 1.0
    assert result["gold"]["share_of_gold"]["gamma/interactive"] == pytest.approx(0.25)
    failures = result["failure_modes"]
    assert failures["runs"] == ["gamma/interactive", "alpha/interactive"]
    assert failures["low_scoring"] == 3
    assert failures["counts"]["insufficient exploration"] == 1
    assert failures["counts"]["overconfident conclusion"] == 1
    assert failures["counts"]["hallucination"] == 1  # t4's attribution was dropped with t4
    assert failures["shares"]["hallucination"] == pytest.approx(1 / 3)

    report = (out / "report.md").read_text()
    assert "3 tasks are common to all runs" in report
    assert "| beta/interactive | checkpoint /ckpt/beta | llama | qwen-coder | 5 | 2 |" in report
    assert "| model | interactive judge | interactive code match % | in_context judge" in report
    assert "| alpha | 3.00 [" in report and "| gamma | 4.00 [" in report
    assert "## Max ensemble" in report and "## Failure modes pooled over the strongest 2" in report
    assert "### mbpp" in report and "### humaneval" in report
    assert json.loads((out / "compare.json").read_text()) == json.loads(json.dumps(result))
    for image in ("judge.png", "code_match.png", "failure_modes.png"):
        assert (out / image).stat().st_size > 1000
    assert "[compare] beta/interactive: judge 2.50" in capsys.readouterr().out


def test_labels_modes_and_clear_errors(tmp_path):
    dirs = _write_runs(tmp_path)
    runs = compare.load_runs(dirs, ["a", "b", "c"], modes={"interactive"})
    assert [r.name for r in runs] == ["a/interactive", "b/interactive", "c/interactive"]
    result = compare.compare(runs, seed=SEED, resamples=RESAMPLES)
    assert result["gold"] == {} and result["tasks"] == 3
    with pytest.raises(ValueError, match="one distinct label per run directory"):
        compare.load_runs(dirs, ["a", "a", "c"])
    with pytest.raises(ValueError, match="holds no <run>_scored.jsonl"):
        compare.load_runs([str(tmp_path)])
    lonely = compare.Run(
        name="x/interactive", label="x", mode="interactive", directory="", agent="", judge="",
        coder="", self_graded=False, records={"other": {"task_id": "other"}},
    )  # fmt: skip
    with pytest.raises(ValueError, match="share no task id"):
        compare.compare([runs[0], lonely])


def test_holm_by_hand():
    assert compare.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
