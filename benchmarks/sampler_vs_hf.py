"""Greedy decoding speed of the JAX sampler against transformers' generate on the same weights.

One run builds a random-weight Qwen3-0.6B-architecture checkpoint in float32
(transformers `Qwen3ForCausalLM(config)`, `save_pretrained` into a temporary directory),
loads it with `qwen3.load_hf`, and times, after warm-up, the median of `--repeats` runs of:

- `pau_jax.sampling.generate` and transformers `generate` (PyTorch, CPU) at batch 1 and
  batch 8: prompts of `--prompt_len` tokens, `--new_tokens` new tokens, greedy, no stop
  token. Tokens/s counts generated tokens over the whole call (prefill included) for both.
- the machine's weight-streaming bandwidth: a jitted float32 matrix-vector product over a
  matrix of `--bandwidth_gib` GiB. The batch-1 roofline is that bandwidth over the bytes of
  weights read per token (every parameter once; the tied embedding is the LM head).
- group sampling: G = 8 samples of one prompt, whose prefill runs once, against the same
  prompt alone and a batch of 8 distinct prompts (8 prefills), interleaved.

Usage (from the repository root):

    python benchmarks/sampler_vs_hf.py [--repeats 3] [--warmup 1] [--new_tokens 64]

Our runs and transformers' alternate, and the bandwidth is measured next to each batch-1
run, so all see the same background load. The last line is
`ratio_b8=... ratio_b1=... roofline_b1=...%`: ratios are our tokens/s over transformers'
(whole calls); roofline_b1 is our batch-1 decode-loop tokens/s (prefill excluded) over the
roofline tokens/s.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from flax import nnx  # noqa: E402

from pau_jax.models import qwen3  # noqa: E402
from pau_jax.sampling import generate, sampler  # noqa: E402

QWEN3_0_6B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


def _timed(fn) -> tuple[float, object]:
    """Wall time of one call of `fn` and its result."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


class Bandwidth:
    """A jitted float32 matrix-vector product over `gib` GiB, the weight-streaming reference."""

    def __init__(self, gib: float):
        cols = 1024
        rows = int(gib * 2**30) // (4 * cols)
        self.bytes = rows * cols * 4
        self.matrix = jax.jit(lambda key: jax.random.normal(key, (rows, cols), jnp.float32))(
            jax.random.key(0)
        )
        self.vector = jnp.ones((cols,), jnp.float32)
        self.matvec = jax.jit(lambda m, v: m @ v)
        self.matvec(self.matrix, self.vector).block_until_ready()

    def measure(self, repeats: int = 5) -> float:
        """Bytes per second: the median over `repeats` products."""
        times = [
            _timed(lambda: self.matvec(self.matrix, self.vector).block_until_ready())[0]
            for _ in range(repeats)
        ]
        return self.bytes / statistics.median(times)


def _hf_generate(model, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
    ids = torch.from_numpy(prompts.astype(np.int64))
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[:, ids.shape[1] :].numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--prompt_len", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--group", type=int, default=8, help="G for the group-sampling variant")
    parser.add_argument("--group_new_tokens", type=int, default=16)
    parser.add_argument("--bandwidth_gib", type=float, default=1.25)
    parser.add_argument("--skip_hf", action="store_true", help="time only the JAX sampler")
    flags = parser.parse_args()
    print(
        f"jax={jax.__version__} torch={torch.__version__} transformers={transformers.__version__}"
    )
    print(f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} devices={jax.devices()}")

    start = time.perf_counter()
    config = transformers.Qwen3Config(**QWEN3_0_6B)
    torch.manual_seed(0)
    hf_model = transformers.Qwen3ForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as directory:
        hf_model.save_pretrained(directory)
        model, _ = qwen3.load_hf(directory, dtype="float32")
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    print(f"checkpoint_built_and_loaded_s={time.perf_counter() - start:.1f}")
    print(f"weights={weight_bytes / 1e9:.3f} GB read per token (tied embedding counted once)")
    bandwidth = Bandwidth(flags.bandwidth_gib)

    rng = np.random.default_rng(0)
    prompts = rng.integers(0, QWEN3_0_6B["vocab_size"], size=(8, flags.prompt_len))
    new = flags.new_tokens
    ours, theirs, decode_rate, prefill, bandwidths = {}, {}, {}, {}, []
    for batch in (1, 8):
        batch_prompts = prompts[:batch]

        def run_ours(p=batch_prompts):
            return generate(model, p.tolist(), max_new_tokens=new)

        def run_hf(p=batch_prompts):
            return _hf_generate(hf_model, p, new)

        for _ in range(flags.warmup):
            run_ours()
            if not flags.skip_hf:
                run_hf()
        # Interleaved, so both sides see the same background load.
        ours_s, hf_s, decode_s, prefill_s = [], [], [], []
        for _ in range(flags.repeats):
            seconds, out = _timed(run_ours)
            ours_s.append(seconds)
            decode_s.append(out.decode_seconds)
            prefill_s.append(out.prefill_seconds)
            if batch == 1:
                bandwidths.append(bandwidth.measure())
            if not flags.skip_hf:
                seconds, hf_tokens = _timed(run_hf)
                hf_s.append(seconds)
        ours[batch] = batch * new / statistics.median(ours_s)
        decode_rate[batch] = batch * new / statistics.median(decode_s)
        prefill[batch] = statistics.median(prefill_s)
        print(
            f"jax b{batch}: {ours[batch]:.2f} tokens/s per call; decode alone "
            f"{decode_rate[batch]:.2f} tokens/s; prefill {prefill[batch]:.3f} s"
        )
        if not flags.skip_hf:
            theirs[batch] = batch * new / statistics.median(hf_s)
            same = float(np.mean(np.asarray(out.tokens) == hf_tokens))
            print(
                f"hf  b{batch}: {theirs[batch]:.2f} tokens/s per call; "
                f"greedy tokens identical to ours: {same:.1%}"
            )

    rate = statistics.median(bandwidths)
    roofline = rate / weight_bytes
    print(f"matvec_bandwidth={rate / 1e9:.1f} GB/s over {flags.bandwidth_gib} GiB")
    print(f"roofline_b1={roofline:.2f} tokens/s (bandwidth / weight bytes)")

    # Group sampling: G samples of one prompt, interleaved with one prompt alone and with G
    # distinct prompts, all with the same short budget, comparing prefill times.
    group, group_new = flags.group, flags.group_new_tokens
    calls = sampler.call_counts()
    grouped, alone, distinct = [], [], []
    for seed in range(flags.warmup + flags.repeats):
        grouped.append(
            generate(
                model,
                prompts[:1].tolist(),
                max_new_tokens=group_new,
                n_samples=group,
                temperature=1.0,
                seed=seed,
            )
        )
        alone.append(generate(model, prompts[:1].tolist(), max_new_tokens=group_new))
        distinct.append(generate(model, prompts[:group].tolist(), max_new_tokens=group_new))
    after = sampler.call_counts()
    runs = len(grouped)

    def prefill_s(outs):
        return statistics.median(o.prefill_seconds for o in outs[flags.warmup :])

    print(
        f"group G={group} of 1 prompt: {(after['prefill'] - calls['prefill']) / runs / 3:.0f} "
        f"prefill call per generate; prompt rows prefilled: G samples of 1 prompt "
        f"{grouped[-1].num_prefilled}, {group} distinct prompts {distinct[-1].num_prefilled}; "
        f"prefill {prefill_s(grouped):.3f} s (1 prompt alone {prefill_s(alone):.3f} s, "
        f"{group} distinct prompts {prefill_s(distinct):.3f} s); "
        f"{len({tuple(t) for t in grouped[-1].tokens})} distinct continuations of {group}"
    )
    ratio_b8 = ours[8] / theirs[8] if theirs else float("nan")
    ratio_b1 = ours[1] / theirs[1] if theirs else float("nan")
    print(
        f"ratio_b8={ratio_b8:.2f} ratio_b1={ratio_b1:.2f} "
        f"roofline_b1={100 * decode_rate[1] / roofline:.0f}%"
    )


if __name__ == "__main__":
    main()
