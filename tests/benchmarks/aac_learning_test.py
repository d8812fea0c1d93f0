"""benchmarks/aac_learning.py: its one-sided test, its report from metrics, a tiny end-to-end run."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats

from pau_jax.rl import credit

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "aac_learning.py"


def _load():
    spec = importlib.util.spec_from_file_location("aac_learning", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_the_test_is_the_exact_one_sided_sign_flip_test():
    # Differences 1, 2, 3, -0.5: of the 16 sign patterns, the observed one and the one that
    # flips -0.5 reach a mean >= the observed 5.5 / 4.
    p, gain = bench.one_sided_test([1.0, 2.0, 3.0, -0.5], [0.0, 0.0, 0.0, 0.0])
    assert p == pytest.approx(2 / 16) and gain == pytest.approx(5.5 / 4)
    control = np.array([0.3, -1.0, 0.2, 0.5, 0.0, 2.0])
    assert bench.one_sided_test(control + [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], control)[0] == 2**-6
    assert bench.one_sided_test(control - 0.5, control)[0] == 1.0
    assert bench.one_sided_test(control, control) == (1.0, 0.0)
    rng = np.random.default_rng(0)
    for _ in range(5):
        trained, base = rng.normal(0.3, 1, 7), rng.normal(0, 1, 7)
        theirs = scipy.stats.permutation_test(
            (trained, base),
            lambda x, y: np.mean(x - y),
            permutation_type="samples",
            alternative="greater",
            n_resamples=np.inf,
        )
        assert bench.one_sided_test(trained, base)[0] == pytest.approx(theirs.pvalue)


def test_the_test_holds_its_level_and_detects_a_gain():
    rng = np.random.default_rng(1)
    task = rng.normal(0, 2, (1000, 8))  # Per-step task difficulty, shared by both runs.
    null = [bench.one_sided_test(t + rng.normal(0, 1, 8), t + rng.normal(0, 1, 8))[0] for t in task]
    assert np.mean(np.array(null) <= 0.05) <= 0.05 + 0.02
    gain = [
        bench.one_sided_test(t + 1.5 + rng.normal(0, 1, 8), t + rng.normal(0, 1, 8))[0]
        for t in task[:200]
    ]
    assert np.mean(np.array(gain) <= 0.05) > 0.8


def test_the_probe_passes_the_advantages_through_and_logs_their_signal(tmp_path):
    path = tmp_path / "advantages.jsonl"
    probe = bench.AdvantageProbe(credit.return_to_go, path, first_step=4)
    rewards = [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 1.0]]
    groups = [0, 0, 1, 1]  # Group 0: identical episodes, nothing to compare.
    out = probe(rewards, groups)
    for a, b in zip(out, credit.return_to_go(rewards, groups), strict=True):
        np.testing.assert_array_equal(a, b)
    probe(rewards[2:], groups[2:])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 5]
    assert rows[0]["zero_advantage_group_rate"] == 0.5 and rows[1]["zero_advantage_group_rate"] == 0
    # Group 1 ties at position 2 (reward 1 in both episodes): 4 + 2 of the 8 steps get 0.
    assert rows[0]["zero_advantage_step_rate"] == 0.75
    assert rows[0]["group_return_std"] == pytest.approx((0 + 1.0) / 2)
    assert credit.describe(probe).startswith("return_to_go:")


def _row(step: int, reward: float) -> dict:
    row = dict.fromkeys(bench.KEYS, 0.1)
    row.update({"step": step, bench.REWARD: reward, "train/grad_norm": 0.5, "grpo/kl": 0.0})
    return row


def _fake_out(out: pathlib.Path, rewards: dict, argv: list[str]) -> None:
    """An --out folder as three finished runs with the given per-step rewards would leave it."""
    checkpoint = out / "model"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    for name, values in rewards.items():
        run = out / "runs" / name
        run.mkdir(parents=True)
        rows = [_row(s + 1, r) for s, r in enumerate(values)]
        if name == "control":  # A run at learning rate 0 logs no update.
            rows = [{k: v for k, v in r.items() if k not in bench.UPDATE_KEYS} for r in rows]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "summary.json").write_text(json.dumps({"steps": len(values)}))
        probe = {"step": 1, "zero_advantage_group_rate": 1.0, "advantage_var": 0.0}
        (run / "advantages.jsonl").write_text(json.dumps(dict(probe, group_return_std=0)) + "\n")


def test_report_of_finished_runs_tables_plots_and_headline(tmp_path, capsys):
    control = [-2.0, -1.5, -2.2, -1.8, -2.1, -1.7, -2.0, -1.9]
    rewards = {
        "process_grpo": [c + 0.1 * s for s, c in enumerate(control)],  # Climbs above control.
        "return_to_go": list(control),  # Learns nothing.
        "control": control,
    }
    argv = ["--out", str(tmp_path), "--checkpoint", str(tmp_path / "model")]
    argv += ["--steps", "8", "--last_k", "5", "--compilation_cache", ""]
    argv += ["--credits", "process_grpo", "return_to_go"]
    _fake_out(tmp_path, rewards, argv)
    bench.main(argv)
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == (
        "p_process_grpo=0.0312 p_return_to_go=1 reward_gain_process_grpo=+0.500 "
        "reward_gain_return_to_go=+0.000 p_non_length_process_grpo=0.0312 "
        "p_non_length_return_to_go=1 last_k=5 steps=8"
    )
    for name in ("learning_curves.png", "reward_terms.png", "diagnostics.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "aac_learning.md").read_text()
    # Two trained runs: Holm-corrected p in brackets; the length term (0.1) is left out.
    assert (
        "| process_grpo | -1.400 | +0.500 | 0.0312 [0.0625] | +0.500 | 0.0312 [0.0625] |" in table
    )
    assert "| control | -1.900 |  |  |  |  |" in table
    assert "| 8 | -1.200 | -1.900 | -1.900 |" in table
    assert "Why `return_to_go` did not learn" in table and "process_grpo` did not" not in table
    assert "Exploration, `process_grpo` − control over the last 5 steps" in table
    assert "groups with all-zero advantages 1.00 (per step [1.0, nan," in table
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["runs"]["process_grpo"]["learns"] and not result["runs"]["return_to_go"]["learns"]
    assert result["step1_identical"]
    # Other settings in the same folder are refused rather than mixed in.
    with pytest.raises(SystemExit, match="other settings.*learning_rate"):
        bench.main(argv + ["--learning_rate", "0.1"])
    # How the same gradient is computed may change on resume, and is recorded.
    capsys.readouterr()
    bench.main(argv + ["--remat", "--remat_min_tokens", "512"])
    assert "resuming with {'remat': (False, True), 'remat_min_tokens': (0, 512)}" in (
        capsys.readouterr().out
    )
    recorded = json.loads((tmp_path / "settings.json").read_text())
    assert recorded["changed_on_resume"] == [{"remat": [False, True], "remat_min_tokens": [0, 512]}]
    with pytest.raises(SystemExit, match="other settings.*learning_rate"):
        bench.main(argv + ["--remat", "--remat_min_tokens", "512", "--learning_rate", "0.1"])


def test_holm_correction():
    assert bench.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert bench.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert bench.holm([0.2]) == [0.2]


def test_a_missing_metric_fails_with_its_name(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [_row(1, 0.0), _row(2, 0.0)]
    del rows[1]["critic/score_mean"]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="step 2 has no 'critic/score_mean'"):
        bench.read_run(run, 2)
    with pytest.raises(ValueError, match=r"no row for steps \[3\]"):
        bench.read_run(run, 3)


@pytest.mark.slow
def test_tiny_model_end_to_end_and_a_rerun_reuses_the_runs(tmp_path):
    argv = [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), "--checkpoint", "tiny"]
    argv += ["--dataset", "demo", "--steps", "2", "--group_size", "2", "--max_new_tokens", "8"]
    argv += ["--critic_tokens", "4", "--taus", "2", "2", "2", "--micro_batch_size", "2"]
    argv += ["--last_k", "2", "--compilation_cache", str(tmp_path / "xla")]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    last = first.stdout.strip().splitlines()[-1]
    assert last.startswith("p_final_plus_mean=") and last.endswith("last_k=2 steps=2")
    assert first.stdout.count("[train] step") == 4
    assert first.stdout.count("no update (lr 0)") == 2
    out = tmp_path / "out"
    for name in ("learning_curves.png", "reward_terms.png", "diagnostics.png", "aac_learning.md"):
        assert (out / name).stat().st_size > 0
    result = json.loads((out / "results.json").read_text())
    assert result["step1_identical"]  # Same seeds: the runs differ only after an update.
    assert np.isnan(result["curves"]["control"]["train/update_norm"]).all()  # no update ran
    assert min(result["curves"]["final_plus_mean"]["train/update_norm"]) > 0
    again = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[train] step" not in again.stdout
    assert again.stdout.strip().splitlines()[-1] == last


def test_exploration_is_tested_both_ways_holm_over_its_three_curves():
    # Exact two-sided p: twice the smaller one-sided p.
    up = [0.1, 0.2, 0.3, 0.4, 0.5]
    assert bench.two_sided_test(up, [0.0] * 5) == (pytest.approx(2 / 32), pytest.approx(0.3))
    assert bench.two_sided_test([-x for x in up], [0.0] * 5)[0] == pytest.approx(2 / 32)
    assert bench.two_sided_test([0.0] * 5, [0.0] * 5)[0] == 1.0
    steps = 6
    control = {key: np.zeros(steps) for key in bench.CURVES.values()}
    control[bench.REWARD] = control[bench.NON_LENGTH] = np.zeros(steps)
    trained = {key: value.copy() for key, value in control.items()}
    trained[bench.REWARD] = trained[bench.NON_LENGTH] = np.ones(steps)
    trained[bench.CURVES["copies of the prompt's example"]] = -np.linspace(0.1, 0.6, steps)
    trained[bench.CURVES["distinct calls per episode"]] = np.array([1, -1, 1, -1, 1, -1.0])
    result = bench.analyse(
        {"final_plus_mean": trained, "control": control},
        {},
        trained=("final_plus_mean",),
        last_k=5,
        alpha=0.05,
    )
    tests = result["runs"]["final_plus_mean"]["exploration"]
    copies = tests["copies of the prompt's example"]
    assert copies["difference"] == pytest.approx(-0.4) and copies["p"] == pytest.approx(2 / 32)
    assert copies["p_holm"] == pytest.approx(3 * 2 / 32)  # The smallest of three.
    assert tests["distinct calls per episode"]["p"] == 1.0  # A mean of -0.2, signs both ways.
    assert tests["input parse rate"] == {"difference": 0.0, "p": 1.0, "p_holm": 1.0}
