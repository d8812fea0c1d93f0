"""Learner throughput: model FLOP/s of the jitted GRPO train step against the f32 matmul peak, in one process.

    python benchmarks/learner_step.py                    # hidden 1024, 4 layers, vocab 8192, 8 x 256
    python benchmarks/learner_step.py --layers 2 --seq 128 --steps 2

Model FLOPs of one step (LoRA-only gradients; counted analytically, full T x T
attention as computed; tokens = B * S, head positions = B * (S - 1)):

* policy forward: 2 * tokens * (P_lin + P_lora) + 2 * head * D * V + A;
* policy backward: gradients w.r.t. activations through every frozen matmul,
  2 * tokens * (P_lin - P_qkv0) + 2 * head * D * V (no weight gradients for the
  frozen base; layer 0's attention input needs no gradient, hence - P_qkv0),
  plus 2 * 2 * tokens * P_lora (activation and weight gradients of the
  adapters), plus 2 * A for attention (dQ, dK, dP, dV);
* reference forward (beta > 0): 2 * tokens * P_lin + 2 * head * D * V + A
  (the zeroed adapters' matmuls are not counted);

where P_lin are the weights of the decoder linears, P_lora = sum R * (in + out)
over adapted linears, A = 4 * B * S^2 * N * H * L. Recomputation (the chunked
head is rematerialised in the backward pass) is not counted. The peak is the
best f32 [n, n] x [n, n] matmul rate, timed between train steps. The last line
is ``mfu=...%`` (model FLOP/s over that peak).
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
from pau_jax.rl.grpo import GRPOConfig  # noqa: E402


def step_flops(config: qwen3.Qwen3Config, *, rank: int, batch: int, seq: int, beta: float):
    """Model FLOPs of one train step, by part (see the module docstring)."""
    d, f, n, k, h = (
        config.hidden_size,
        config.intermediate_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    layers = config.num_hidden_layers
    shapes = [(d, n * h), (d, k * h), (d, k * h), (n * h, d), (d, f), (d, f), (f, d)]
    p_lin = layers * sum(i * o for i, o in shapes)
    p_lora = layers * sum(rank * (i + o) for i, o in shapes)
    p_qkv0 = sum(i * o for i, o in shapes[:3])
    tokens, head = batch * seq, batch * (seq - 1)
    head_fwd = 2 * head * d * config.vocab_size
    attention = 4 * batch * seq * seq * n * h * layers
    parts = {
        "policy_forward": 2 * tokens * (p_lin + p_lora) + head_fwd + attention,
        "policy_backward": 2 * tokens * (p_lin - p_qkv0)
        + head_fwd
        + 4 * tokens * p_lora
        + 2 * attention,
        "reference_forward": (2 * tokens * p_lin + head_fwd + attention) if beta > 0 else 0,
    }
    return parts


def matmul_seconds(n: int, repeats: int) -> float:
    """Best wall time of one jitted f32 [n, n] x [n, n] matmul."""
    keys = jax.random.split(jax.random.key(0))
    a = jax.random.normal(keys[0], (n, n), jnp.float32)
    b = jax.random.normal(keys[1], (n, n), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def make_batch(config, *, batch: int, seq: int, completion: int, seed: int = 0) -> learner.Batch:
    """Random ids, full attention, the last ``completion`` positions in the loss."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, (batch, seq)).astype(np.int32)
    loss = np.zeros((batch, seq), np.float32)
    loss[:, seq - completion :] = 1.0
    return learner.Batch(
        input_ids=jnp.asarray(ids),
        attention_mask=jnp.ones((batch, seq), jnp.int32),
        loss_mask=jnp.asarray(loss),
        advantages=jnp.asarray(rng.standard_normal(batch).astype(np.float32)),
        sampler_logprobs=jnp.full((batch, seq), -np.log(config.vocab_size), jnp.float32),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv_heads", type=int, default=8)
    parser.add_argument("--head_dim", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--beta", type=float, default=0.001)
    parser.add_argument("--micro_batch_size", type=int, default=None)
    parser.add_argument("--logits_chunk_tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--peak_size", type=int, default=2048)
    args = parser.parse_args()

    config = qwen3.Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=max(4096, args.seq),
    )
    model = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    adapted = lora.apply_lora(model, rank=args.rank, alpha=args.rank)
    learner_config = learner.LearnerConfig(
        micro_batch_size=args.micro_batch_size,
        logits_chunk_tokens=args.logits_chunk_tokens,
        grpo=GRPOConfig(beta=args.beta),
    )
    train_step = learner.make_train_step(model, learner_config)
    state = learner.init_state(model, learner_config)
    batch = make_batch(config, batch=args.batch, seq=args.seq, completion=args.completion)
    print(f"devices: {jax.devices()}")
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, "
        f"{adapted} LoRA adapters of rank {args.rank}; batch {args.batch} x {args.seq}, "
        f"beta {args.beta}, micro-batch {args.micro_batch_size or args.batch}"
    )

    start = time.perf_counter()
    compiled = train_step.lower(state, batch).compile()
    print(f"compile: {time.perf_counter() - start:.1f} s")
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    parts = step_flops(config, rank=args.rank, batch=args.batch, seq=args.seq, beta=args.beta)
    flops = sum(parts.values())
    for name, value in parts.items():
        print(f"flops {name}: {value / 1e9:.1f} G")
    print(
        f"flops model total: {flops / 1e9:.1f} G; XLA cost analysis: {cost['flops'] / 1e9:.1f} G "
        "(counts each lax.map/scan body once, plus element-wise work)"
    )

    state, metrics = train_step(state, batch)  # warm-up (first execution)
    jax.block_until_ready(metrics)
    step_best, peak_best = float("inf"), float("inf")
    for _ in range(args.steps):
        peak_best = min(peak_best, matmul_seconds(args.peak_size, repeats=5))
        start = time.perf_counter()
        state, metrics = train_step(state, batch)
        jax.block_until_ready((state, metrics))
        step_best = min(step_best, time.perf_counter() - start)
    peak_best = min(peak_best, matmul_seconds(args.peak_size, repeats=5))
    peak = 2 * args.peak_size**3 / peak_best
    achieved = flops / step_best
    print(
        f"loss {float(metrics['train/loss']):.4f}, grad norm {float(metrics['train/grad_norm']):.4f}"
    )
    print(f"matmul peak (f32 {args.peak_size}^3): {peak / 1e9:.1f} GFLOP/s")
    print(f"train step: {step_best:.3f} s best of {args.steps}, {achieved / 1e9:.1f} GFLOP/s")
    print(f"mfu={100 * achieved / peak:.1f}%")


if __name__ == "__main__":
    main()
