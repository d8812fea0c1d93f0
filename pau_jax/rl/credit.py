"""Credit assignment: turns per-step rewards of grouped episodes into per-step GRPO advantages.

Each function has the signature ``fn(rewards, group_ids, **constants)`` and is
chosen by reference (``advantage_fn = @return_to_go``):

* ``return_to_go`` (paper default): step t gets ``G_t = sum_{k >= t} gamma^(k-t) r_k``,
  normalised within its GRPO group over all steps of the group's episodes pooled
  together: ``(G_t - mean) / (std + eps)``. Pooling (rather than normalising each
  step position separately) keeps every step's statistics defined when the
  episodes of a group have different lengths; it weights a long episode's
  steps as much as a short one's.
* ``final_only`` (FINAL ablation): ``return_to_go`` on rewards whose
  intermediate entries are zeroed, so only the last step's reward reaches the
  advantages; it differs from ``return_to_go`` in that alone. With gamma = 1
  every step of an episode gets its final reward, normalised as above.
* ``last_step_broadcast`` (released code): one number per episode, its last
  step's reward, normalised over the group's episodes (GRPO outcome
  advantages), broadcast to every step.

The standard deviation uses ``ddof`` (default 1, as ``torch.std``); a group with
a single value (or none to compare) gets advantage 0.
"""

from collections.abc import Hashable, Sequence
from typing import Protocol

import numpy as np


class AdvantageFn(Protocol):
    def __call__(
        self, rewards: Sequence[Sequence[float]], group_ids: Sequence[Hashable]
    ) -> list[np.ndarray]: ...


def _check(rewards: Sequence[Sequence[float]], group_ids: Sequence[Hashable]) -> None:
    if len(rewards) != len(group_ids):
        raise ValueError(
            f"got {len(rewards)} episodes but {len(group_ids)} group ids; pass one id per episode"
        )
    for i, episode in enumerate(rewards):
        if len(episode) == 0:
            raise ValueError(f"episode {i} has no steps; drop empty episodes before credit")


def _normalise(values: Sequence[np.ndarray], group_ids, *, eps: float, ddof: int):
    """Per episode, its values minus the group mean over the std (all values of a group pooled)."""
    groups: dict[Hashable, list[int]] = {}
    for i, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(i)
    out = [np.zeros(len(v), np.float64) for v in values]
    for members in groups.values():
        pooled = np.concatenate([values[i] for i in members])
        if pooled.size < max(2, ddof + 1):
            continue
        mean = pooled.mean()
        std = pooled.std(ddof=ddof)
        for i in members:
            out[i] = (values[i] - mean) / (std + eps)
    return [o.astype(np.float32) for o in out]


def discounted_returns(rewards: Sequence[float], gamma: float = 1.0) -> np.ndarray:
    """[n] returns ``G_t = r_t + gamma * G_{t+1}`` of one episode (float64)."""
    returns = np.zeros(len(rewards), np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        returns[t] = running
    return returns


def return_to_go(
    rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    *,
    gamma: float = 1.0,
    eps: float = 1e-6,
    ddof: int = 1,
) -> list[np.ndarray]:
    """Per-step advantages from each step's own and later rewards, normalised per group.

    Args:
      rewards: per episode, its step rewards [n_e].
      group_ids: per episode, the id of its GRPO group (episodes of one prompt).
      gamma: discount of later rewards.
      eps: added to the group's standard deviation.
      ddof: delta degrees of freedom of the standard deviation.

    Returns:
      Per episode, [n_e] float32 advantages.
    """
    _check(rewards, group_ids)
    returns = [discounted_returns(episode, gamma) for episode in rewards]
    return _normalise(returns, group_ids, eps=eps, ddof=ddof)


def final_only(
    rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    *,
    gamma: float = 1.0,
    eps: float = 1e-6,
    ddof: int = 1,
) -> list[np.ndarray]:
    """``return_to_go`` on the final step's reward alone (intermediate rewards set to 0)."""
    _check(rewards, group_ids)
    sparse = [[0.0] * (len(episode) - 1) + [float(episode[-1])] for episode in rewards]
    return return_to_go(sparse, group_ids, gamma=gamma, eps=eps, ddof=ddof)


def last_step_broadcast(
    rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    *,
    eps: float = 1e-6,
    ddof: int = 1,
) -> list[np.ndarray]:
    """Each episode's last-step reward, normalised over its group's episodes, on every step."""
    _check(rewards, group_ids)
    finals = [np.array([float(episode[-1])]) for episode in rewards]
    per_episode = _normalise(finals, group_ids, eps=eps, ddof=ddof)
    return [np.full(len(episode), adv[0], np.float32) for episode, adv in zip(rewards, per_episode)]
