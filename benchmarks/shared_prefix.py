"""Grader prompts of one call that share their instructions: prefilled whole, or the head once.

A grader's call holds one prompt per item, each the same instructions followed by the
item: the judge's rating prompt (`judge.judge_messages`) and the failure-mode prompt
(`failure_modes.failure_messages`) start with a few hundred tokens that every item
repeats. With `PrefixCache(share_within_call=True)` (the default) that head is prefilled
once and every prompt prefills only what follows it; with False every prompt is prefilled
whole. This times the prefill of each set both ways (one new token per prompt, a fresh
cache per call, so nothing carries over between calls), in alternating order, and checks
that both give the same first token on every prompt.

Sets: the judge prompts of the `pau/debug` items with a gold description (each gold
against itself), and with `--run DIR` the failure-mode prompts of that evaluation run's
low-scoring interactive records.

    python benchmarks/shared_prefix.py --run runs/heldout-base          # Qwen2.5-Coder-1.5B, q8

The last line is `whole_s=... shared_s=... same_first_tokens=0|1 speedup=...` (prefill
seconds summed over the sets and rounds).
"""

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pau_jax.evaluation import failure_modes, judge  # noqa: E402
from pau_jax.policy import backends  # noqa: E402
from pau_jax.policy.config import SamplingConfig  # noqa: E402
from pau_jax.sampling.prefix_cache import PrefixCache  # noqa: E402
from pau_jax.tasks import pau_dataset  # noqa: E402


def prompt_sets(data_dir: str, run: str | None, run_dataset: str) -> dict[str, list]:
    """name -> conversations."""
    golds = {}
    for split in ("test", "train"):
        for r in pau_dataset.load_split("debug", split, data_dir):
            if r.description:
                golds[r.task_id] = r.description
    sets = {"judge": [judge.judge_messages(g, g) for g in golds.values()]}
    if run:
        rows = [json.loads(x) for x in open(pathlib.Path(run) / "interactive_scored.jsonl")]
        split = pau_dataset.load_split(run_dataset, "test", data_dir)
        refs = {r.task_id: r.description for r in split}
        low = [
            r
            for r in rows
            if failure_modes.is_low(r, code_match_below=0.5, judge_below=3)
            and failure_modes.precheck(r) is None
        ]
        sets["failure modes"] = [
            failure_modes.failure_messages(r, refs.get(r["task_id"], "")) for r in low
        ]
    return sets


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", default="~/.cache/pau_jax/qwen2.5-coder-1.5b-instruct")
    add("--data_dir", default="~/tensorflow_datasets")
    add("--run", default=None, help="an evaluation run directory (its failure-mode prompts)")
    add("--run_dataset", default="default", help="the builder config the run's tasks came from")
    add("--decode_weights", choices=("float32", "q8"), default="q8")
    add("--rounds", type=int, default=1)
    args = parser.parse_args(argv)

    sets = prompt_sets(os.path.expanduser(args.data_dir), args.run, args.run_dataset)
    config = backends.LocalBackendConfig(
        checkpoint_dir=os.path.expanduser(args.model),
        sampling=SamplingConfig(max_new_tokens=1),
        decode_weights=args.decode_weights,
        prefix_cache_gib=0,
    )
    policy = backends.Backends().build(config)
    print(f"model {args.model} ({args.decode_weights}); load {os.getloadavg()[0]:.2f}", flush=True)
    print("| set | prompts | round | mode | prefilled tokens | reused tokens | prefill s |")
    print("|---|---|---|---|---|---|---|")
    total = {False: 0.0, True: 0.0}
    same = True
    for name, conversations in sets.items():
        for r in range(args.rounds):
            first = {}
            order = (False, True) if r % 2 == 0 else (True, False)
            for share in order:
                policy.prefix_cache = PrefixCache(2**31, share_within_call=share)
                start = time.perf_counter()
                replies = policy.complete(conversations)
                seconds = time.perf_counter() - start
                stats = policy.last_stats
                first[share] = [tuple(x.token_ids[:1]) for x in replies]
                total[share] += seconds
                print(
                    f"| {name} | {len(conversations)} | {r + 1} | "
                    f"{'head once' if share else 'whole'} | {stats.get('prefill_tokens')} | "
                    f"{stats.get('reused_tokens')} | {seconds:.1f} |",
                    flush=True,
                )
            same &= first[False] == first[True]
    print(
        f"whole_s={total[False]:.1f} shared_s={total[True]:.1f} same_first_tokens={int(same)} "
        f"speedup={total[False] / total[True]:.2f}x"
    )


if __name__ == "__main__":
    main()
