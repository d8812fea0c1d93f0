"""GPU decode throughput against the HBM-bandwidth roofline, and GRPO train-step tokens/s, in one run.

    python benchmarks/gpu_decode.py                  # Qwen3-1.7B architecture, random bf16 weights
    python benchmarks/gpu_decode.py --tiny           # a small float32 model: a CPU smoke test

The roofline of one decode step is the time to read every weight once plus the
KV cache the step attends to (B rows x the filled slots), at the bandwidth of a
jitted reduction over a large array measured here on the same device. Decode
tokens/s at batch B is measured with ``pau_jax.sampling.generate`` (greedy, no
stop tokens, after a compile run); the train step is ``learner.TrainStep`` on
random tokens with LoRA rank 16. The last line is the headline ratio: batch-1
decode as a fraction of its roofline.
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pau_jax.models import lora, qwen3  # noqa: E402
from pau_jax.rl import learner  # noqa: E402
from pau_jax.sampling import generate  # noqa: E402

TINY = qwen3.Qwen3Config(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
)


def bandwidth(num_bytes: int, dtype, repeats: int = 5) -> float:
    """Best bytes/s of a jitted sum over a ``num_bytes`` array (reads it once)."""
    x = jnp.ones((num_bytes // jnp.dtype(dtype).itemsize,), dtype)
    reduce = jax.jit(lambda v: jnp.sum(v, dtype=jnp.float32))
    reduce(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        reduce(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return x.nbytes / best


def decode_rate(model, batch: int, prompt_len: int, new_tokens: int) -> float:
    """Generated tokens/s of the decode loop at ``batch`` rows (best of two timed runs)."""
    rng = np.random.default_rng(batch)
    prompts = rng.integers(0, model.config.vocab_size, (batch, prompt_len)).tolist()
    kwargs = dict(max_new_tokens=new_tokens, temperature=0.0)
    generate(model, prompts, **kwargs)  # compile
    best = min(generate(model, prompts, **kwargs).decode_seconds for _ in range(2))
    return batch * new_tokens / best


def step_bytes(config, params_bytes: int, batch: int, slots: int, kv_itemsize: int) -> int:
    """Bytes one decode step must read: every weight, and each row's cached keys and values."""
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    return params_bytes + batch * slots * kv * kv_itemsize


def train_rate(model, batch: int, seq: int, steps: int) -> float:
    """Tokens/s of the GRPO LoRA train step on random sequences."""
    config = learner.LearnerConfig()
    train_step = learner.TrainStep(model, config)
    state = learner.init_state(model, config)
    rng = np.random.default_rng(0)
    data = learner.Batch(
        input_ids=jnp.asarray(rng.integers(0, model.config.vocab_size, (batch, seq)), jnp.int32),
        attention_mask=jnp.ones((batch, seq), jnp.int32),
        loss_mask=jnp.ones((batch, seq), jnp.float32),
        advantages=jnp.asarray(rng.standard_normal(batch), jnp.float32),
        sampler_logprobs=jnp.full((batch, seq), -2.0, jnp.float32),
    )
    state, metrics = train_step(state, data)  # compile
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = train_step(state, data)
    jax.block_until_ready(metrics)
    return steps * batch * seq / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small float32 model (CPU smoke test)")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt_len", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--train_batch", type=int, default=8)
    parser.add_argument("--train_seq", type=int, default=512)
    parser.add_argument("--train_steps", type=int, default=3)
    parser.add_argument("--bandwidth_mib", type=int, default=1024)
    args = parser.parse_args()
    if args.tiny:
        config, dtype = TINY, jnp.float32
        args.prompt_len, args.new_tokens = min(args.prompt_len, 16), min(args.new_tokens, 16)
        args.train_batch, args.train_seq = min(args.train_batch, 2), min(args.train_seq, 64)
        args.bandwidth_mib = min(args.bandwidth_mib, 64)
    else:
        config, dtype = qwen3.PRESETS["1.7B"], jnp.bfloat16
    print(
        f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), dtype {dtype.__name__}"
    )
    model = qwen3.Qwen3ForCausalLM(config, dtype=dtype, rngs=nnx.Rngs(0))
    params_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    bw = bandwidth(args.bandwidth_mib * 1024**2, dtype)
    print(f"weights: {params_bytes / 1e9:.3f} GB; measured bandwidth: {bw / 1e9:.1f} GB/s")

    ratios = {}
    slots = args.prompt_len + args.new_tokens // 2  # cache filled halfway on average
    for batch in (int(b) for b in args.batches.split(",")):
        rate = decode_rate(model, batch, args.prompt_len, args.new_tokens)
        itemsize = jnp.dtype(dtype).itemsize
        roofline = batch * bw / step_bytes(config, params_bytes, batch, slots, itemsize)
        ratios[batch] = rate / roofline
        print(
            f"decode batch {batch:3d}: {rate:10.1f} tokens/s; roofline {roofline:10.1f} "
            f"tokens/s ({ratios[batch]:.0%})"
        )

    lora.apply_lora(model, rank=16, alpha=16)
    rate = train_rate(model, args.train_batch, args.train_seq, args.train_steps)
    print(f"GRPO train step ({args.train_batch} x {args.train_seq}, LoRA 16): {rate:.1f} tokens/s")
    first = next(iter(ratios))
    print(f"decode_batch{first}_vs_roofline={ratios[first]:.3f}")


if __name__ == "__main__":
    main()
