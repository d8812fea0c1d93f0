"""What an evaluation writes after its modes ran: `metrics.json`, `report.md`, a line per run.

`metrics_json` gathers each run's summary, the statistics (`stats.summarize_runs`: intervals,
the paired comparisons `PAIRED` and the max-ensembles `ENSEMBLED` the modes declare), the
gold shares, the grading, the baselines' entries, failed requests and corrupt lines;
`write_outputs` writes it with the report (its notes from `_notes`, the self-graded banner
when a seat graded itself) and prints each run's numbers. `pipeline.evaluate` calls both.
"""

import dataclasses
import json

from pau_jax.env import jsonl
from pau_jax.env.episode import EpisodeConfig
from pau_jax.evaluation import metrics, report, stats
from pau_jax.evaluation.modes import REGISTRY
from pau_jax.policy import backends

# Paired comparisons written to metrics.json when both runs are present: (a, b) -> "a vs b";
# each mode declares its own (`Mode.compared_with`).
PAIRED = tuple((name, other) for name, m in REGISTRY.items() for other in m.compared_with)
# Runs whose per-task best code match is written to metrics.json: (a, b) -> "max(a, b)".
ENSEMBLED = tuple((name, other) for name, m in REGISTRY.items() for other in m.ensembled_with)
SELF_GRADED_BANNER = (
    "**Self-graded**: the judge and/or the coder is the evaluated model itself, not the "
    "paper's fixed judge and coder; these scores are not comparable with published numbers."
)


def _notes(result: dict, runs: dict, episode_config: EpisodeConfig) -> list[str]:
    """The notes at the top of report.md."""
    grading, gold_summary = result["grading"], result["gold"]
    notes = [f"{result['tasks']} tasks; call budget {episode_config.call_budget}"]
    notes += [f"judge: {grading['judge']}; coder: {grading['coder']}"]
    if result.get("structured_decoding", "off") != "off":
        notes += [
            f"agent structured decoding: {result['structured_decoding']} (not the paper's "
            "setting: replies are shaped or cut by the sampler, so format errors are not "
            "counted as the paper counts them)"
        ]
    notes += [
        f"{k}: code match mean {v['code_match_mean']:.3f}"
        for k, v in result["max_ensemble"].items()
    ]
    if "gold" in runs and not gold_summary:
        notes += ["gold: no task has a gold description to write code from"]
    if gold_summary:
        shares = ", ".join(
            f"{name} {share:.0%}" for name, share in gold_summary["share_of_gold"].items()
        )
        notes += [
            f"gold (code from the gold description and the shown examples; the upper bound of "
            f"code match with this coder): {gold_summary['code_match_mean']:.3f}"
            + (f"; each run's code match as a share of it: {shares}" if shares else "")
        ]
    notes += [
        f"{seat} backend: {n} failed requests"
        for seat, n in result["backend_failures"].items()
        if n
    ]
    notes += [
        f"{name}: {n} corrupt line{'s' if n != 1 else ''} moved to {name}{jsonl.SIDECAR_SUFFIX} "
        "(their items were run again)"
        for name, n in result["corrupt_records"].items()
    ]
    return notes


def write_outputs(out, runs, result, *, title, episode_config) -> None:
    """Writes metrics.json, report.md and its plots, and prints each run's summary."""
    (out / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    path = report.write_report(
        out,
        runs,
        title=title,
        notes=_notes(result, runs, episode_config),
        intervals=result["intervals"],
        comparisons=result["comparisons"],
        banner=SELF_GRADED_BANNER if result["grading"]["self_graded"] else "",
    )
    for name, s in result["runs"].items():
        j, c = s["judge"], s["code_match"]
        judge_text = f"{j['mean']:.2f}" if j["mean"] is not None else "n/a"
        code_text = f"{c['mean']:.3f}" if c["mean"] is not None else "n/a"
        print(
            f"[eval] {name}: episodes={s['episodes']} code_match={code_text} "
            f"judge={judge_text} (unparsed {j['unparsed']}) calls={s['calls']['mean']:.1f}",
            flush=True,
        )
    print(f"[eval] metrics: {out / 'metrics.json'}; report: {path}", flush=True)


def metrics_json(out, runs, *, modes, tasks, grading, options, baselines, failures) -> dict:
    """What metrics.json holds (the run's seconds added by the caller)."""
    scoring = options.scoring
    summaries = {name: metrics.summarize(records) for name, records in runs.items()}
    statistics = stats.summarize_runs(
        runs,
        paired=PAIRED,
        ensembled=ENSEMBLED,
        seed=scoring.bootstrap_seed,
        resamples=scoring.bootstrap_resamples,
    )
    return {
        "grading": grading,
        "agent": backends.describe(options.policy),
        "structured_decoding": backends.structured_decoding(options.policy),
        "modes": list(modes),
        "tasks": tasks,
        "runs": summaries,
        **statistics,
        "gold": metrics.gold_shares(summaries),
        "baselines": baselines,
        "backend_failures": failures,
        "corrupt_records": jsonl.corrupt_counts(out),
        "bootstrap": {"seed": scoring.bootstrap_seed, "resamples": scoring.bootstrap_resamples},
        "episode_config": dataclasses.asdict(options.episode_config),
    }
