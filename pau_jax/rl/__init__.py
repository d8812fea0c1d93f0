"""AAC training: per-step rewards, credit assignment, the GRPO loss and the LoRA learner."""

from pau_jax.rl import credit, grpo, learner, rewards
from pau_jax.rl.grpo import GRPOConfig
from pau_jax.rl.learner import Batch, LearnerConfig, TrainState, TrainStep
from pau_jax.rl.rewards import EpisodeRecord, RewardConfig, StepRecord

__all__ = [
    "Batch",
    "EpisodeRecord",
    "GRPOConfig",
    "LearnerConfig",
    "RewardConfig",
    "StepRecord",
    "TrainState",
    "TrainStep",
    "credit",
    "grpo",
    "learner",
    "rewards",
]
