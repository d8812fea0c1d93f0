"""Compares finished evaluation runs of any models and modes on their common tasks, in one report.

    python -m pau_jax.evaluation.compare runs/main/qwen3-8b runs/main/gpt-4o-mini runs/gold \
        --out runs/compare

Each RUN_DIR is an evaluation run directory (`pau_jax.launch --run_mode=eval`); every
`<run>_scored.jsonl` in it (the runs listed in its metrics.json) is one run, named
`<label>/<run>` (label: the directory's name unless `--labels` says otherwise). All
runs are aligned on the task ids they all scored; a run with missing or extra tasks
is compared on that intersection and the report says how many of its tasks were
dropped. Written to `--out`: `report.md` (runs and their graders; the paper's Table 1
layout, judge mean and code match per model and mode with seeded bootstrap
intervals, overall and per source; the gold upper bound; the max ensemble over all
runs but the gold ones; paired bootstrap intervals and permutation tests between
every two runs, with Holm-adjusted p-values; the failure modes pooled over the
strongest `--top_k` runs), `compare.json` (every number) and PNG plots (`compare_report`).
"""

import argparse
import dataclasses
import itertools
import json
import pathlib
from collections.abc import Sequence

import numpy as np

from pau_jax.env import runner
from pau_jax.evaluation import compare_report, failure_modes, stats

METRICS = (("judge", "judge_score"), ("code_match", "code_match"))
GOLD = "gold"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One scored run of one run directory."""

    name: str
    label: str
    mode: str
    directory: str
    agent: str
    judge: str
    coder: str
    self_graded: bool
    records: dict


def _value(record: dict, key: str) -> float | None:
    if key == "judge_score" and record.get("judge_skipped"):
        return None
    value = record.get(key)
    return None if value is None else float(value)


def load_runs(
    directories: Sequence[str], labels: Sequence[str] | None = None, modes=None
) -> list[Run]:
    """The scored runs of each directory, in the order given (modes filtered when set)."""
    dirs = [pathlib.Path(d).expanduser() for d in directories]
    if labels is None:
        labels = [d.resolve().name for d in dirs]
        if len(set(labels)) != len(labels):
            labels = ["/".join(d.resolve().parts[-2:]) for d in dirs]
    if len(labels) != len(dirs) or len(set(labels)) != len(labels):
        raise ValueError(f"give one distinct label per run directory, got {list(labels)}")
    runs = []
    for directory, label in zip(dirs, labels, strict=True):
        metrics_path = directory / "metrics.json"
        info = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
        names = list(info.get("runs", {}))
        names += sorted(
            p.name[: -len("_scored.jsonl")]
            for p in directory.glob("*_scored.jsonl")
            if p.name[: -len("_scored.jsonl")] not in names
        )
        names = [n for n in names if (directory / f"{n}_scored.jsonl").exists()]
        names = [n for n in names if modes is None or n in modes]
        if not names:
            raise ValueError(
                f"{directory} holds no <run>_scored.jsonl (of modes {modes}); pass evaluation "
                "run directories"
            )
        grading = info.get("grading", {})
        for name in names:
            records = runner.load_records(directory / f"{name}_scored.jsonl")
            runs.append(
                Run(
                    name=f"{label}/{name}",
                    label=label,
                    mode=name,
                    directory=str(directory),
                    agent=info.get("agent", "?"),
                    judge=grading.get("judge", "?"),
                    coder=grading.get("coder", "?"),
                    self_graded=bool(grading.get("self_graded", False)),
                    records={r["task_id"]: r for r in records},
                )
            )
    return runs


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _interval(values, seed, resamples, confidence) -> dict | None:
    if not values:
        return None
    iv = stats.bootstrap_mean(values, n_resamples=resamples, confidence=confidence, seed=seed)
    return dict(dataclasses.asdict(iv), n=len(values))


def _cells(runs, tasks, seed, resamples, confidence) -> dict:
    out = {}
    for run in runs:
        out[run.name] = {
            metric: _interval(
                [v for t in tasks if (v := _value(run.records[t], key)) is not None],
                seed,
                resamples,
                confidence,
            )
            for metric, key in METRICS
        }
    return out


def _ensemble(members, tasks, seed, resamples, confidence) -> dict:
    best = {}
    for metric, key in METRICS:
        per_task = {}
        for t in tasks:
            got = [v for r in members if (v := _value(r.records[t], key)) is not None]
            if got:
                per_task[t] = max(got)
        best[metric] = per_task
    code = list(best["code_match"].values())
    return {
        "members": [r.name for r in members],
        "judge": _interval(list(best["judge"].values()), seed, resamples, confidence),
        "code_match": _interval(code, seed, resamples, confidence),
        "code_match_zero": float(np.mean([c <= 0 for c in code])) if code else None,
        "code_match_full": float(np.mean([c >= 1 for c in code])) if code else None,
    }


def _failures(candidates, table, tasks, top_k) -> dict:
    def strength(run):
        cell = table[run.name]
        judge = cell["judge"]["estimate"] if cell["judge"] else -np.inf
        code = cell["code_match"]["estimate"] if cell["code_match"] else -np.inf
        return (judge, code)

    strongest = sorted(candidates, key=strength, reverse=True)[:top_k]
    pooled = [strongest_run.records[t] for strongest_run in strongest for t in tasks]
    summary = failure_modes.failure_summary(pooled)
    classified = sum(summary["counts"].values())
    summary["shares"] = {
        c: (n / classified if classified else None) for c, n in summary["counts"].items()
    }
    summary["runs"] = [r.name for r in strongest]
    return summary


def compare(
    runs: Sequence[Run],
    *,
    seed: int = 0,
    resamples: int = 10_000,
    confidence: float = 0.95,
    top_k: int = 3,
    failure_mode: str = "interactive",
) -> dict:
    """Every number of the comparison (see module docstring) as a JSON-serialisable dict."""
    if not runs:
        raise ValueError("compare needs at least one run")
    common = sorted(set.intersection(*(set(r.records) for r in runs)))
    if not common:
        raise ValueError("the runs share no task id; compare runs of the same dataset split")
    args = (seed, resamples, confidence)
    table = _cells(runs, common, *args)
    sources = {}
    for t in common:
        source = next((r.records[t].get("source") for r in runs if r.records[t].get("source")), "")
        if source:
            sources.setdefault(source, []).append(t)
    per_source = {s: _cells(runs, ts, *args) for s, ts in sorted(sources.items())}
    pairs = []
    for a, b in itertools.combinations(runs, 2):
        for metric, key in METRICS:
            both = [
                (x, y)
                for t in common
                if (x := _value(a.records[t], key)) is not None
                and (y := _value(b.records[t], key)) is not None
            ]
            if not both:
                continue
            x, y = [p[0] for p in both], [p[1] for p in both]
            iv = stats.paired_bootstrap(
                x, y, n_resamples=resamples, confidence=confidence, seed=seed
            )
            p = stats.paired_permutation_test(x, y, n_permutations=resamples, seed=seed)
            pairs.append(
                dict(dataclasses.asdict(iv), a=a.name, b=b.name, metric=metric, n=len(x), p=p)
            )
    for metric, _ in METRICS:
        chosen = [p for p in pairs if p["metric"] == metric]
        for p, adjusted in zip(chosen, holm([p["p"] for p in chosen]), strict=True):
            p["p_holm"] = adjusted
    members = [r for r in runs if r.mode != GOLD]
    golds = [r for r in runs if r.mode == GOLD]
    gold = {}
    if golds and table[golds[0].name]["code_match"]:
        g = table[golds[0].name]["code_match"]["estimate"]
        gold = {
            "run": golds[0].name,
            "code_match": g,
            "share_of_gold": {
                r.name: table[r.name]["code_match"]["estimate"] / g
                for r in members
                if table[r.name]["code_match"] and g > 0
            },
        }
    candidates = [r for r in members if r.mode == failure_mode] or members
    return {
        "runs": [
            {
                "name": r.name,
                "label": r.label,
                "mode": r.mode,
                "directory": r.directory,
                "agent": r.agent,
                "judge": r.judge,
                "coder": r.coder,
                "self_graded": r.self_graded,
                "tasks": len(r.records),
                "dropped": len(r.records) - len(common),
            }
            for r in runs
        ],
        "tasks": len(common),
        "table": table,
        "per_source": per_source,
        "gold": gold,
        "ensemble": _ensemble(members, common, *args) if members else None,
        "pairs": pairs,
        "failure_modes": _failures(candidates, table, common, top_k) if members else None,
        "same_graders": len({r.judge for r in members}) <= 1 and len({r.coder for r in runs}) == 1,
        "bootstrap": {"seed": seed, "resamples": resamples, "confidence": confidence},
    }


def main(argv: Sequence[str] | None = None) -> dict:
    """The command line (see module docstring); returns the comparison."""
    parser = argparse.ArgumentParser(
        prog="python -m pau_jax.evaluation.compare",
        description="Compare finished PAU evaluation runs on their common tasks.",
    )
    parser.add_argument("run_dirs", nargs="+", help="evaluation run directories")
    parser.add_argument("--out", required=True, help="output folder (report.md, compare.json)")
    parser.add_argument("--labels", help="comma-separated model labels, one per run directory")
    parser.add_argument(
        "--modes", help="comma-separated runs to keep (e.g. interactive,in_context)"
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap and permutation seed")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples")
    parser.add_argument("--confidence", type=float, default=0.95, help="interval confidence")
    parser.add_argument(
        "--top_k", type=int, default=3, help="strongest runs pooled for failure modes"
    )
    parser.add_argument(
        "--failure_mode", default="interactive", help="mode ranked for failure modes"
    )
    parser.add_argument("--title", default="PAU comparison", help="heading of report.md")
    args = parser.parse_args(argv)
    runs = load_runs(
        args.run_dirs,
        args.labels.split(",") if args.labels else None,
        set(args.modes.split(",")) if args.modes else None,
    )
    result = compare(
        runs,
        seed=args.seed,
        resamples=args.resamples,
        confidence=args.confidence,
        top_k=args.top_k,
        failure_mode=args.failure_mode,
    )
    path = compare_report.write_report(result, args.out, title=args.title)
    for r in result["runs"]:
        cell = result["table"][r["name"]]
        judge = compare_report.fmt(cell["judge"]["estimate"]) if cell["judge"] else "–"
        code = compare_report.fmt(cell["code_match"]["estimate"], 3) if cell["code_match"] else "–"
        print(f"[compare] {r['name']}: judge {judge}, code match {code} ({r['dropped']} dropped)")
    print(f"[compare] {result['tasks']} common tasks; report: {path}", flush=True)
    return result


if __name__ == "__main__":
    main()
