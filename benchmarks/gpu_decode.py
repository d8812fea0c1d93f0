"""GPU decode throughput of the JAX sampler against the HBM-bandwidth roofline, in one run.

    python benchmarks/gpu_decode.py            # Qwen3-1.7B shapes, random bf16 weights, batch 1 and 64
    python benchmarks/gpu_decode.py --tiny     # a small float32 model on any backend (smoke test)

Needs JAX with a GPU backend. On a machine with only the CPU wheel, install the CUDA one
first (same JAX version as the repository's pins):

    pip install "jax[cuda12]==0.10.2" flax==0.12.8

Measurement, all on one device in one process:

- bandwidth: the best of 5 jitted reductions over a `--bandwidth_gib` GiB array (each byte
  read once), i.e. the HBM read bandwidth this device reaches;
- decode: `pau_jax.sampling.generate` (greedy, no stop token, prompts of `--prompt_len`
  random tokens, `--new_tokens` new tokens) at each batch size, after a compiling run; the
  best of `--repeats` decode loops (prefill excluded);
- roofline: one decode step must read every weight once (the tied embedding is the LM head)
  and each row's cached keys and values of the filled slots (prompt + half the new tokens
  on average); at the measured bandwidth that gives the roofline tokens/s of the batch.

Each batch size prints its tokens/s, the bytes/s it moved and that as a percentage of the
measured bandwidth (and of the device's nominal HBM bandwidth, where known). The last line
is `roofline_b1=...% roofline_b64=...%`: decode tokens/s over roofline tokens/s per batch.
The prompt and budget defaults (512 + 128) make the KV cache a single length bucket, so
each batch size compiles one prefill and one decode program.
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

from pau_jax.models import qwen3  # noqa: E402
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
# Nominal HBM bandwidth (bytes/s) by device kind, for the "of nominal" column only.
NOMINAL_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


def measure_bandwidth(num_bytes: int, repeats: int = 5) -> float:
    """Best bytes/s of a jitted float32-accumulated sum over a `num_bytes` bf16 array."""
    x = jnp.ones((num_bytes // 2,), jnp.bfloat16)
    reduce = jax.jit(lambda v: jnp.sum(v, dtype=jnp.float32))
    reduce(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        reduce(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return x.nbytes / best


def decode_seconds(model, batch: int, prompt_len: int, new_tokens: int, repeats: int) -> float:
    """Best decode-loop seconds of `repeats` greedy calls (after one compiling call)."""
    rng = np.random.default_rng(batch)
    prompts = rng.integers(0, model.config.vocab_size, (batch, prompt_len)).tolist()
    generate(model, prompts, max_new_tokens=new_tokens)
    return min(
        generate(model, prompts, max_new_tokens=new_tokens).decode_seconds for _ in range(repeats)
    )


def step_bytes(config, weight_bytes: int, batch: int, slots: float, kv_itemsize: int) -> float:
    """Bytes one decode step must read: every weight, and each row's filled cache slots."""
    per_slot = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    return weight_bytes + batch * slots * per_slot * kv_itemsize


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog='Install the GPU backend with: pip install "jax[cuda12]==0.10.2" flax==0.12.8',
    )
    parser.add_argument("--tiny", action="store_true", help="small float32 model (smoke test)")
    parser.add_argument("--batches", default="1,64", help="comma-separated batch sizes")
    parser.add_argument("--prompt_len", type=int, default=512)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed decode calls per batch")
    parser.add_argument("--bandwidth_gib", type=float, default=4.0)
    args = parser.parse_args()
    backend = jax.default_backend()
    if args.tiny:
        config, dtype = TINY, jnp.float32
        args.prompt_len, args.new_tokens = min(args.prompt_len, 64), min(args.new_tokens, 16)
        args.bandwidth_gib = min(args.bandwidth_gib, 0.25)
    elif backend != "gpu":
        sys.exit(
            f"no GPU backend (JAX sees {jax.devices()}); install it with "
            '`pip install "jax[cuda12]==0.10.2" flax==0.12.8`, or pass --tiny for a CPU run'
        )
    else:
        config, dtype = qwen3.PRESETS["1.7B"], jnp.bfloat16
    device = jax.devices()[0]
    print(
        f"jax={jax.__version__} backend={backend} device={device.device_kind} dtype={dtype.dtype}"
    )

    start = time.perf_counter()
    model = qwen3.Qwen3ForCausalLM(config, dtype=dtype, rngs=nnx.Rngs(0))
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    print(
        f"model built in {time.perf_counter() - start:.1f} s; weights {weight_bytes / 1e9:.3f} GB"
    )
    bandwidth = measure_bandwidth(int(args.bandwidth_gib * 2**30))
    nominal = next((v for k, v in NOMINAL_BANDWIDTH.items() if k in device.device_kind), None)
    print(
        f"measured read bandwidth {bandwidth / 1e9:.0f} GB/s"
        + (f" ({bandwidth / nominal:.0%} of nominal {nominal / 1e9:.0f} GB/s)" if nominal else "")
    )

    slots = args.prompt_len + args.new_tokens / 2  # filled slots, averaged over the steps
    itemsize = jnp.dtype(dtype).itemsize
    fractions = {}
    for batch in (int(b) for b in args.batches.split(",")):
        start = time.perf_counter()
        seconds = decode_seconds(model, batch, args.prompt_len, args.new_tokens, args.repeats)
        moved = step_bytes(config, weight_bytes, batch, slots, itemsize) * args.new_tokens
        rate = batch * args.new_tokens / seconds
        roofline = batch * args.new_tokens * bandwidth / moved
        fractions[batch] = rate / roofline
        print(
            f"decode b{batch}: {rate:.1f} tokens/s ({1000 * seconds / args.new_tokens:.2f} "
            f"ms/step); {moved / seconds / 1e9:.0f} GB/s moved = {fractions[batch]:.0%} of "
            f"measured"
            + (f", {moved / seconds / nominal:.0%} of nominal" if nominal else "")
            + f"; roofline {roofline:.1f} tokens/s; {time.perf_counter() - start:.0f} s with compile"
        )
    print(" ".join(f"roofline_b{b}={100 * f:.0f}%" for b, f in fractions.items()))


if __name__ == "__main__":
    main()
