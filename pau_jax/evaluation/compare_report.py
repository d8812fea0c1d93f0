"""The report of a comparison of evaluation runs: `report.md`, `compare.json` and PNG plots.

`write_report` renders the result of `compare.compare` (runs and their graders, the
paper's Table 1 layout overall and per source, the gold upper bound, the max ensemble,
the paired comparisons and the pooled failure modes) into a folder; `table1` is the
Table 1 layout alone.
"""

import json
import pathlib


def fmt(x, digits=2, scale=1.0) -> str:
    """`scale * x` with `digits` decimals; a dash for None."""
    return "–" if x is None else f"{scale * x:.{digits}f}"


def _cell(iv, scale=1.0, digits=2) -> str:
    if not iv:
        return "–"
    return (
        f"{fmt(iv['estimate'], digits, scale)} [{fmt(iv['low'], digits, scale)}, "
        f"{fmt(iv['high'], digits, scale)}]"
    )


def table1(result: dict, cells: dict) -> str:
    """The paper's Table 1 layout: one row per model (label), judge and code match % per mode."""
    runs = [r for r in result["runs"] if r["name"] in cells]
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    labels = list(dict.fromkeys(r["label"] for r in runs))
    header = "| model | " + " | ".join(f"{m} judge | {m} code match %" for m in modes) + " |"
    lines = [header, "|---" * (1 + 2 * len(modes)) + "|"]
    for label in labels:
        row = [label]
        for mode in modes:
            cell = cells.get(f"{label}/{mode}")
            row += [_cell(cell["judge"]), _cell(cell["code_match"], 100, 1)] if cell else ["", ""]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _plots(result: dict, out: pathlib.Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    written = []
    for metric, scale, label in (
        ("judge", 1, "judge score (1-5)"),
        ("code_match", 100, "code match %"),
    ):
        rows = [(n, iv) for n, c in result["table"].items() if (iv := c[metric])]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(max(4, 0.7 * len(rows) + 2), 3.5))
        est = [scale * iv["estimate"] for _, iv in rows]
        err = [
            [scale * (iv["estimate"] - iv["low"]) for _, iv in rows],
            [scale * (iv["high"] - iv["estimate"]) for _, iv in rows],
        ]
        ax.bar(range(len(rows)), est, yerr=err, capsize=3)
        ax.set_xticks(range(len(rows)), [n for n, _ in rows], rotation=45, ha="right")
        ax.set_ylabel(label)
        fig.tight_layout()
        fig.savefig(out / f"{metric}.png", dpi=100)
        plt.close(fig)
        written.append(f"{metric}.png")
    failures = result["failure_modes"]
    if failures and failures["low_scoring"]:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = list(failures["counts"])
        ax.bar(range(len(names)), [failures["counts"][n] for n in names])
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_ylabel("low-scoring episodes")
        ax.set_title("pooled over " + ", ".join(failures["runs"]))
        fig.tight_layout()
        fig.savefig(out / "failure_modes.png", dpi=100)
        plt.close(fig)
        written.append("failure_modes.png")
    return written


def write_report(
    result: dict, out: str | pathlib.Path, *, title: str = "PAU comparison"
) -> pathlib.Path:
    """Writes `report.md`, `compare.json` and the plots into `out`; returns the report path."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    b = result["bootstrap"]
    lines = [f"# {title}", ""]
    if any(r["self_graded"] for r in result["runs"]):
        lines += ["**Self-graded runs are included** (see the table of runs): their scores are not "
                  "comparable with runs graded by the fixed judge and coder.", ""]  # fmt: skip
    if not result["same_graders"]:
        lines += ["**The runs were graded by different judges or coders**: compare their scores "
                  "with care.", ""]  # fmt: skip
    lines += [
        "## Runs",
        "",
        "| run | agent | judge | coder | tasks | dropped | directory |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['name']} | {r['agent']} | {r['judge']} | {r['coder']} | {r['tasks']} | "
        f"{r['dropped']} | {r['directory']} |"
        for r in result["runs"]
    ]
    dropped = sum(r["dropped"] > 0 for r in result["runs"])
    lines += [
        "",
        f"{result['tasks']} tasks are common to all runs and every number below is computed on "
        f"them; {dropped} run(s) had tasks the others lack, which were dropped (column 'dropped').",
        f"Intervals: seeded percentile bootstrap ({b['resamples']} resamples, seed {b['seed']}, "
        f"{b['confidence']:.0%}).",
        "",
        "## Judge score and code match per model and mode (Table 1)",
        "",
        table1(result, result["table"]),
    ]
    for source, cells in result["per_source"].items():
        lines += [f"### {source}", "", table1(result, cells)]
    if result["gold"]:
        g = result["gold"]
        shares = ", ".join(f"{n} {v:.0%}" for n, v in g["share_of_gold"].items())
        lines += [
            "## Gold description (upper bound of code match)",
            "",
            f"{g['run']}: code match {100 * g['code_match']:.1f}%. Each run's code match as a "
            f"share of it: {shares or '–'}.",
            "",
        ]
    e = result["ensemble"]
    if e:
        lines += [
            "## Max ensemble",
            "",
            f"Per task, the best score of any of {len(e['members'])} runs (gold runs excluded): "
            f"judge {_cell(e['judge'])}, code match % {_cell(e['code_match'], 100, 1)}; code match "
            f"0 on {fmt(e['code_match_zero'], 1, 100)}% of the tasks, 1 on "
            f"{fmt(e['code_match_full'], 1, 100)}%.",
            "",
        ]
    if result["pairs"]:
        lines += [
            "## Paired comparisons (mean of a − b on the tasks both scored)",
            "",
            "| a | b | metric | n | mean(a − b) | CI | p | p (Holm) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {p['a']} | {p['b']} | {p['metric']} | {p['n']} | {p['estimate']:.3f} | "
            f"[{p['low']:.3f}, {p['high']:.3f}] | {p['p']:.4f} | {p['p_holm']:.4f} |"
            for p in result["pairs"]
        ]
        lines += ["", "p: paired sign-flip permutation test (exact when 2^n <= resamples).", ""]
    f = result["failure_modes"]
    if f:
        lines += [
            f"## Failure modes pooled over the strongest {len(f['runs'])} runs",
            "",
            f"Runs (by judge mean, then code match): {', '.join(f['runs'])}; "
            f"{f['low_scoring']} low-scoring episodes ({f['unparsed']} unparsed, "
            f"{f['unjudged']} unjudged).",
            "",
            "| category | episodes | share |",
            "|---|---|---|",
        ]
        lines += [f"| {c} | {n} | {fmt(f['shares'][c], 1, 100)}% |" for c, n in f["counts"].items()]
        lines += [""]
    lines += [f"![{img[:-4]}]({img})" for img in _plots(result, out)]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
