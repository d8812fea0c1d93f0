"""AAC: the critic, per-step rewards, credit assignment, the GRPO loss and the run mode."""

from pau_jax.rl import credit, grpo, learner, rewards
from pau_jax.rl.grpo import GRPOConfig
from pau_jax.rl.learner import Batch, LearnerConfig, TrainState, make_train_step
from pau_jax.rl.rewards import EpisodeRecord, RewardConfig, StepRecord

__all__ = [
    "Batch",
    "EpisodeRecord",
    "GRPOConfig",
    "LearnerConfig",
    "RewardConfig",
    "StepRecord",
    "TrainState",
    "credit",
    "grpo",
    "learner",
    "make_train_step",
    "rewards",
]
