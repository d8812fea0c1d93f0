"""Learner update time per trained episode: one training row per phase against one row per episode.

An episode of k phases trained one row per phase (each phase's prompt, the whole
conversation before it, plus its reply) costs about k/2 forwards and backwards of the
episode's final length; a multi-turn episode (`EpisodeConfig.conversation='multi_turn'`)
trains as one row (`rl.samples.EpisodeSample`: the final sequence, every reply in the
loss with its own advantage), one forward and backward of that length. Both give the
same loss and gradients (`tests/rl/episode_rows_test.py`).

The episodes are made up with the shapes of Qwen2.5-Coder-0.5B-Instruct's AAC episodes
with 3 calls (T_MAX 7: conceptualise, generate, revise, three times, then a last
conceptualisation): a first prompt of `--first_prompt` tokens (the system prompt,
header, two examples and the instruction come to about 450 with the Qwen2.5 tokenizer),
replies of `--reply_min`..`--reply_max` tokens, each later phase's prompt growing by
the reply and an appended turn of about `--appended` tokens. Token ids are random: the
time of an update does not depend on them.

Four layouts of the same episodes are timed, each one GRPO update (``learner.make_train_step``;
reference forward for the k3 KL at `--beta` > 0):

* per-phase rows, one batch: the first learner's layout, every row padded to the longest,
  micro-batches of `--micro_batch_size` rows in a scan, the head on every column;
* per-phase rows, length buckets: the same rows, longest first, each micro-batch padded to its
  own length bucket (`samples.make_micro_batches`), the head on every column;
* one row per episode, length buckets, the head on every column;
* one row per episode, length buckets, the head on the loss columns only
  (`Batch.score_positions`, the learner's default).

For each: rows, padded and real tokens, the best update time over `--repeats` updates
(after one warm-up that compiles), per trained episode, and where it goes: the reference
forward (a jitted forward of the base model over the same micro-batches, timed alone)
and the rest (policy forward and backward, optimizer step).

Usage (from the repository root):

    python benchmarks/learner_update.py                      # a tiny random model: runs anywhere
    python benchmarks/learner_update.py --model ~/.cache/pau_jax/qwen2.5-coder-0.5b-instruct \\
        --episodes 2 --micro_batch_size 1 --repeats 1 --remat \\
        --layouts phase_buckets episode                      # the real 0.5B, on an idle machine

`--remat` recomputes each layer's activations in the backward pass (`LearnerConfig.remat`;
without it the 0.5B's per-phase layouts need more than 24 GiB); `--layouts` picks among
`phase`, `phase_buckets`, `episode_all` and `episode`. The run is marked noisy when the
1-minute load average exceeded 0.5 at the start. The last line is `speedup=...x (<the first
per-phase layout run> / one row per episode with the loss columns scored) noisy=0|1`.
"""

import argparse
import dataclasses
import os
import sys
import time

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pau_jax import models  # noqa: E402
from pau_jax.models import lora, qwen3  # noqa: E402
from pau_jax.rl import learner  # noqa: E402
from pau_jax.rl.grpo import GRPOConfig  # noqa: E402
from pau_jax.rl.samples import Sample, episode_sample, make_batch, make_micro_batches  # noqa: E402
from pau_jax.training import step as step_lib  # noqa: E402
from pau_jax.training.logprobs import token_logprobs  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Reply:
    """What a training row reads of a policy's reply."""

    prompt_ids: tuple
    token_ids: tuple
    logprobs: tuple


def make_episodes(args, vocab: int) -> tuple[list[list[Reply]], list[list[float]]]:
    """Random multi-turn episodes of the configured shape, and per-phase advantages."""
    rng = np.random.default_rng(args.seed)
    episodes, advantages = [], []
    for _ in range(args.episodes):
        ids = list(rng.integers(1, vocab, args.first_prompt))
        replies = []
        for phase in range(args.phases):
            if phase:
                appended = int(rng.integers(args.appended // 2, args.appended * 3 // 2 + 1))
                ids += list(rng.integers(1, vocab, appended))
            n = int(rng.integers(args.reply_min, args.reply_max + 1))
            reply = tuple(int(t) for t in rng.integers(1, vocab, n))
            logprobs = tuple(float(x) for x in -rng.uniform(0.5, 3.0, n))
            replies.append(Reply(tuple(int(i) for i in ids), reply, logprobs))
            ids += reply
        episodes.append(replies)
        advantages.append([float(a) for a in rng.standard_normal(args.phases)])
    return episodes, advantages


# `--layouts` key -> layout name.
LAYOUTS = {
    "phase": "per-phase rows, one batch",
    "phase_buckets": "per-phase rows, length buckets",
    "episode_all": "one row per episode, length buckets, every column scored",
    "episode": "one row per episode, length buckets, loss columns scored",
}


def layouts(episodes, advantages, args) -> dict[str, object]:
    """Layout name -> one ``Batch`` or a list of micro-batches, of the same episodes."""
    phase_rows = [
        Sample(
            prompt_ids=list(r.prompt_ids),
            completion_ids=list(r.token_ids),
            sampler_logprobs=list(r.logprobs),
            advantage=a,
        )
        for replies, adv in zip(episodes, advantages)
        for r, a in zip(replies, adv)
    ]
    episode_rows = [episode_sample(r, a) for r, a in zip(episodes, advantages)]
    m, pad = args.micro_batch_size, args.pad_to_multiple
    every = {"score_positions": False}
    return {
        LAYOUTS["phase"]: make_batch(phase_rows, pad_to_multiple=pad, rows_multiple=m, **every),
        LAYOUTS["phase_buckets"]: make_micro_batches(
            phase_rows, micro_batch_size=m, pad_to_multiple=pad, **every
        ),
        LAYOUTS["episode_all"]: make_micro_batches(
            episode_rows, micro_batch_size=m, pad_to_multiple=pad, **every
        ),
        LAYOUTS["episode"]: make_micro_batches(
            episode_rows, micro_batch_size=m, pad_to_multiple=pad
        ),
    }


def _micro(batches, size: int) -> list:
    """The micro-batches a layout runs (a single batch split into rows of ``size``)."""
    if isinstance(batches, list):
        return batches
    rows = batches.input_ids.shape[0]
    return [jax.tree.map(lambda x, s=s: x[s : s + size], batches) for s in range(0, rows, size)]


def time_update(model, config, batches, repeats: int) -> float:
    """Best seconds of one update over ``repeats``, after a warm-up update that compiles."""
    train_step = learner.make_train_step(model, config)
    state = learner.init_state(model, config)
    state, metrics = train_step(state, batches)
    jax.block_until_ready(metrics)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        state, metrics = train_step(state, batches)
        jax.block_until_ready((state, metrics))
        best = min(best, time.perf_counter() - start)
    return best


def time_reference(model, micro_batches, chunk_tokens: int, repeats: int) -> float:
    """Best seconds of the reference model's forward over every micro-batch."""
    reference = step_lib.reference_model(model)

    @nnx.jit
    def forward(m, ids, mask, positions):
        return token_logprobs(m, ids, mask, chunk_tokens=chunk_tokens, positions=positions)[0]

    def run():
        return [
            forward(reference, b.input_ids, b.attention_mask, b.score_positions)
            for b in micro_batches
        ]

    jax.block_until_ready(run())
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run())
        best = min(best, time.perf_counter() - start)
    return best


def load_model(args):
    """The model with LoRA adapters: a checkpoint directory, or a tiny random Qwen3."""
    if args.model:
        model, config = models.load_hf(args.model, dtype=args.dtype)
        name = args.model
    else:
        config = qwen3.Qwen3Config(
            vocab_size=4096,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rms_norm_eps=1e-6,
            rope_theta=1_000_000.0,
            tie_word_embeddings=True,
            max_position_embeddings=8192,
        )
        model = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
        name = "tiny random Qwen3 (hidden 128, 2 layers, vocab 4096)"
    adapted = lora.apply_lora(model, rank=args.rank, alpha=args.rank)
    return model, config, f"{name}, {adapted} LoRA adapters of rank {args.rank}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", default="", help="a checkpoint directory; default a tiny random model")
    add("--dtype", default="float32")
    add("--episodes", type=int, default=8)
    add("--phases", type=int, default=7, help="T_MAX: 7 phases for 3 calls")
    add("--first_prompt", type=int, default=450)
    add("--reply_min", type=int, default=30)
    add("--reply_max", type=int, default=150)
    add("--appended", type=int, default=60, help="mean appended-turn tokens (uniform 0.5-1.5x)")
    add("--micro_batch_size", type=int, default=4)
    add("--pad_to_multiple", type=int, default=64)
    add("--logits_chunk_tokens", type=int, default=1024)
    add("--rank", type=int, default=16)
    add("--beta", type=float, default=0.001)
    add("--repeats", type=int, default=3)
    add("--seed", type=int, default=0)
    add("--remat", action="store_true", help="recompute layer activations (LearnerConfig.remat)")
    add("--remat_min_tokens", type=int, default=0, help="LearnerConfig.remat_min_tokens")
    add("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS), help="which to run")
    args = parser.parse_args()

    load_start = os.getloadavg()[0]
    model, config, described = load_model(args)
    episodes, advantages = make_episodes(args, config.vocab_size)
    learner_config = learner.LearnerConfig(
        micro_batch_size=args.micro_batch_size,
        logits_chunk_tokens=args.logits_chunk_tokens,
        grpo=GRPOConfig(beta=args.beta),
        remat=args.remat,
        remat_min_tokens=args.remat_min_tokens,
    )
    finals = [len(e[-1].prompt_ids) + len(e[-1].token_ids) for e in episodes]
    print(f"devices: {jax.devices()}; load average at the start {load_start:.2f}")
    print(f"model: {described}; {args.dtype}")
    print(
        f"episodes: {args.episodes} x {args.phases} phases, final length {min(finals)}-"
        f"{max(finals)} tokens (mean {np.mean(finals):.0f}); micro-batch {args.micro_batch_size}"
        f", beta {args.beta}, remat {args.remat}"
    )
    print()
    print(
        "| layout | rows | padded tokens | real tokens | update s | s per episode "
        "| reference forward s | forward+backward+optimizer s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    per_episode = {}
    chosen = {LAYOUTS[key] for key in args.layouts}
    for name, batches in layouts(episodes, advantages, args).items():
        if name not in chosen:
            continue
        micro = _micro(batches, args.micro_batch_size)
        rows = sum(b.input_ids.shape[0] for b in micro)
        padded = sum(b.input_ids.size for b in micro)
        real = sum(int(np.asarray(b.attention_mask).sum()) for b in micro)
        update = time_update(model, learner_config, batches, args.repeats)
        reference = time_reference(model, micro, args.logits_chunk_tokens, args.repeats)
        reference = reference if args.beta > 0 else 0.0
        per_episode[name] = update / args.episodes
        print(
            f"| {name} | {rows} | {padded} | {real} | {update:.3f} | {per_episode[name]:.4f} "
            f"| {reference:.3f} | {update - reference:.3f} |"
        )
    load_end = os.getloadavg()[0]
    noisy = int(load_start > 0.5)
    print()
    print(f"load average at the end {load_end:.2f} (this run's own threads included)")
    after = per_episode.get(LAYOUTS["episode"])
    every = per_episode.get(LAYOUTS["episode_all"])
    if after is not None and every is not None:
        print(f"loss columns only vs every column, one row per episode: {every / after:.2f}x")
    before_key = next((k for k in ("phase", "phase_buckets") if LAYOUTS[k] in per_episode), None)
    if after is None or before_key is None:
        print(f"speedup=nan (needs `episode` and a per-phase layout) noisy={noisy}")
        return
    before = per_episode[LAYOUTS[before_key]]
    print(
        f"speedup={before / after:.2f}x ({LAYOUTS[before_key]} {before:.4f} s / one row per "
        f"episode, loss columns scored {after:.4f} s per trained episode) noisy={noisy}"
    )


if __name__ == "__main__":
    main()
