"""The run report: a markdown table of metrics per run and PNG plots, written to a run directory.

Inputs are scored episode records (see `metrics`) grouped by run name, e.g.
{"interactive": [...], "in_context": [...]}. Plots: judge-score distributions,
code-match histograms (20% bins) and, when both modes are present, interactive
versus in-context per item. Runs whose records carry failure-mode attributions
(`failure_modes.attribute`) get a table of failure modes; confidence intervals
and paired comparisons computed by the caller are shown as tables too.
"""

import os
import pathlib
from collections.abc import Mapping, Sequence

from pau_jax.evaluation import metrics


def _fmt(x, digits=2, pct=False) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.1f}%" if pct else f"{x:.{digits}f}"


def metrics_table(summaries: Mapping[str, dict]) -> str:
    """One markdown row per run: judge mean ± std, % >= 3, unparsed, code match, calls, stop rate."""
    header = (
        "| run | episodes | judge mean ± std | judge ≥3 | unparsed | code match | "
        "fully matched | ≥0.5 | zero | calls/episode | stop rate |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for name, s in summaries.items():
        j, c = s["judge"], s["code_match"]
        judge_cell = f"{_fmt(j['mean'])} ± {_fmt(j['std'])}" if j["n"] else "–"
        rows.append(
            f"| {name} | {s['episodes']} | {judge_cell} | {_fmt(j['frac_ge_3'], pct=True)} | "
            f"{j['unparsed']} | {_fmt(c['mean'], 3)} | {_fmt(c['frac_full'], pct=True)} | "
            f"{_fmt(c['frac_ge_half'], pct=True)} | {_fmt(c['frac_zero'], pct=True)} | "
            f"{_fmt(s['calls']['mean'], 1)} | {_fmt(s['stop_rate'], pct=True)} |"
        )
    return header + "\n".join(rows) + "\n"


def failure_table(summaries: Mapping[str, dict]) -> str:
    """One markdown row per run with attributed low-scoring episodes: counts per category."""
    from pau_jax.evaluation.failure_modes import CATEGORIES

    rows = [(n, s["failure_modes"]) for n, s in summaries.items() if "failure_modes" in s]
    if not rows:
        return ""
    header = (
        "| run | low-scoring | "
        + " | ".join(CATEGORIES)
        + " | unparsed | unjudged | by pre-check |\n"
        + "|---" * (len(CATEGORIES) + 5)
        + "|\n"
    )
    lines = [
        f"| {name} | {f['low_scoring']} | "
        + " | ".join(str(f["counts"][c]) for c in CATEGORIES)
        + f" | {f['unparsed']} | {f['unjudged']} | {f['by_precheck']} |"
        for name, f in rows
    ]
    return header + "\n".join(lines) + "\n"


def interval_table(intervals: Mapping[str, Mapping[str, dict]]) -> str:
    """Rows `| name | metric | estimate | low | high |` from {name: {metric: interval dict}}."""
    lines = [
        "| run | metric | estimate | CI low | CI high | confidence |",
        "|---|---|---|---|---|---|",
    ]
    for name, by_metric in intervals.items():
        for metric, iv in by_metric.items():
            lines.append(
                f"| {name} | {metric} | {_fmt(iv['estimate'], 3)} | {_fmt(iv['low'], 3)} | "
                f"{_fmt(iv['high'], 3)} | {_fmt(iv['confidence'], pct=True)} |"
            )
    return "\n".join(lines) + "\n"


def _plots(runs: Mapping[str, Sequence[dict]], summaries: Mapping[str, dict], out: pathlib.Path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    written = []
    names = list(runs)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        dist = summaries[name]["judge"]["distribution"]
        ax.bar(
            [k + i * width for k in range(1, 6)], [dist[k] for k in range(1, 6)], width, label=name
        )
    ax.set_xlabel("judge score")
    ax.set_ylabel("episodes")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(1, 6)], [str(k) for k in range(1, 6)])
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "judge_scores.png", dpi=100)
    plt.close(fig)
    written.append("judge_scores.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = ["0–20%", "20–40%", "40–60%", "60–80%", "80–100%"]
    for i, name in enumerate(names):
        bins = summaries[name]["code_match"]["bins"]
        ax.bar([k + i * width for k in range(5)], bins, width, label=name)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(5)], labels)
    ax.set_xlabel("code match")
    ax.set_ylabel("episodes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "code_match.png", dpi=100)
    plt.close(fig)
    written.append("code_match.png")

    # Interactive vs in-context per task, for every pair of runs "<prefix>interactive" and
    # "<prefix>in_context" (e.g. "interactive" / "in_context", "after/interactive" / ...).
    for name in names:
        if not name.endswith("interactive"):
            continue
        prefix = name[: -len("interactive")]
        if f"{prefix}in_context" not in runs:
            continue
        inter = {r["task_id"]: r.get("code_match") for r in runs[name]}
        ctx = {r["task_id"]: r.get("code_match") for r in runs[f"{prefix}in_context"]}
        common = sorted(
            t for t in inter if t in ctx and inter[t] is not None and ctx[t] is not None
        )
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.scatter([ctx[t] for t in common], [inter[t] for t in common], s=12, alpha=0.6)
        ax.plot([0, 1], [0, 1], color="gray", linewidth=1)
        ax.set_xlabel("in-context code match")
        ax.set_ylabel("interactive code match")
        if prefix:
            ax.set_title(prefix.rstrip("/_ "))
        fig.tight_layout()
        file_name = "interactive_vs_in_context.png"
        if prefix:
            file_name = f"{prefix.rstrip('/_ ').replace('/', '_')}_{file_name}"
        fig.savefig(out / file_name, dpi=100)
        plt.close(fig)
        written.append(file_name)
    return written


TRAINING_CURVES = (("train/loss", "loss"), ("rollout/reward_mean", "episode reward (mean)"))


def _training_plot(history: Sequence[dict], out: pathlib.Path) -> str | None:
    """`training.png`: loss and mean episode reward per training step (from metrics.jsonl)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    curves = [(key, label) for key, label in TRAINING_CURVES if any(key in m for m in history)]
    if not curves:
        return None
    fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3), squeeze=False)
    for ax, (key, label) in zip(axes[0], curves, strict=True):
        points = [(m["step"], m[key]) for m in history if key in m]
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o")
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
    fig.tight_layout()
    fig.savefig(out / "training.png", dpi=100)
    plt.close(fig)
    return "training.png"


def training_table(history: Sequence[dict]) -> str:
    """One row per training step: the loss and reward curves' values."""
    rows = ["| step | " + " | ".join(label for _, label in TRAINING_CURVES) + " |"]
    rows.append("|---" * (len(TRAINING_CURVES) + 1) + "|")
    for m in history:
        cells = [_fmt(m.get(key), 4) for key, _ in TRAINING_CURVES]
        rows.append(f"| {m['step']} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def write_report(
    run_dir: str | os.PathLike,
    runs: Mapping[str, Sequence[dict]],
    *,
    title: str = "PAU evaluation",
    notes: Sequence[str] = (),
    intervals: Mapping[str, Mapping[str, dict]] | None = None,
    comparisons: Mapping[str, Mapping[str, dict]] | None = None,
    training: Sequence[dict] | None = None,
    banner: str = "",
) -> pathlib.Path:
    """Writes `report.md` and its PNG plots into `run_dir`; returns the report path.

    Args:
      run_dir: output folder.
      runs: run name -> scored records.
      title: the report's heading.
      notes: bullet lines at the end.
      intervals: run name -> metric -> bootstrap interval (`dataclasses.asdict(stats.Interval)`).
      comparisons: "a vs b" -> metric -> paired interval of mean(a - b), with `p_value`.
      training: metrics.jsonl lines of a training run (`step`, `train/loss`,
        `rollout/reward_mean`); adds a table and `training.png`.
      banner: a paragraph shown right under the title (e.g. that the run is self-graded).
    """
    if not runs:
        raise ValueError("write_report needs at least one run of scored records")
    out = pathlib.Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = {name: metrics.summarize(records) for name, records in runs.items()}
    images = _plots(runs, summaries, out)
    lines = [f"# {title}", ""] + ([banner, ""] if banner else []) + [metrics_table(summaries)]
    if intervals:
        lines += ["## Bootstrap confidence intervals", "", interval_table(intervals)]
    if comparisons:
        lines += ["## Paired comparisons (mean of a − b)", "", interval_table(comparisons)]
        lines += [
            f"- {name}, {metric}: permutation p = {_fmt(iv.get('p_value'), 4)}"
            for name, by_metric in comparisons.items()
            for metric, iv in by_metric.items()
        ] + [""]
    if training:
        lines += ["## Training", "", training_table(training)]
        curve = _training_plot(training, out)
        if curve:
            images.append(curve)
    failures = failure_table(summaries)
    if failures:
        lines += ["## Failure modes of low-scoring episodes", "", failures]
    for name, s in summaries.items():
        if s["per_source"]:
            lines += [f"## {name}: per source", "", metrics_table(s["per_source"])]
        if len(s.get("per_description_origin", {})) > 1:
            lines += [
                f"## {name}: per gold-description origin (what the judge compared with)",
                "",
                metrics_table(s["per_description_origin"]),
            ]
    lines += [f"![{img[:-4]}]({img})" for img in images]
    lines += [""] + [f"- {n}" for n in notes]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
