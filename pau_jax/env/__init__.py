"""The PAU environment: prompts, output parsers and the episode state machine."""

from pau_jax.env import episode, parse, prompts
from pau_jax.env.episode import EpisodeConfig, EpisodeState, Phase, Task

__all__ = ["EpisodeConfig", "EpisodeState", "Phase", "Task", "episode", "parse", "prompts"]
