"""An AAC step on multi-turn episodes: one training row per episode, micro-batches of their own lengths."""

import json
import math

import checkpoints

from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy.config import SamplingConfig
from pau_jax.rl import loop
from pau_jax.rl.critic import CriticConfig
from pau_jax.rl.learner import LearnerConfig
from pau_jax.rl.rewards import RewardConfig
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.training.run import ActorConfig


def test_a_multi_turn_step_trains_one_row_per_episode(tmp_path):
    summary = loop.train(
        run_dir=str(tmp_path),
        steps=1,
        actor=ActorConfig(
            model_config=checkpoints.tiny_qwen3_config(max_position_embeddings=4096),
            lora_rank=2,
            lora_alpha=2.0,
        ),
        seed=5,
        episode_config=EpisodeConfig(call_budget=2, max_steps=4, conversation="multi_turn"),
        reward_config=RewardConfig(max_steps=4, reasoning_tau=2, input_tau=2, reflection_tau=2),
        rollout_config=RolloutConfig(
            tasks_per_batch=2,
            group_size=2,
            sampling=SamplingConfig(max_new_tokens=8, temperature=1.0),
        ),
        critic_config=CriticConfig(sampling=SamplingConfig(max_new_tokens=4)),
        learner_config=LearnerConfig(
            learning_rate=1e-2, logits_chunk_tokens=256, micro_batch_size=2
        ),
        pad_to_multiple=16,
        sandbox_workers=1,
    )
    metrics = summary["last_metrics"]
    assert metrics["rollout/episode_rows"] == 4.0 and metrics["rollout/phase_rows"] == 0.0
    assert metrics["train/batch_rows"] == 4.0 and math.isfinite(metrics["train/loss"])
    assert (
        metrics["train/tokens"]
        == metrics["rollout/steps"] * metrics["rollout/completion_tokens_mean"]
    )
    assert metrics["train/grad_norm"] > 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rollout/episode_rows"] == 4.0
