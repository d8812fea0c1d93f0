"""Build time and device memory of the input-phase token automaton for the Qwen3 vocabulary.

    python benchmarks/constraint_tables.py                      # arity 1, 2, 3; depth 2; 'fence'
    python benchmarks/constraint_tables.py --arity 2 --depth 1 --wrapper input_line

For each arity it builds `pau_jax.sampling.constraint.build` over the offline Qwen3
tokenizer's 151,669 tokens (logits 151,936 wide; stop token `<|im_end|>`), uncached, and
prints the byte DFA's states, the token classes, the distinct allowed-token masks and the
bytes of each device table, and the time of one jitted masked sampling step
(`mask_logits` + argmax + `advance`) on `--rows` rows of random logits against argmax
alone, on the default backend (a hint for the decode-loop overhead, not that measure).
The last line is `tables_mib_a1=... build_s_a1=...` per arity.
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pau_jax.sampling import constraint, token_bytes, token_mask  # noqa: E402
from pau_jax.tokenizer import load_tokenizer  # noqa: E402

QWEN_VOCAB = 151_936


def _best_ms(fn, *xs, repeats: int = 20) -> float:
    jax.block_until_ready(fn(*xs))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*xs))
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _step_ms(a: constraint.TokenAutomaton, rows: int) -> str:
    a = jax.device_put(a)
    logits = jax.random.normal(jax.random.key(0), (rows, a.vocab_size))
    states = jnp.full((rows,), a.start, jnp.int32)

    @jax.jit
    def masked(a, states, logits):
        tokens = jnp.argmax(token_mask.mask_logits(a, states, logits), axis=-1)
        return token_mask.advance(a, states, tokens)

    plain = jax.jit(lambda logits: jnp.argmax(logits, axis=-1))
    return (
        f"masked {_best_ms(masked, a, states, logits):.2f} ms, "
        f"argmax alone {_best_ms(plain, logits):.2f} ms ({jax.default_backend()})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arity", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--wrapper", default="fence", choices=constraint.WRAPPERS)
    parser.add_argument("--rows", type=int, default=8)
    args = parser.parse_args()

    tokenizer = load_tokenizer("qwen3-offline")
    vocab = token_bytes.vocabulary(tokenizer)
    headline = []
    for arity in args.arity:
        constraint.clear_cache()
        start = time.perf_counter()
        a = constraint.build(
            vocab,
            [tokenizer.eos_token_id],
            arity=arity,
            wrapper=args.wrapper,
            depth=args.depth,
            vocab_size=QWEN_VOCAB,
        )
        seconds = time.perf_counter() - start
        sizes = a.table_bytes()
        states, classes = a.next_state.shape
        print(
            f"arity={arity} depth={args.depth} wrapper={args.wrapper}: build {seconds:.1f} s, "
            f"{states - 2} states, {classes} token classes, {a.masks.shape[0]} masks; "
            + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in sizes.items())
            + f"; total {a.nbytes() / 2**20:.2f} MiB"
        )
        print(f"  step at {args.rows} rows: {_step_ms(a, args.rows)}")
        headline.append(
            f"tables_mib_a{arity}={a.nbytes() / 2**20:.1f} build_s_a{arity}={seconds:.1f}"
        )
    print(" ".join(headline))


if __name__ == "__main__":
    main()
