"""Episodes per hour of the interactive protocol, with and without reusing each episode's prefix.

One run evaluates the same `pau/debug` tasks twice with the same greedy local policy: once
with a `PrefixCache` (each phase prefills only what its conversation appended since an
earlier prompt or reply) and once re-encoding every prompt whole. `--warmup` tasks are first run
both ways untimed, so most programs are compiled before the timed runs; the reuse run
then goes first, so the full run finds the decode programs already compiled (the
comparison favours it).
For each run it prints episodes per hour and the split of wall time into prefill, decode,
compilation (inside prefill and decode; XLA compile events), sandbox calls and the rest
(host: templates, tokenising, parsing), the number of compiled sampler programs, and the
prompt tokens prefilled and reused. It then checks that the two runs' trajectories (every
reply's tokens) are identical.

    python benchmarks/episode_throughput.py                      # tiny random Qwen3, budget 25
    python benchmarks/episode_throughput.py --checkpoint ~/.cache/pau_jax/smollm2-135m-instruct \\
        --tasks 4 --budget 6 --max_new_tokens 200 [--reuse_only]
    python benchmarks/episode_throughput.py --checkpoint smollm2 --tasks 4 --budget 6 \\
        --max_new_tokens 200 --warmup 0 --structured end_at_answer     # early stop vs off

With `--structured MODE` the two timed runs are structured decoding off and MODE (both
reusing prefixes); the last line is then `wall_off=... wall_MODE=... replies_cut=...
prefix_identical=0|1 speedup=...` (prefix_identical: every reply of the MODE run is a
prefix of the off run's, as 'end_at_answer' promises).

`--checkpoint smollm2` means the converted SmolLM2-135M-Instruct cache of
`python -m pau_jax.tools.fetch_smollm2` (it must exist; nothing is downloaded here).
The last line is `episodes_per_hour_reuse=... episodes_per_hour_full=...
ratio_without_compilation=... ratio=... identical=0|1` (the second ratio leaves out each
run's XLA compile time, which a persistent compilation cache removes on a repeated run).
"""

import argparse
import collections
import dataclasses
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from flax import nnx  # noqa: E402

from pau_jax import models  # noqa: E402
from pau_jax.env import runner  # noqa: E402
from pau_jax.env.episode import EpisodeConfig  # noqa: E402
from pau_jax.models import qwen3  # noqa: E402
from pau_jax.policy.config import DEFAULT_PREFIX_CACHE_GIB, SamplingConfig  # noqa: E402
from pau_jax.policy.local import LocalPolicy  # noqa: E402
from pau_jax.sampling import sampler  # noqa: E402
from pau_jax.sampling.prefix_cache import PrefixCache  # noqa: E402
from pau_jax.sandbox import Executor  # noqa: E402
from pau_jax.tasks import pau_dataset as tasks_lib  # noqa: E402
from pau_jax.tokenizer import load_tokenizer, save_offline_tokenizer  # noqa: E402

SMOLLM2 = pathlib.Path("~/.cache/pau_jax/smollm2-135m-instruct").expanduser()
TINY = dict(
    vocab_size=151936,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
)

_COMPILE = {"seconds": 0.0, "count": 0}


def _on_event(event: str, seconds: float, **_) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILE["seconds"] += seconds
        _COMPILE["count"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


class _TimedPolicy:
    """Wraps a `LocalPolicy`, adding up its prefill and decode seconds and token counts."""

    def __init__(self, policy: LocalPolicy):
        self.policy = policy
        self.totals = collections.Counter()

    def complete(self, conversations, *, answers=None, stop=None):
        out = self.policy.complete(conversations, answers=answers, stop=stop)
        stats = self.policy.last_stats
        for key in ("prefill_seconds", "decode_seconds", "prefill_tokens", "reused_tokens"):
            self.totals[key] += stats.get(key, 0.0)
        self.totals["generated_tokens"] += stats.get("generated_tokens", 0.0)
        self.totals["calls"] += 1
        return out


class _TimedExecutor:
    """Wraps an executor, adding up the wall time of its calls (they may overlap)."""

    def __init__(self, executor):
        self.executor = executor
        self.seconds = 0.0

    def call(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.executor.call(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def _checkpoint(arg: str | None, workdir: pathlib.Path) -> pathlib.Path:
    if arg == "smollm2":
        arg = str(SMOLLM2)
    if arg:
        path = pathlib.Path(arg).expanduser()
        if not (path / "config.json").is_file():
            raise SystemExit(f"{path} has no config.json (for SmolLM2 run fetch_smollm2 first)")
        return path
    path = workdir / "tiny"
    config = qwen3.Qwen3Config(**TINY)
    qwen3.save_hf(qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), config, path)
    save_offline_tokenizer(path)
    return path


def _run(name, specs, model, tokenizer, sampling, config, executor, cache):
    policy = _TimedPolicy(LocalPolicy(model, tokenizer, sampling, prefix_cache=cache))
    timed = _TimedExecutor(executor)
    traces = sampler.trace_counts()
    compile_before = dict(_COMPILE)
    start = time.perf_counter()
    finished = runner.run_episode_states(specs, policy, timed, config, progress=False)
    wall = time.perf_counter() - start
    t = policy.totals
    compile_s = _COMPILE["seconds"] - compile_before["seconds"]
    programs = {
        k: v - traces.get(k, 0) for k, v in sampler.trace_counts().items() if v > traces.get(k, 0)
    }
    host = wall - t["prefill_seconds"] - t["decode_seconds"] - timed.seconds
    compiles = _COMPILE["count"] - compile_before["count"]
    steps = sum(len(f.state.steps) for f in finished)
    print(
        f"{name}: {len(finished)} episodes, {steps} phases, {int(t['calls'])} policy calls in "
        f"{wall:.1f} s -> {3600 * len(finished) / wall:.1f} episodes/hour\n"
        f"  prefill {t['prefill_seconds']:.1f} s, decode {t['decode_seconds']:.1f} s "
        f"(of which XLA compilation {compile_s:.1f} s, {compiles} compiles), "
        f"sandbox {timed.seconds:.1f} s, "
        f"host {host:.1f} s\n"
        f"  programs traced: {programs}\n"
        f"  prompt tokens prefilled {int(t['prefill_tokens'])}, reused "
        f"{int(t['reused_tokens'])}; generated {int(t['generated_tokens'])}",
        flush=True,
    )
    replies = {f.spec.episode_id: [tuple(r.token_ids) for r in f.replies] for f in finished}
    return len(finished) / wall * 3600, len(finished) / (wall - compile_s) * 3600, replies


def _cache() -> PrefixCache:
    """A prefix cache of the size every seat's has."""
    return PrefixCache(max_bytes=int(DEFAULT_PREFIX_CACHE_GIB * 2**30))


def _compare_structured(mode, specs, model, tokenizer, sampling, config, executor) -> None:
    """Times the episodes with structured decoding off, then on; prints the headline line.

    With 'end_at_answer' the greedy tokens are the unconstrained ones cut at each answer's
    end, so every reply of the structured run must be a prefix of the same reply of the off
    run (and the episodes the same); `prefix_identical` checks it.
    """
    structured = dataclasses.replace(sampling, structured=mode)
    off_rate, _, off_replies = _run(
        "off", specs, model, tokenizer, sampling, config, executor, _cache()
    )
    on_rate, _, on_replies = _run(
        mode, specs, model, tokenizer, structured, config, executor, _cache()
    )
    prefix_identical = off_replies.keys() == on_replies.keys() and all(
        len(off_replies[k]) == len(on_replies[k])
        and all(o[: len(n)] == n for o, n in zip(off_replies[k], on_replies[k], strict=True))
        for k in off_replies
    )
    cut = sum(
        len(n) < len(o)
        for k in off_replies
        for o, n in zip(off_replies[k], on_replies.get(k, ()), strict=False)
    )
    print(f"load_average_end={','.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(
        f"wall_off={3600 * len(specs) / off_rate:.1f} wall_{mode}={3600 * len(specs) / on_rate:.1f} "
        f"replies_cut={cut} prefix_identical={int(prefix_identical)} "
        f"speedup={on_rate / off_rate:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkpoint", default=None, help="HF directory, 'smollm2', or a tiny random model"
    )
    parser.add_argument("--tasks", type=int, default=4, help="first N tasks of pau/debug (test)")
    parser.add_argument("--budget", type=int, default=25, help="call budget per episode")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--data_dir", default=None, help="TFDS data_dir (default: a temporary one)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed tasks run first both ways, so most programs are compiled before timing",
    )
    parser.add_argument(
        "--structured",
        choices=("end_at_answer", "constrain_inputs"),
        default=None,
        help="instead of reuse vs full: the recipe with SamplingConfig.structured=MODE vs 'off' "
        "(both with prefix reuse)",
    )
    parser.add_argument(
        "--reuse_only",
        action="store_true",
        help="time only the prefix-cache run (how long the recipe takes); no ratio",
    )
    args = parser.parse_args()

    print(f"load_average_start={','.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        data_dir = pathlib.Path(args.data_dir or workdir / "tfds").expanduser()
        tasks_lib.ensure_built(data_dir, config="debug")
        records = tasks_lib.load_split("debug", "test", data_dir, limit=args.tasks)
        # A phase limit keeps a model that never parses an input from running forever.
        config = EpisodeConfig(call_budget=args.budget, max_steps=3 * args.budget + 3)
        specs = [tasks_lib.to_spec(r, config) for r in records]
        path = _checkpoint(args.checkpoint, workdir)
        model, _ = models.load_hf(path, dtype="float32")
        tokenizer = load_tokenizer(path)
        sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
        print(
            f"checkpoint={path} tasks={len(specs)} budget={args.budget} "
            f"max_new_tokens={args.max_new_tokens} cpus={os.cpu_count()}",
            flush=True,
        )
        with Executor(workers=2) as executor:
            if args.warmup:
                warm = [
                    runner.EpisodeSpec(
                        task=s.task, code=s.code, episode_id=f"warmup/{s.task.task_id}"
                    )
                    for s in specs[: args.warmup]
                ]
                for cache in (_cache(), None):
                    policy = LocalPolicy(model, tokenizer, sampling, prefix_cache=cache)
                    runner.run_episode_states(warm, policy, executor, config, progress=False)
                print(f"warm-up done ({args.warmup} task(s) both ways)", flush=True)
            if args.structured:
                _compare_structured(
                    args.structured, specs, model, tokenizer, sampling, config, executor
                )
                return
            reuse_rate, reuse_warm, reuse_replies = _run(
                "reuse", specs, model, tokenizer, sampling, config, executor, _cache()
            )
            if args.reuse_only:
                print(f"episodes_per_hour_reuse={reuse_rate:.1f}")
                return
            full_rate, full_warm, full_replies = _run(
                "full", specs, model, tokenizer, sampling, config, executor, None
            )
    identical = reuse_replies == full_replies
    if not identical:
        differ = [k for k in full_replies if reuse_replies.get(k) != full_replies[k]]
        print(f"trajectories differ in episodes {differ}", flush=True)
    print(f"load_average_end={','.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(
        f"episodes_per_hour_reuse={reuse_rate:.1f} episodes_per_hour_full={full_rate:.1f} "
        f"ratio_without_compilation={reuse_warm / full_warm:.2f} "
        f"ratio={reuse_rate / full_rate:.2f} identical={int(identical)}"
    )


if __name__ == "__main__":
    main()
