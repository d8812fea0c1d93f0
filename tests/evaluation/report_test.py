"""The markdown report and its plots."""

import matplotlib.image

from pau_jax.evaluation import report


def _records(scores, matches, source="mbpp"):
    return [
        {"task_id": f"t{i}", "n_calls": 3, "stopped_by_agent": i % 2 == 0, "judge_score": s,
         "code_match": m, "source": source}
        for i, (s, m) in enumerate(zip(scores, matches))
    ]  # fmt: skip


def test_report_tables_and_plots(tmp_path):
    runs = {
        "interactive": _records([5, 4, None, 1], [1.0, 0.5, 0.0, 0.25]),
        "in_context": _records([3, 3, 2, 1], [0.5, 0.5, 0.0, 0.0]),
    }
    path = report.write_report(tmp_path, runs, notes=["seed 0"])
    text = path.read_text()
    assert (
        "| interactive | 4 | 3.33 ± 1.70 | 66.7% | 1 | 0.438 | 25.0% | 50.0% | 25.0% | 3.0 | 50.0% |"
        in text
    )
    assert "| in_context | 4 | 2.25 ± 0.83 | 50.0% | 0 | 0.250 |" in text
    assert "## interactive: per source" in text and "- seed 0" in text
    for name in ("judge_scores.png", "code_match.png", "interactive_vs_in_context.png"):
        assert f"]({name})" in text
        image = matplotlib.image.imread(tmp_path / name)
        assert image.shape[0] > 100 and image.shape[1] > 100


def test_report_without_scores_shows_dashes(tmp_path):
    runs = {"smoke": [{"task_id": "a", "n_calls": 1, "stopped_by_agent": False}]}
    text = report.write_report(tmp_path, runs).read_text()
    assert "| smoke | 1 | – | – | 0 | – |" in text


def test_report_intervals_and_comparisons(tmp_path):
    runs = {"interactive": _records([5, 4], [1.0, 0.5])}
    intervals = {"interactive": {"code_match": {"estimate": 0.75, "low": 0.5, "high": 1.0,
                                                "confidence": 0.95}}}  # fmt: skip
    comparisons = {"interactive vs in_context": {"code_match": {
        "estimate": 0.25, "low": -0.1, "high": 0.5, "confidence": 0.95, "p_value": 0.5}}}  # fmt: skip
    text = report.write_report(
        tmp_path, runs, intervals=intervals, comparisons=comparisons
    ).read_text()
    assert "| interactive | code_match | 0.750 | 0.500 | 1.000 | 95.0% |" in text
    assert "| interactive vs in_context | code_match | 0.250 | -0.100 | 0.500 | 95.0% |" in text
    assert "permutation p = 0.5000" in text
    assert "Failure modes" not in text


def test_training_curves_and_prefixed_mode_pairs(tmp_path):
    runs = {
        "before/interactive": _records([2, 1], [0.0, 0.5]),
        "before/in_context": _records([1, 1], [0.0, 0.0]),
        "after/interactive": _records([3, 2], [0.5, 0.5]),
    }
    history = [
        {"step": 1, "train/loss": 0.5, "rollout/reward_mean": -1.25},
        {"step": 2, "train/loss": 0.25, "rollout/reward_mean": -0.5},
    ]
    text = report.write_report(tmp_path, runs, training=history).read_text()
    assert "## Training" in text
    assert "| 1 | 0.5000 | -1.2500 |" in text and "| 2 | 0.2500 | -0.5000 |" in text
    # Only "before" has both modes, so only it gets the per-task scatter.
    assert "](before_interactive_vs_in_context.png)" in text
    assert not (tmp_path / "after_interactive_vs_in_context.png").exists()
    for name in ("training.png", "before_interactive_vs_in_context.png"):
        assert f"]({name})" in text
        assert matplotlib.image.imread(tmp_path / name).shape[0] > 100
