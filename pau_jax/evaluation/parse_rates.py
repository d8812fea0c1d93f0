"""How well a model follows the protocol's formats: per-phase parse rates and why replies fail.

    python -m pau_jax.evaluation.parse_rates RUN_DIR [RUN_DIR ...] [--replay]

Reads the episodes and scores an evaluation run wrote and counts, per phase, the
replies the environment and the graders could use: the reasoning (non-empty),
the input (parsed with the function's arity), the revision (a hypothesis and a
decision), the judge's rating and the coder's code (a runnable function). Input
and revision failures are put in classes (a fenced function definition, a call
written as code, the wrong number of arguments, prose, the token limit, a
repeated phrase, ...). ``--replay`` also reads the recorded input replies again
with both input parsers, which separates what a parser change gains from what
the prompts gain.
"""

import argparse
import ast
import collections
import json
import pathlib
import re
import sys
from collections.abc import Iterable, Sequence

from pau_jax.env import input_example, parse, text_blocks
from pau_jax.sandbox import parse_call_args

PHASES = ("conceptualize", "generate", "revise")
INPUT_CLASSES = (
    "accepted",
    "function definition",
    "call as code",
    "wrong arity",
    "not a literal",
    "token limit",
    "repetition",
    "prose",
    "empty",
)
REVISION_CLASSES = ("accepted", "no decision", "empty hypothesis", "token limit", "repetition")
_DEFINITION = re.compile(r"^\s*def\s+\w+\s*\(", re.M)
_REPEAT = re.compile(r"(\b.{12,}?)\1{3,}", re.DOTALL)


def n_params_of(header: str) -> int:
    """The number of positional parameters of a header such as ``def test_func(arg0, arg1):``."""
    node = ast.parse(header.strip() + "\n    pass\n").body[0]
    return len(node.args.posonlyargs) + len(node.args.args)


def _repetitive(text: str) -> bool:
    return bool(_REPEAT.search(text))


def classify_input(step: dict) -> str:
    """The class of one recorded generation step (``INPUT_CLASSES``)."""
    if step.get("parse_ok"):
        return "accepted"
    text = text_blocks.strip_think(step.get("output", ""))
    if not text:
        return "empty"
    error = step.get("parse_error", "")
    if "argument" in error and ("takes" in error or "no arguments" in error):
        return "wrong arity"
    if _DEFINITION.search(text) and not parse.input_candidates(text):
        return "function definition"
    if "literal" in error or "not valid Python" in error:
        has_call = re.search(r"\w\s*\(", step.get("input_text", ""))
        return "call as code" if has_call else "not a literal"
    if step.get("finish_reason") == "length":
        return "repetition" if _repetitive(text) else "token limit"
    return "prose"


def classify_revision(step: dict) -> str:
    """The class of one recorded revision step (``REVISION_CLASSES``)."""
    if step.get("parse_ok"):
        return "accepted"
    if step.get("parse_error") == "empty hypothesis":
        return "empty hypothesis"
    if step.get("finish_reason") == "length":
        return "repetition" if _repetitive(step.get("output", "")) else "token limit"
    return "no decision"


def copies_example(step: dict) -> bool:
    """Whether a generation step's input is the prompt's own example, up to spacing."""
    return input_example.copies_example(step.get("messages") or (), step.get("input_text", ""))


def replay_input(output: str, n_params: int, input_format: str) -> bool:
    """Whether ``output`` parses as ``n_params`` arguments under ``input_format``."""
    if input_format == "strict":
        extracted = parse.extract_input(output)
        texts = [extracted.args_text] if extracted.ok else []
    else:
        texts = parse.input_candidates(output)
    for text in texts:
        try:
            parse_call_args(text, n_params)
            return True
        except ValueError:
            continue
    return False


def _read_jsonl(path: pathlib.Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _share(good: int, total: int) -> dict:
    return {"accepted": good, "total": total, "rate": good / total if total else None}


def rates(episodes: Sequence[dict], scored: Sequence[dict] = (), *, replay: bool = False) -> dict:
    """Per-phase acceptance and failure classes of an interactive run's records.

    Args:
      episodes: records of ``interactive_episodes.jsonl``.
      scored: records of ``interactive_scored.jsonl`` (judge score, coder code).
      replay: also re-read the input replies with the 'strict' and 'lenient' parsers.

    Returns:
      ``{"phases": {phase: {accepted, total, rate}}, "input_classes": {...},
      "revision_classes": {...}, "token_limit": {phase: share}, "replay": {...}}``.
    """
    phases = {p: [0, 0] for p in (*PHASES, "judge", "coder")}
    input_classes: collections.Counter = collections.Counter()
    revision_classes: collections.Counter = collections.Counter()
    at_limit = collections.Counter()
    replayed = collections.Counter()
    calls = collections.Counter()
    distinct = set()
    for record in episodes:
        n_params = n_params_of(record["header"])
        distinct |= {
            (record["task_id"], s["call"])
            for s in record["steps"]
            if s.get("parse_ok") and s.get("call")
        }
        for step in record["steps"]:
            phase = step["phase"]
            phases[phase][1] += 1
            phases[phase][0] += bool(step.get("parse_ok"))
            at_limit[phase] += step.get("finish_reason") == "length"
            if phase == "generate":
                input_classes[classify_input(step)] += 1
                calls["ran"] += step.get("call_ok") is True
                calls["copied"] += bool(step.get("parse_ok")) and copies_example(step)
                calls["shown"] += input_example.repeats_shown_example(
                    step.get("messages") or (), step.get("call") or ""
                )
                if replay:
                    for fmt in parse.INPUT_FORMATS:
                        replayed[fmt] += replay_input(step["output"], n_params, fmt)
            elif phase == "revise":
                revision_classes[classify_revision(step)] += 1
    for record in scored:
        if "judge_score" in record and not record.get("judge_skipped"):
            phases["judge"][1] += 1
            phases["judge"][0] += record["judge_score"] is not None
        if "code_runnable" in record:
            phases["coder"][1] += 1
            phases["coder"][0] += bool(record.get("code_runnable"))
    out = {
        "phases": {p: _share(*counts) for p, counts in phases.items() if counts[1]},
        "input_classes": {c: input_classes[c] for c in INPUT_CLASSES if input_classes[c]},
        "revision_classes": {
            c: revision_classes[c] for c in REVISION_CLASSES if revision_classes[c]
        },
        "token_limit": {p: at_limit[p] / phases[p][1] for p in PHASES if phases[p][1]},
        "calls": {
            "returned": _share(calls["ran"], phases["generate"][1]),
            "copied_example": calls["copied"],
            "repeated_shown_example": calls["shown"],
            "distinct": len(distinct),
        },
    }
    if replay:
        total = phases["generate"][1]
        out["replay"] = {fmt: _share(replayed[fmt], total) for fmt in parse.INPUT_FORMATS}
    return out


def run_rates(run_dir: str | pathlib.Path, *, replay: bool = False) -> dict:
    """``rates`` of the interactive records in an evaluation run directory."""
    run_dir = pathlib.Path(run_dir)
    episodes = _read_jsonl(run_dir / "interactive_episodes.jsonl")
    if not episodes:
        raise FileNotFoundError(f"{run_dir} has no interactive_episodes.jsonl with records")
    return rates(episodes, _read_jsonl(run_dir / "interactive_scored.jsonl"), replay=replay)


def _percent(share: dict) -> str:
    rate = share["rate"]
    return "–" if rate is None else f"{100 * rate:.0f}% ({share['accepted']}/{share['total']})"


def markdown(results: dict[str, dict]) -> str:
    """One table row per run: the acceptance of each phase, then the failure classes."""
    columns = [*PHASES, "judge", "coder"]
    lines = ["| run | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, r in results.items():
        cells = [_percent(r["phases"][c]) if c in r["phases"] else "–" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| run | calls the function answered | copies of the prompt's example "
        "| repeats of a shown example | distinct calls "
        "| input classes | revision classes | replies at the token limit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        inputs = ", ".join(f"{k} {v}" for k, v in r["input_classes"].items())
        revisions = ", ".join(f"{k} {v}" for k, v in r["revision_classes"].items())
        limit = ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["token_limit"].items())
        c = r["calls"]
        lines.append(
            f"| {name} | {_percent(c['returned'])} | {c['copied_example']} "
            f"| {c['repeated_shown_example']} | {c['distinct']} "
            f"| {inputs} | {revisions} | {limit} |"
        )
    if any("replay" in r for r in results.values()):
        lines += ["", "| run | input replies re-read: strict | lenient |", "|---|---|---|"]
        for name, r in results.items():
            if "replay" in r:
                lines.append(
                    f"| {name} | {_percent(r['replay']['strict'])} | "
                    f"{_percent(r['replay']['lenient'])} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pau_jax.evaluation.parse_rates", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run_dirs", nargs="+", help="evaluation run directories")
    parser.add_argument("--replay", action="store_true", help="re-read inputs with both parsers")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        results = {d: run_rates(d, replay=args.replay) for d in args.run_dirs}
    except (FileNotFoundError, json.JSONDecodeError) as e:
        print(f"parse_rates: {e}", file=sys.stderr)
        return 1
    print(json.dumps(results, indent=2) if args.json else markdown(results), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
