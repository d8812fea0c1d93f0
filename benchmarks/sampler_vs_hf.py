"""Greedy decoding speed of the JAX sampler against transformers' generate on the same weights.

One run builds a random-weight Qwen3-0.6B-architecture checkpoint in float32
(transformers `Qwen3ForCausalLM(config)`, `save_pretrained` into a temporary directory),
loads it with `qwen3.load_hf`, compiles and warms both sides up, then times `--rounds`
rounds. Each round runs, at batch 1 then batch 8 (prompts of `--prompt_len` tokens,
`--new_tokens` new tokens, greedy, no stop token):

    ours, transformers, [batch 1: the bandwidth reference]

with the side that goes first alternating from round to round (A B, B A, A B, ...), so
both see the same background load. Tokens/s counts generated tokens over the whole call
(prefill included) on both sides. Each round gives one ratio per batch size (our tokens/s
over transformers'); the result is the median of the per-round ratios, with their spread
((max - min) / median).

The weight-streaming bandwidth is a jitted float32 matrix-vector product over
`--bandwidth_gib` GiB; the batch-1 roofline is that bandwidth over the bytes of weights read
per token (every parameter once; the tied embedding is the LM head). roofline_b1 is our
batch-1 decode-loop tokens/s (prefill excluded) over the roofline tokens/s, medians over
rounds.

The machine's load average is printed at the start and the end. The run is marked noisy
when the 1-minute load average exceeded 0.5 at the start, or other processes used more
than 0.5 cores on average during the rounds (the load at the end counts this benchmark's
own threads, so the end is judged by the CPU time of everything else, from /proc/stat),
or the per-round ratios of either batch size spread by more than 20%; a noisy run's
ratios are not a measurement of the code. `--profile` adds a per-operation breakdown of one batch-8 decode call (the XLA
profiler's CPU thunk events, grouped by what they compute).

Usage (from the repository root):

    python benchmarks/sampler_vs_hf.py [--rounds 4] [--new_tokens 64] [--profile]

The last line is `ratio_b8=... ratio_b1=... roofline_b1=...% noisy=0|1`.
"""

import argparse
import collections
import glob
import os
import re
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
from pau_jax.sampling import decode_loop, generate, sampler  # noqa: E402

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
# Above this 1-minute load average, or this relative spread of the per-round ratios, the
# result is marked noisy.
MAX_LOAD = 0.5
MAX_SPREAD = 0.2


def _timed(fn) -> tuple[float, object]:
    """Wall time of one call of `fn` and its result."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _load() -> tuple[float, float, float]:
    return os.getloadavg()


class OtherCpu:
    """CPU time used by other processes while this one runs, in cores (Linux /proc/stat).

    The load average at the end of a run counts this benchmark's own threads; this is the
    same measure of contention without them: busy CPU time of the whole machine minus this
    process's, over the wall time.
    """

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
        times = os.times()
        return busy / os.sysconf("SC_CLK_TCK"), times.user + times.system, time.perf_counter()

    def cores(self) -> float | None:
        """Average cores used by other processes since construction (None off Linux)."""
        end = self._sample()
        if self.start is None or end is None:
            return None
        busy, own, wall = (b - a for a, b in zip(self.start, end))
        return max(0.0, busy - own) / wall


def _spread(values) -> float:
    """(max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values)


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


def _hlo_ops(hlo_text: str) -> dict[str, str]:
    """Instruction name -> "root op [shape] source" in an optimised HLO module's text.

    A fusion is described by the root instruction of its fused computation; the source is
    the last part of the `op_name` metadata (an einsum spec, `dot_general`, `select_n`...).
    """
    described, roots, computation = {}, {}, None
    for line in hlo_text.splitlines():
        header = re.match(r"%(\S+) \(.*\) -> .* \{", line)
        if header:
            computation = header.group(1)
        match = re.match(r"\s*(ROOT )?%(\S+) = (\S+) (\S+?)\(", line)
        if not match:
            continue
        is_root, name, shape, op = match.groups()
        source = re.search(r'op_name="([^"]+)"', line)
        source = source.group(1).rsplit("/", 1)[-1] if source else ""
        calls = re.search(r"calls=%([\w.\-]+)", line)
        described[name] = (op, shape.split("{")[0], source, calls.group(1) if calls else None)
        if is_root and computation:
            roots[computation] = (op, shape.split("{")[0], source)
    out = {}
    for name, (op, shape, source, calls) in described.items():
        if calls in roots:
            op, shape, source = roots[calls]
        out[name] = f"{op} {shape} {source}"
    return out


def _profile_decode(model, prompts, new_tokens: int, trace_dir: str) -> None:
    """Prints where a decode call's time goes, from the XLA CPU runtime's trace events.

    The last decode program `generate` runs for these prompts (the largest cache length) is
    compiled again from its captured argument shapes and run from step 0 on a zero carry
    (every row live) under the profiler. Each trace event is one thunk (a fusion, a dot, a
    copy...) of that program; events are grouped by the operation at the root of the
    fusion, its shape and its source (`op_name` metadata), summed over threads and divided
    by the number of steps.
    """
    captured, original = [], decode_loop._decode

    def spy(graphdef, state, carry, settings):
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), carry)
        captured.append((graphdef, state, shapes, settings))
        return original(graphdef, state, carry, settings)

    decode_loop._decode = spy
    try:
        generate(model, prompts, max_new_tokens=new_tokens)
    finally:
        decode_loop._decode = original
    graphdef, state, shapes, settings = captured[-1]
    compiled = original.lower(graphdef, state, shapes, settings).compile()
    names = _hlo_ops(compiled.as_text())
    width, max_new = int(settings.width), int(settings.max_new_tokens)
    steps = min(max_new, shapes["cache"].max_len - width)

    def zero_carry():
        return jax.block_until_ready(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes))

    jax.block_until_ready(compiled(state, zero_carry(), settings))
    carry = zero_carry()
    jax.profiler.start_trace(trace_dir)
    seconds, _ = _timed(lambda: jax.block_until_ready(compiled(state, carry, settings)))
    jax.profiler.stop_trace()
    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    data = jax.profiler.ProfileData.from_file(sorted(files)[-1])
    totals, counts = collections.Counter(), collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                if "_decode" not in str(dict(event.stats).get("hlo_module", "")):
                    continue
                group = names.get(event.name, event.name)
                totals[group] += event.duration_ns
                counts[group] += 1
    busy = sum(totals.values())
    print(
        f"profile b{len(prompts)}, {shapes['cache'].max_len} cache slots, {steps} steps: "
        f"{1000 * seconds / steps:.1f} ms/step wall (under the profiler); ops "
        f"{busy / 1e6 / steps:.1f} ms/step summed over threads"
    )
    for group, total in totals.most_common(20):
        print(f"  {total / 1e6 / steps:8.2f} ms/step {counts[group] / steps:5.0f}/step  {group}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds (A B / B A ...)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each side first")
    parser.add_argument("--prompt_len", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--group", type=int, default=8, help="G for the group-sampling variant")
    parser.add_argument("--group_new_tokens", type=int, default=16)
    parser.add_argument("--bandwidth_gib", type=float, default=1.25)
    parser.add_argument("--profile", action="store_true", help="per-op profile of b8 decode")
    parser.add_argument(
        "--num_layers", type=int, default=28, help="fewer decoder layers for a quick smoke run"
    )
    flags = parser.parse_args()
    load_start = _load()
    print(f"load_average_start={load_start[0]:.2f},{load_start[1]:.2f},{load_start[2]:.2f}")
    print(
        f"jax={jax.__version__} torch={torch.__version__} transformers={transformers.__version__}"
    )
    print(f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} devices={jax.devices()}")

    start = time.perf_counter()
    config = transformers.Qwen3Config(**dict(QWEN3_0_6B, num_hidden_layers=flags.num_layers))
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
    batches = (1, 8)

    def run_ours(batch):
        return generate(model, prompts[:batch].tolist(), max_new_tokens=new)

    def run_hf(batch):
        return _hf_generate(hf_model, prompts[:batch], new)

    start = time.perf_counter()
    for batch in batches:
        for _ in range(flags.warmup):
            ours_out, hf_tokens = run_ours(batch), run_hf(batch)
        same = float(np.mean(np.asarray(ours_out.tokens) == hf_tokens))
        print(f"b{batch}: greedy tokens identical to transformers': {same:.1%}")
    print(f"warmup_s={time.perf_counter() - start:.1f} (compiles included)")

    others = OtherCpu()
    ours_s = collections.defaultdict(list)
    hf_s = collections.defaultdict(list)
    decode_s = collections.defaultdict(list)
    prefill_s = collections.defaultdict(list)
    ratios = collections.defaultdict(list)
    bandwidths = []
    for round_index in range(flags.rounds):
        for batch in batches:
            order = ("ours", "hf") if round_index % 2 == 0 else ("hf", "ours")
            for side in order:
                if side == "ours":
                    seconds, out = _timed(lambda b=batch: run_ours(b))
                    ours_s[batch].append(seconds)
                    decode_s[batch].append(out.decode_seconds)
                    prefill_s[batch].append(out.prefill_seconds)
                else:
                    hf_s[batch].append(_timed(lambda b=batch: run_hf(b))[0])
            if batch == 1:
                bandwidths.append(bandwidth.measure())
            ratios[batch].append(hf_s[batch][-1] / ours_s[batch][-1])
        print(
            f"round {round_index}: load {_load()[0]:.2f}; "
            + "; ".join(
                f"b{b} ours {ours_s[b][-1]:.2f} s, hf {hf_s[b][-1]:.2f} s, "
                f"ratio {ratios[b][-1]:.2f}"
                for b in batches
            )
        )

    other_cores = others.cores()
    for batch in batches:
        tokens = batch * new
        print(
            f"jax b{batch}: {tokens / statistics.median(ours_s[batch]):.2f} tokens/s per call; "
            f"decode alone {tokens / statistics.median(decode_s[batch]):.2f} tokens/s "
            f"({1000 * statistics.median(decode_s[batch]) / new:.1f} ms/step); "
            f"prefill {statistics.median(prefill_s[batch]):.3f} s"
        )
        print(
            f"hf  b{batch}: {tokens / statistics.median(hf_s[batch]):.2f} tokens/s per call; "
            f"per-round ratios {' '.join(f'{r:.2f}' for r in ratios[batch])} "
            f"(median {statistics.median(ratios[batch]):.2f}, "
            f"spread {_spread(ratios[batch]):.0%})"
        )
    rate = statistics.median(bandwidths)
    roofline = rate / weight_bytes
    decode_b1 = new / statistics.median(decode_s[1])
    print(f"matvec_bandwidth={rate / 1e9:.1f} GB/s over {flags.bandwidth_gib} GiB")
    print(
        f"roofline_b1={roofline:.2f} tokens/s (bandwidth / weight bytes) = "
        f"{1000 / roofline:.1f} ms/step; ours {1000 / decode_b1:.1f} ms/step"
    )

    # Group sampling: G samples of one prompt, interleaved with one prompt alone and with G
    # distinct prompts, all with the same short budget, comparing prefill times.
    group, group_new = flags.group, flags.group_new_tokens
    calls = sampler.call_counts()
    grouped, alone, distinct = [], [], []
    for seed in range(2):
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
    print(
        f"group G={group} of 1 prompt: {(after['prefill'] - calls['prefill']) / 6:.0f} "
        f"prefill call per generate; prompt rows prefilled: G samples of 1 prompt "
        f"{grouped[-1].num_prefilled}, {group} distinct prompts {distinct[-1].num_prefilled}; "
        f"prefill {grouped[-1].prefill_seconds:.3f} s (1 prompt alone "
        f"{alone[-1].prefill_seconds:.3f} s, {group} distinct prompts "
        f"{distinct[-1].prefill_seconds:.3f} s); "
        f"{len({tuple(t) for t in grouped[-1].tokens})} distinct continuations of {group}"
    )
    if flags.profile:
        with tempfile.TemporaryDirectory() as directory:
            _profile_decode(model, prompts.tolist(), new, directory)

    load_end = _load()
    print(
        f"load_average_end={load_end[0]:.2f},{load_end[1]:.2f},{load_end[2]:.2f} "
        "(includes this benchmark's own threads)"
    )
    if other_cores is not None:
        print(f"other_processes_cpu={other_cores:.2f} cores on average during the rounds")
    spreads = {b: _spread(ratios[b]) for b in batches}
    noisy = (
        load_start[0] > MAX_LOAD
        or (other_cores is not None and other_cores > MAX_LOAD)
        or max(spreads.values()) > MAX_SPREAD
    )
    print(
        f"ratio_b8={statistics.median(ratios[8]):.2f} ratio_b1={statistics.median(ratios[1]):.2f} "
        f"roofline_b1={100 * decode_b1 / roofline:.0f}% noisy={int(noisy)}"
    )


if __name__ == "__main__":
    main()
