"""Do a real grader's replies parse, with and without the grader masks?

The judge rates (gold, hypothesis) pairs of the `pau/debug` tasks that have a gold
description: each gold against itself (a right hypothesis) and against the next task's
gold (a wrong one); the coder writes each task's function from its gold description.
Each runs twice on one model, greedy, with its reply mask off (the paper's graders) and
on (`SamplingConfig.structured='constrain_inputs'`: the judge ends with a `Rating: 1..5`
line within its budget, `sampling.input_grammar.rating_grammar`; the coder writes one
closed ```python block, `code_grammar`). Reported per mode: unparsed ratings, the mean
rating of right and of wrong hypotheses, the ratings both modes gave alike, and for the
coder the replies whose block was read, whose code parses and defines `test_func`, and
the reply lengths.

    python benchmarks/grader_replies.py                                # Qwen2.5-Coder-1.5B
    python benchmarks/grader_replies.py --model ~/.cache/pau_jax/qwen2.5-coder-0.5b-instruct

The last line is `unparsed_off=N unparsed_masked=M blocks_read_off=A/n
blocks_read_masked=B/n`.
"""

import argparse
import ast
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from pau_jax.evaluation import code_match, judge  # noqa: E402
from pau_jax.policy import backends  # noqa: E402
from pau_jax.policy.config import SamplingConfig  # noqa: E402
from pau_jax.tasks import pau_dataset  # noqa: E402

MODES = {"off": "off", "masked": "constrain_inputs"}


def tasks(data_dir: str) -> list:
    """The debug records (test, then train) that have a gold description."""
    records = []
    for split in ("test", "train"):
        records += [r for r in pau_dataset.load_split("debug", split, data_dir) if r.description]
    return records


def _code_ok(code: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name == "test_func" for n in ast.walk(tree))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", default="~/.cache/pau_jax/qwen2.5-coder-1.5b-instruct")
    add("--data_dir", default="~/tensorflow_datasets")
    add("--judge_tokens", type=int, default=96)
    add("--coder_tokens", type=int, default=256)
    add("--decode_weights", choices=("float32", "q8"), default="q8")
    args = parser.parse_args(argv)

    records = tasks(args.data_dir)
    golds = [r.description for r in records]
    pairs = [(g, g) for g in golds] + [
        (g, golds[(i + 1) % len(golds)]) for i, g in enumerate(golds)
    ]
    right = np.arange(len(pairs)) < len(golds)
    coder_prompts = [code_match.coder_messages(r.header, r.description) for r in records]
    print(f"model {args.model}; {len(records)} tasks, {len(pairs)} judge pairs; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    loaded = backends.Backends()
    ratings, blocks = {}, {}
    print(
        "| mode | unparsed ratings | mean rating, right | mean rating, wrong | coder blocks "
        "read | code parses, defines test_func | coder tokens (mean) | judge s | coder s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, structured in MODES.items():
        policy = {}
        for seat, tokens in (("judge", args.judge_tokens), ("coder", args.coder_tokens)):
            config = backends.LocalBackendConfig(
                checkpoint_dir=os.path.expanduser(args.model),
                sampling=SamplingConfig(max_new_tokens=tokens, structured=structured),
                decode_weights=args.decode_weights,
                prefix_cache_gib=0,
            )
            policy[seat] = loaded.build(config)
        start = time.perf_counter()
        verdicts = judge.judge(policy["judge"], pairs)
        judged = time.perf_counter() - start
        replies = policy["coder"].complete(
            coder_prompts, answers=[code_match.CODE] * len(coder_prompts)
        )
        coded = time.perf_counter() - start - judged
        scores = [v.score for v in verdicts]
        ratings[name] = scores
        texts = [r.text for r in replies]
        read = [bool(code_match._FENCE.search(t)) for t in texts]
        blocks[name] = sum(read)
        ok = sum(_code_ok(code_match.extract_code(t)) for t in texts)
        mean = {
            kind: np.mean([s for s, r in zip(scores, right) if s is not None and r == want] or [np.nan])
            for kind, want in (("right", True), ("wrong", False))
        }  # fmt: skip
        tokens = [len(r.token_ids) for r in replies]
        print(
            f"| {name} | {sum(s is None for s in scores)}/{len(scores)} | {mean['right']:.2f} | "
            f"{mean['wrong']:.2f} | {sum(read)}/{len(texts)} | {ok}/{len(texts)} | "
            f"{np.mean(tokens):.0f} | {judged:.0f} | {coded:.0f} |",
            flush=True,
        )
        for v in verdicts[:2] + [v for v in verdicts if v.score is None][:2]:
            print(f"   judge reply ({name}): {v.raw[-160:]!r}", flush=True)
    same = sum(a == b for a, b in zip(ratings["off"], ratings["masked"]))
    print(f"ratings alike in both modes: {same}/{len(pairs)}")
    unparsed = {n: sum(s is None for s in r) for n, r in ratings.items()}
    print(
        f"unparsed_off={unparsed['off']} unparsed_masked={unparsed['masked']} "
        f"blocks_read_off={blocks['off']}/{len(records)} "
        f"blocks_read_masked={blocks['masked']}/{len(records)}"
    )


if __name__ == "__main__":
    main()
