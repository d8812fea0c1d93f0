"""What structured decoding costs per decode step, side by side with unconstrained decoding.

One process, one model, one batch of chat prompts, greedy. Three decode programs are timed
in turn (each compiled first, untimed), `--repeats` times each, taking the fastest:

  plain        `generate` without an automaton (today's program)
  free         with the automaton, every row in its `free` state: the mask, the budget
               check and the state update all run, and the tokens must equal plain's
  constrained  every row masked to the input grammar of `--arity` (rows end when their
               answer does, so the cost is per step actually run)

A step's cost is the decode seconds over the steps run (the longest row). The automaton is
built once over the tokenizer's vocabulary (its build time and table size are printed).

    python benchmarks/structured_decode.py --checkpoint smollm2            # SmolLM2-135M
    python benchmarks/structured_decode.py --checkpoint ~/.cache/pau_jax/qwen2.5-coder-0.5b-instruct

The last line is `ms_per_step_plain=... ms_per_step_free=... ms_per_step_constrained=...
overhead_free=... overhead_constrained=... identical=0|1` (overheads are ratios to plain
minus 1; identical: free rows gave plain's tokens).
"""

import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pau_jax import models  # noqa: E402
from pau_jax.policy.local import LocalPolicy  # noqa: E402
from pau_jax.sampling import constraint, generate, token_bytes  # noqa: E402
from pau_jax.tokenizer import load_tokenizer  # noqa: E402

SMOLLM2 = pathlib.Path("~/.cache/pau_jax/smollm2-135m-instruct").expanduser()
QUESTION = (
    "Write the arguments for the next call of `def test_func(arg0, arg1):` as a Python tuple "
    "of exactly 2 literals, in a fenced block. Example {i}: (3, 'abc')"
)


def _time(fn, repeats: int):
    fn()  # compile
    best, out = float("inf"), None
    for _ in range(repeats):
        out = fn()
        steps = max(int(n) for n in out.lengths)
        best = min(best, out.decode_seconds / steps)
    return best * 1e3, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="smollm2", help="HF directory or 'smollm2'")
    parser.add_argument("--rows", type=int, default=8, help="prompts in the batch")
    parser.add_argument("--steps", type=int, default=64, help="max new tokens")
    parser.add_argument("--arity", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load_average_start={','.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    path = SMOLLM2 if args.checkpoint == "smollm2" else pathlib.Path(args.checkpoint).expanduser()
    if not (path / "config.json").is_file():
        raise SystemExit(f"{path} has no config.json (python -m pau_jax.tools.fetch NAME first)")
    model, _ = models.load_hf(path, dtype="float32")
    tokenizer = load_tokenizer(path)
    policy = LocalPolicy(model, tokenizer, prefix_cache=None)
    prompts = [
        policy.encode([{"role": "user", "content": QUESTION.format(i=i)}]) for i in range(args.rows)
    ]
    start = time.perf_counter()
    automaton = constraint.build_components(
        token_bytes.vocabulary(tokenizer),
        policy.stop_token_ids,
        [constraint.Component("input", arity=args.arity), constraint.DECISION],
        vocab_size=model.config.vocab_size,
    )
    build_s = time.perf_counter() - start
    print(
        f"checkpoint={path} vocab={model.config.vocab_size} rows={args.rows} steps={args.steps} "
        f"automaton: {automaton.next_state.shape[0]} states, {automaton.next_state.shape[1]} "
        f"classes, {automaton.nbytes() / 2**20:.2f} MiB, built in {build_s:.1f} s",
        flush=True,
    )

    def run(**kwargs):
        # No stop tokens for plain and free, so every row decodes all steps.
        return generate(model, prompts, max_new_tokens=args.steps, temperature=0.0, **kwargs)

    plain_ms, plain = _time(run, args.repeats)
    free_ms, free = _time(
        lambda: run(automaton=automaton, automaton_starts=automaton.free), args.repeats
    )
    constrained_ms, constrained = _time(
        lambda: run(automaton=automaton, stop_token_ids=policy.stop_token_ids), args.repeats
    )
    identical = plain.tokens == free.tokens
    for name, ms, out in (
        ("plain", plain_ms, plain),
        ("free", free_ms, free),
        ("constrained", constrained_ms, constrained),
    ):
        print(f"{name}: {ms:.2f} ms/step, steps {max(out.lengths)}", flush=True)
    print("constrained replies:", [tokenizer.decode(t) for t in constrained.tokens[:3]], flush=True)
    print(f"load_average_end={','.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(
        f"ms_per_step_plain={plain_ms:.2f} ms_per_step_free={free_ms:.2f} "
        f"ms_per_step_constrained={constrained_ms:.2f} "
        f"overhead_free={free_ms / plain_ms - 1:.3f} "
        f"overhead_constrained={constrained_ms / plain_ms - 1:.3f} identical={int(identical)}"
    )


if __name__ == "__main__":
    main()
